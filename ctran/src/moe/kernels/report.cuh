// Errors and waits of the MoE kernel sources (moe.cu, alltoallv.cu), prepended to each after
// the compatibility header.
//
// A kernel reports an error into a mapped host word `err` (code, then three details): the
// first error wins, and the host turns it into an exception (ctran/src/moe/words.rs). A wait
// for a peer's flag gives up at a timeout, or once the communicator aborted (the mapped host
// word `abort`), and reports which.

typedef unsigned long long u64;
typedef unsigned int u32;

#define DEV_ERR_TIMEOUT 2  // a: peer, b: what waited, c: round
#define DEV_ERR_ABORTED 7  // a: peer, b: what waited, c: round

__device__ void dev_report(u64 err, u64 code, u64 a, u64 b, u64 c) {
    volatile u64* words = (volatile u64*)err;
    if (atomicCAS((u64*)err, 0ull, code) == 0ull) {
        words[1] = a;
        words[2] = b;
        words[3] = c;
        __threadfence_system();
    }
}

// Waits until the word at `flag` reaches `round`; false (and an error) after `timeout_ns` or
// once `*abort` is nonzero.
__device__ bool dev_wait(u64 err, u64 abort, u64 timeout_ns, u64* flag, u64 round, u64 peer,
                         u64 what) {
    u64 start = 0;
    u32 ns = 32;
    while (tc_ld_acquire_sys(flag) < round) {
        if (*(volatile u64*)abort != 0) {
            dev_report(err, DEV_ERR_ABORTED, peer, what, round);
            return false;
        }
        u64 now = tc_globaltimer();
        if (start == 0) start = now;
        if (now - start > timeout_ns) {
            dev_report(err, DEV_ERR_TIMEOUT, peer, what, round);
            return false;
        }
        tc_nanosleep(ns);
        if (ns < 1024) ns *= 2;
    }
    return true;
}
