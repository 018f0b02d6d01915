// What differs between CUDA and HIP, for the project's one set of kernel sources. Prepended to
// every source (cuda/src/kernels.rs, ctran/src/gpu_sources.rs), before anything else.
//
// CUDA (NVRTC): each helper is the inline PTX the sources used before this header existed,
// word for word, so NVRTC produces the same code (checked by compiling every source with
// torchcomms-prebuild-kernels before and after, docs/amd.md).
// HIP (hipcc, hiprtc; AMD GPUs): the equivalent clang builtins. The HIP side is compiled for
// gfx90a in CI (ctran/tests/hip_compile.rs) but has never run on an AMD GPU (docs/amd.md).
//
// clang defines __HIP__ when it compiles HIP (hipcc and hiprtc alike); hiprtc also defines
// __HIPCC_RTC__ and brings its own runtime declarations, so only hipcc needs the header.

#if defined(__HIP__) || defined(__HIPCC_RTC__)
#define TC_HIP 1
#if !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>
#endif

// HIP passes kernel parameters by value in constant memory already; there is no annotation.
#define __grid_constant__

// Nanoseconds per tick of wall_clock64(): its clock runs at 100 MHz on gfx90a (MI200) and
// gfx94x (MI300). Other parts may differ (hipDeviceAttributeWallClockRate); -D overrides it.
#ifndef TC_WALL_CLOCK_NS
#define TC_WALL_CLOCK_NS 10ull
#endif

// A clock in nanoseconds, only ever subtracted from itself (timeouts).
__device__ __forceinline__ unsigned long long tc_globaltimer() {
    return (unsigned long long)wall_clock64() * TC_WALL_CLOCK_NS;
}
// ld.acquire.sys / st.release.sys: atomics at system scope (peer GPUs and the host).
__device__ __forceinline__ unsigned long long tc_ld_acquire_sys(const unsigned long long* p) {
    return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ void tc_st_release_sys(unsigned long long* p, unsigned long long v) {
    __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
// 16-byte volatile store and load in one instruction each (global_store/load_dwordx4), as
// RCCL's LL protocol does: each 8-byte half carries its own flag, so a reader that sees both
// flags has both data words.
typedef unsigned int tc_u32x4 __attribute__((ext_vector_type(4)));
__device__ __forceinline__ void tc_st_volatile_v4(unsigned long long addr, unsigned a, unsigned b,
                                                  unsigned c, unsigned d) {
    tc_u32x4 v = {a, b, c, d};
    *(volatile tc_u32x4*)addr = v;
}
__device__ __forceinline__ void tc_ld_volatile_v4(unsigned long long addr, unsigned* a, unsigned* b,
                                                  unsigned* c, unsigned* d) {
    tc_u32x4 v = *(volatile tc_u32x4*)addr;
    *a = v.x; *b = v.y; *c = v.z; *d = v.w;
}
// A pause while polling. s_sleep takes a constant (64 clocks per unit): sleep ns/64 units.
__device__ __forceinline__ void tc_nanosleep(unsigned ns) {
    for (unsigned i = 0; i < (ns >> 6); ++i) __builtin_amdgcn_s_sleep(1);
}
// f16 <-> f32 through clang's _Float16 (conversion rounds to nearest even, as cvt.rn).
__device__ __forceinline__ float tc_f16_to_f32(unsigned short h) {
    return (float)__builtin_bit_cast(_Float16, h);
}
__device__ __forceinline__ unsigned short tc_f32_to_f16(float f) {
    return __builtin_bit_cast(unsigned short, (_Float16)f);
}

// The lanes of this thread's wavefront (64 on gfx9) whose `pred` holds, as a mask.
#define TC_WARP_SIZE 64
__device__ __forceinline__ unsigned long long tc_ballot(bool pred) { return __ballot(pred); }
// `v` of the lane `d` below this one (this lane's own where there is none).
__device__ __forceinline__ unsigned tc_shfl_up(unsigned v, unsigned d) { return __shfl_up(v, d); }

#else  // CUDA

#define TC_HIP 0

__device__ __forceinline__ unsigned long long tc_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned long long tc_ld_acquire_sys(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void tc_st_release_sys(unsigned long long* p, unsigned long long v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void tc_st_volatile_v4(unsigned long long addr, unsigned a, unsigned b,
                                                  unsigned c, unsigned d) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(addr), "r"(a), "r"(b),
                 "r"(c), "r"(d) : "memory");
}
__device__ __forceinline__ void tc_ld_volatile_v4(unsigned long long addr, unsigned* a, unsigned* b,
                                                  unsigned* c, unsigned* d) {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(*a), "=r"(*b), "=r"(*c), "=r"(*d) : "l"(addr) : "memory");
}
__device__ __forceinline__ void tc_nanosleep(unsigned ns) { __nanosleep(ns); }
__device__ __forceinline__ float tc_f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short tc_f32_to_f16(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// The lanes of this thread's warp whose `pred` holds, as a mask; every lane must call it.
#define TC_WARP_SIZE 32
__device__ __forceinline__ unsigned long long tc_ballot(bool pred) {
    return (unsigned long long)__ballot_sync(0xffffffffu, pred);
}
// `v` of the lane `d` below this one (this lane's own where there is none); every lane must
// call it.
__device__ __forceinline__ unsigned tc_shfl_up(unsigned v, unsigned d) {
    return __shfl_up_sync(0xffffffffu, v, d);
}

#endif
