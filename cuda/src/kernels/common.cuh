// Element types shared by the project's CUDA sources (prepended to reduce.cu and nvl.cu at
// build time, after gpu_compat.cuh, since NVRTC compiles one string and we include no header).

typedef unsigned char u8;
typedef signed char i8;
typedef int i32;
typedef long long i64;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// ---- f16 / bf16 as raw bits ----
struct f16 { u16 bits; };
struct bf16 { u16 bits; };

__device__ __forceinline__ float f16_to_f32(u16 h) { return tc_f16_to_f32(h); }
__device__ __forceinline__ u16 f32_to_f16(float f) { return tc_f32_to_f16(f); }
__device__ __forceinline__ float bf16_to_f32(u16 b) {
    return __uint_as_float(((u32)b) << 16);
}
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((u >> 16) | 0x0040u);  // quiet NaN, sign kept
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return (u16)(u >> 16);
}

