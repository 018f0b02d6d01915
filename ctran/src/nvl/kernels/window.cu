// One-sided windows over NVLink (ctran/src/nvl/window.rs). Every rank exports a signal array:
// slot q counts the signals rank q sent it. A signal adds one to the peer's slot for this rank
// after the stream's earlier copies (stream order, then a system fence); a wait consumes one
// signal, counting consumed signals on the device, so both replay correctly in CUDA graphs.

typedef unsigned long long u64;
typedef unsigned int u32;

#define WIN_ST_TIMEOUT 1u
#define WIN_ST_ABORTED 2u

// (gpu_compat.cuh, prepended: PTX under CUDA, clang's atomics and wall clock under HIP)
__device__ __forceinline__ u64 win_globaltimer() { return tc_globaltimer(); }

__device__ __forceinline__ u64 win_ld_acquire_sys(const u64* p) { return tc_ld_acquire_sys(p); }

// Spins until *slot reaches `want`; false (with the status word set) on abort or timeout.
__device__ bool win_wait_for(const u64* slot, u64 want, u32* status, const u32* abort_flag,
                             u64 start, u64 timeout_ns) {
    u32 spins = 0;
    while (win_ld_acquire_sys(slot) < want) {
        if ((++spins & 255u) == 0u) {
            if (*(volatile const u32*)abort_flag) {
                atomicCAS(status, 0u, WIN_ST_ABORTED);
                __threadfence_system();
                return false;
            }
            if (win_globaltimer() - start > timeout_ns) {
                atomicCAS(status, 0u, WIN_ST_TIMEOUT);
                __threadfence_system();
                return false;
            }
        }
        if (*(volatile u32*)status != 0u) return false;
    }
    return true;
}

__device__ __forceinline__ void win_copy(unsigned char* dst, const unsigned char* src, u64 bytes) {
    if ((((u64)dst | (u64)src | bytes) & 15ULL) == 0ULL) {
        uint4* d = (uint4*)dst;
        const uint4* s = (const uint4*)src;
        for (u64 i = threadIdx.x; i < bytes / 16ULL; i += blockDim.x) d[i] = s[i];
    } else {
        for (u64 i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
    }
}

extern "C" __global__ void tc_win_signal(u64* slot) {
    __threadfence_system();
    atomicAdd_system(slot, 1ULL);
}

// Waits until *slot exceeds the signals consumed so far, then consumes one. Gives up (writing
// why to the status word) when the host raises the abort word or after timeout_ns.
extern "C" __global__ void tc_win_wait(const u64* slot, u64* consumed, u32* status,
                                       const u32* abort_flag, u64 timeout_ns) {
    u64 want = *consumed + 1ULL;
    if (win_wait_for(slot, want, status, abort_flag, win_globaltimer(), timeout_ns)) {
        *consumed = want;
        __threadfence_system();
    }
}

// A small put: one block copies `bytes` into the peer's window (16 bytes at a time where both
// ends allow), then, when `slot` is set, fences and adds one to it: a put and its signal in one
// launch, so the peer's wait sees the data with the signal.
extern "C" __global__ void tc_win_put(unsigned char* dst, const unsigned char* src, u64 bytes,
                                      u64* slot) {
    win_copy(dst, src, bytes);
    // The stores reach the peer before this kernel ends (and before the signal, if any).
    __threadfence_system();
    if (slot != 0) {
        __syncthreads();
        if (threadIdx.x == 0) atomicAdd_system(slot, 1ULL);
    }
}

// Words of a window's signal allocation (see ctran/src/nvl/window.rs): the signal slots, the
// consumed counters, the per-peer counts of finished copy blocks of an all-gather, every
// rank's window as mapped here, and where each peer's slot for this rank is mapped here.
#define WIN_MAX_RANKS 8
#define WIN_CONSUMED (WIN_MAX_RANKS)
#define WIN_DONE (2 * WIN_MAX_RANKS)
#define WIN_BASES (3 * WIN_MAX_RANKS)
#define WIN_PEER_SLOTS (4 * WIN_MAX_RANKS)

// A persistent all-gather's round in one launch: `bytes` at `src` go to byte `offset` of every
// rank's window. Blocks [q*B, (q+1)*B) serve rank q (geometry: nranks | rank << 8 | B << 16).
// Per peer q: the first block tells q "my window is free" (a signal), every block waits for
// q's "free", copies its slice into q's window, and the last block to finish fences and
// signals q "data", then waits for q's data and consumes both of q's signals. Blocks of this
// rank copy into its own window (unless src is already there). The grid is at most 64 blocks,
// all resident at once, so spinning blocks never starve one that has to signal.
extern "C" __global__ void tc_win_allgather(u64* words, const unsigned char* src, u64 bytes,
                                            u64 offset, u64 geometry, u32* status,
                                            const u32* abort_flag, u64 timeout_ns) {
    const u32 nranks = (u32)(geometry & 255ULL);
    const u32 rank = (u32)((geometry >> 8) & 255ULL);
    const u32 per = (u32)(geometry >> 16);
    const u32 q = blockIdx.x / per;
    const u32 part = blockIdx.x % per;
    const u64 slice = ((bytes + per - 1) / per + 15ULL) & ~15ULL;
    const u64 lo = (u64)part * slice < bytes ? (u64)part * slice : bytes;
    const u64 hi = lo + slice < bytes ? lo + slice : bytes;
    unsigned char* dst = (unsigned char*)words[WIN_BASES + q] + offset;
    if (q == rank) {
        if (dst != src) win_copy(dst + lo, src + lo, hi - lo);
        return;
    }
    u64* ready_at_q = (u64*)words[WIN_PEER_SLOTS + q];
    const u64* from_q = &words[q];
    const u64 seen = words[WIN_CONSUMED + q];
    const u64 start = win_globaltimer();
    __shared__ bool ok;
    if (threadIdx.x == 0) {
        if (part == 0) atomicAdd_system(ready_at_q, 1ULL);
        ok = win_wait_for(from_q, seen + 1ULL, status, abort_flag, start, timeout_ns);
    }
    __syncthreads();
    if (!ok) return;
    win_copy(dst + lo, src + lo, hi - lo);
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x != 0) return;
    if (atomicAdd((unsigned long long*)&words[WIN_DONE + q], 1ULL) != (u64)(per - 1)) return;
    // The last block of peer q: every block's stores are fenced; tell q, then wait for q's.
    words[WIN_DONE + q] = 0ULL;
    __threadfence_system();
    atomicAdd_system(ready_at_q, 1ULL);
    if (win_wait_for(from_q, seen + 2ULL, status, abort_flag, start, timeout_ns)) {
        words[WIN_CONSUMED + q] = seen + 2ULL;
        __threadfence_system();
    }
}
