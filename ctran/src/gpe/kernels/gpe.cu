// Flags between a comm's stream and its GPU progress engine (ctran/src/gpe), in mapped host
// memory. Compiled at run time by NVRTC (ctran/src/gpe/kernels.rs).
//
// `posted` and `done` are 64-bit counters that only grow. The stream raises `posted` to the
// number of a step once the step's inputs are in host staging; the host thread raises `done`
// once the step's outputs are there. Both sides see the other's writes through system-scope
// fences: the copies before a post are complete before the kernel starts (stream order), and
// the host's staging writes precede its `done` store (release on the host).

typedef unsigned long long u64;

// Raises *posted to `step` (one thread).
extern "C" __global__ void gpe_post(volatile u64* posted, u64 step) {
    __threadfence_system();
    *posted = step;
    __threadfence_system();
}

// Spins until *done reaches `step` (one thread), sleeping between reads so the polling costs
// little PCIe traffic; then fences, so the copies that follow read the host's staging.
extern "C" __global__ void gpe_wait(volatile u64* done, u64 step) {
    unsigned ns = 64;
    while (*done < step) {
        tc_nanosleep(ns);
        if (ns < 2048) ns *= 2;
    }
    __threadfence_system();
}

struct tc_bytes16 {
    u64 lo, hi;
};

// Copies the byte ranges a list names from `staging` (mapped pinned host memory) into
// `window` (device memory): the puts a window over host transports received, made visible on
// the device when its owner's wait for the covering signal passes. `list` is mapped pinned
// memory the host filled before releasing the wait: list[0] ranges, then (offset, length)
// pairs. Each range is cut into chunks of TC_LAND_CHUNK bytes that the blocks take in turn, so
// one large put is read over PCIe by every block at once.
#define TC_LAND_CHUNK 16384ull
extern "C" __global__ void gpe_land(const volatile u64* list, const unsigned char* staging,
                                    unsigned char* window) {
    u64 n = list[0];
    u64 chunk = blockIdx.x;
    for (u64 r = 0; r < n; ++r) {
        u64 off = list[1 + 2 * r], len = list[2 + 2 * r];
        u64 chunks = (len + TC_LAND_CHUNK - 1) / TC_LAND_CHUNK;
        // `chunk` counts across ranges, so blocks stay spread when ranges are small.
        for (; chunk < chunks; chunk += gridDim.x) {
            u64 from = chunk * TC_LAND_CHUNK;
            u64 bytes = len - from < TC_LAND_CHUNK ? len - from : TC_LAND_CHUNK;
            const unsigned char* src = staging + off + from;
            unsigned char* dst = window + off + from;
            u64 head = 0;
            if ((((off + from) | bytes) & 15) == 0) {
                const tc_bytes16* s = (const tc_bytes16*)src;
                tc_bytes16* d = (tc_bytes16*)dst;
                for (u64 i = threadIdx.x; i < bytes / 16; i += blockDim.x) d[i] = s[i];
                head = bytes;
            }
            for (u64 i = head + threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
        }
        chunk -= chunks;
    }
}
