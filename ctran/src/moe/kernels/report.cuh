// Errors and waits of the MoE kernel sources (moe.cu, alltoallv.cu), prepended to each after
// the compatibility header.
//
// A kernel reports an error into mapped host words at `err` (code, then three details) in one
// of two slots: errors in this rank's own input (slot 0) and errors that broke the exchange with
// a peer (slot 1: a wait that timed out or saw the abort, a peer's count out of range). In
// each slot the first error wins; the host turns them into exceptions (ctran/src/moe/words.rs),
// and can raise an exchange error while an input error waits to be raised, or the other way
// round. A wait for a peer's flag gives up at a timeout, or once the communicator aborted (the
// mapped host word `abort`), and reports which.

typedef unsigned long long u64;
typedef unsigned int u32;

#define DEV_ERR_TIMEOUT 2  // a: peer, b: what waited, c: round
#define DEV_ERR_ABORTED 7  // a: peer, b: what waited, c: round

#define DEV_SLOT_INPUT 0
#define DEV_SLOT_EXCHANGE 1

__device__ void dev_report(u64 err, u32 slot, u64 code, u64 a, u64 b, u64 c) {
    volatile u64* words = (volatile u64*)err + 4 * slot;
    if (atomicCAS((u64*)words, 0ull, code) == 0ull) {
        words[1] = a;
        words[2] = b;
        words[3] = c;
        __threadfence_system();
    }
}

// Waits until the word at `flag` reaches `round`; false (and an error) after `timeout_ns` or
// once `*abort` is nonzero. The abort word lives in mapped host memory: every read of it
// crosses PCIe, and with hundreds of blocks waiting at once those reads queue for hundreds of
// microseconds, delaying every waiter. So it is read, like the clock, once every 256 polls.
__device__ bool dev_wait(u64 err, u64 abort, u64 timeout_ns, u64* flag, u64 round, u64 peer,
                         u64 what) {
    u64 start = 0;
    for (u32 i = 0;; ++i) {
        if (tc_ld_acquire_sys(flag) >= round) return true;
        if ((i & 255u) != 0) continue;
        u64 now = tc_globaltimer();
        if (i == 0) {
            start = now;
            continue;
        }
        if (*(volatile u64*)abort != 0) {
            dev_report(err, DEV_SLOT_EXCHANGE, DEV_ERR_ABORTED, peer, what, round);
            return false;
        }
        if (now - start > timeout_ns) {
            dev_report(err, DEV_SLOT_EXCHANGE, DEV_ERR_TIMEOUT, peer, what, round);
            return false;
        }
    }
}
