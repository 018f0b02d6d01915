// One-sided windows over NVLink (ctran/src/nvl/window.rs). Every rank exports a signal array:
// slot q counts the signals rank q sent it. A signal adds one to the peer's slot for this rank
// after the stream's earlier copies (stream order, then a system fence); a wait consumes one
// signal, counting consumed signals on the device, so both replay correctly in CUDA graphs.

typedef unsigned long long u64;
typedef unsigned int u32;

#define WIN_ST_TIMEOUT 1u
#define WIN_ST_ABORTED 2u

__device__ __forceinline__ u64 win_globaltimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ u64 win_ld_acquire_sys(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
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
    u64 start = win_globaltimer();
    u32 spins = 0;
    while (win_ld_acquire_sys(slot) < want) {
        if ((++spins & 255u) == 0u) {
            if (*(volatile const u32*)abort_flag) {
                atomicCAS(status, 0u, WIN_ST_ABORTED);
                __threadfence_system();
                return;
            }
            if (win_globaltimer() - start > timeout_ns) {
                atomicCAS(status, 0u, WIN_ST_TIMEOUT);
                __threadfence_system();
                return;
            }
        }
    }
    *consumed = want;
    __threadfence_system();
}

// A small put: one block copies `bytes` into the peer's window (16 bytes at a time where both
// ends allow), then, when `slot` is set, fences and adds one to it: a put and its signal in one
// launch, so the peer's wait sees the data with the signal.
extern "C" __global__ void tc_win_put(unsigned char* dst, const unsigned char* src, u64 bytes,
                                      u64* slot) {
    if ((((u64)dst | (u64)src | bytes) & 15ULL) == 0ULL) {
        uint4* d = (uint4*)dst;
        const uint4* s = (const uint4*)src;
        for (u64 i = threadIdx.x; i < bytes / 16ULL; i += blockDim.x) d[i] = s[i];
    } else {
        for (u64 i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
    }
    // The stores reach the peer before this kernel ends (and before the signal, if any).
    __threadfence_system();
    if (slot != 0) {
        __syncthreads();
        if (threadIdx.x == 0) atomicAdd_system(slot, 1ULL);
    }
}
