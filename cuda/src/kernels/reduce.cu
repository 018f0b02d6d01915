// Reduction kernels of the GPU paths (ctran's and the nccl backend's bitwise reductions), compiled at run time by NVRTC (see ../nvrtc.rs).
//
// They follow the CPU kernels of ctran/src/kernels/reduce.rs step for step, so the GPU and the
// CPU agree bit for bit:
//   tc_combine_<op>_<type>(dst, a, b, n)      dst[i] = a[i] <op> b[i]      (one pairwise step)
//   tc_scale_<type>(dst, src, n, factor)      dst[i] = src[i] * factor    (PREMUL_SUM, float AVG)
//   tc_divide_<type>(buf, n, divisor)         buf[i] /= divisor           (integer AVG, truncating)
// f16 and bf16 widen to f32, operate, and round back (to nearest even) after every step.
// Integers wrap; bool bytes read nonzero as true and are written as 0 or 1.
// No header is included, so NVRTC needs nothing beyond its own library.

// Types and f16/bf16 conversions: common.cuh, prepended.

// ---- per-type traits: storage -> compute type and back ----
template <typename T> struct Tr;
#define PLAIN(T)                                                             \
    template <> struct Tr<T> {                                               \
        typedef T C;                                                         \
        static __device__ __forceinline__ C load(T v) { return v; }          \
        static __device__ __forceinline__ T store(C v) { return v; }         \
    };
PLAIN(float)
PLAIN(double)
PLAIN(i8)
PLAIN(u8)
PLAIN(i32)
PLAIN(i64)
template <> struct Tr<f16> {
    typedef float C;
    static __device__ __forceinline__ C load(f16 v) { return f16_to_f32(v.bits); }
    static __device__ __forceinline__ f16 store(C v) { f16 r; r.bits = f32_to_f16(v); return r; }
};
template <> struct Tr<bf16> {
    typedef float C;
    static __device__ __forceinline__ C load(bf16 v) { return bf16_to_f32(v.bits); }
    static __device__ __forceinline__ bf16 store(C v) { bf16 r; r.bits = f32_to_bf16(v); return r; }
};

// ---- the pairwise operators ----
struct OpSum  { template <typename C> static __device__ __forceinline__ C f(C a, C b) { return a + b; } };
struct OpProd { template <typename C> static __device__ __forceinline__ C f(C a, C b) { return a * b; } };
struct OpMin  { template <typename C> static __device__ __forceinline__ C f(C a, C b) { return b < a ? b : a; } };
struct OpMax  { template <typename C> static __device__ __forceinline__ C f(C a, C b) { return b > a ? b : a; } };
// IEEE 754-2019 minimum/maximum for floats, as the CPU kernels: NaN if either is NaN, -0 < +0.
template <> __device__ __forceinline__ float OpMin::f<float>(float a, float b) {
    return a < b ? a : (b < a ? b : __uint_as_float(__float_as_uint(a) | __float_as_uint(b)));
}
template <> __device__ __forceinline__ float OpMax::f<float>(float a, float b) {
    return a > b ? a : (b > a ? b : (a == b ? __uint_as_float(__float_as_uint(a) & __float_as_uint(b))
                                            : __uint_as_float(__float_as_uint(a) | __float_as_uint(b))));
}
template <> __device__ __forceinline__ double OpMin::f<double>(double a, double b) {
    return a < b ? a : (b < a ? b : __longlong_as_double(__double_as_longlong(a) | __double_as_longlong(b)));
}
template <> __device__ __forceinline__ double OpMax::f<double>(double a, double b) {
    return a > b ? a : (b > a ? b : (a == b ? __longlong_as_double(__double_as_longlong(a) & __double_as_longlong(b))
                                            : __longlong_as_double(__double_as_longlong(a) | __double_as_longlong(b))));
}
struct OpBand { template <typename C> static __device__ __forceinline__ C f(C a, C b) { return a & b; } };
struct OpBor  { template <typename C> static __device__ __forceinline__ C f(C a, C b) { return a | b; } };
struct OpBxor { template <typename C> static __device__ __forceinline__ C f(C a, C b) { return a ^ b; } };

// Integer sums and products wrap: compute in the unsigned type of the same width.
template <typename T> struct Wrap { typedef T U; };
template <> struct Wrap<i8> { typedef u8 U; };
template <> struct Wrap<i32> { typedef u32 U; };
template <> struct Wrap<i64> { typedef u64 U; };

template <typename Op, typename T>
__device__ __forceinline__ T apply(T a, T b) {
    typedef typename Tr<T>::C C;
    return Tr<T>::store(Op::template f<C>(Tr<T>::load(a), Tr<T>::load(b)));
}
#define WRAPPING(OP, T)                                                          \
    template <> __device__ __forceinline__ T apply<OP, T>(T a, T b) {           \
        typedef Wrap<T>::U U;                                                    \
        return (T)OP::template f<U>((U)a, (U)b);                                 \
    }
WRAPPING(OpSum, i8) WRAPPING(OpSum, i32) WRAPPING(OpSum, i64)
WRAPPING(OpProd, i8) WRAPPING(OpProd, i32) WRAPPING(OpProd, i64)

// Grid-stride loop; 16-byte vectors would help bandwidth, left for the ctran GPU path issue.
template <typename Op, typename T>
__device__ __forceinline__ void combine(T* dst, const T* a, const T* b, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        dst[i] = apply<Op, T>(a[i], b[i]);
    }
}
__device__ __forceinline__ void combine_bool(u8* dst, const u8* a, const u8* b, u64 n, int which) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        bool x = a[i] != 0, y = b[i] != 0, r;
        switch (which) {
            case 0: r = x || y; break;   // sum, max, bor
            case 1: r = x && y; break;   // prod, min, band
            default: r = x != y; break;  // bxor
        }
        dst[i] = r ? 1 : 0;
    }
}

// Float scaling: the factor arrives already rounded to the element type.
template <typename T>
__device__ __forceinline__ void scale_float(T* dst, const T* src, u64 n, double factor) {
    typedef typename Tr<T>::C C;
    C f = (C)factor;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        dst[i] = Tr<T>::store(Tr<T>::load(src[i]) * f);
    }
}
// Integer scaling: multiply as f64, truncate toward zero, saturate to the type's range.
template <typename T>
__device__ __forceinline__ void scale_int(T* dst, const T* src, u64 n, double factor, double lo, double hi) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        double v = trunc((double)src[i] * factor);
        if (v != v) v = 0.0;
        v = v < lo ? lo : (v > hi ? hi : v);
        dst[i] = (T)(i64)v;
    }
}
template <typename T>
__device__ __forceinline__ void divide_int(T* buf, u64 n, i64 d) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        buf[i] = (T)((i64)buf[i] / d);
    }
}

#define COMBINE(OPNAME, OP, TNAME, T)                                                        \
    extern "C" __global__ void tc_combine_##OPNAME##_##TNAME(T* dst, const T* a, const T* b, u64 n) { \
        combine<OP, T>(dst, a, b, n);                                                      \
    }
#define ARITH(TNAME, T)                 \
    COMBINE(sum, OpSum, TNAME, T)       \
    COMBINE(prod, OpProd, TNAME, T)     \
    COMBINE(min, OpMin, TNAME, T)       \
    COMBINE(max, OpMax, TNAME, T)
#define BITWISE(TNAME, T)               \
    COMBINE(band, OpBand, TNAME, T)     \
    COMBINE(bor, OpBor, TNAME, T)       \
    COMBINE(bxor, OpBxor, TNAME, T)

ARITH(f16, f16) ARITH(bf16, bf16) ARITH(f32, float) ARITH(f64, double)
ARITH(i8, i8) ARITH(u8, u8) ARITH(i32, i32) ARITH(i64, i64)
BITWISE(i8, i8) BITWISE(u8, u8) BITWISE(i32, i32) BITWISE(i64, i64)

extern "C" __global__ void tc_combine_sum_bool(u8* d, const u8* a, const u8* b, u64 n) { combine_bool(d, a, b, n, 0); }
extern "C" __global__ void tc_combine_max_bool(u8* d, const u8* a, const u8* b, u64 n) { combine_bool(d, a, b, n, 0); }
extern "C" __global__ void tc_combine_bor_bool(u8* d, const u8* a, const u8* b, u64 n) { combine_bool(d, a, b, n, 0); }
extern "C" __global__ void tc_combine_prod_bool(u8* d, const u8* a, const u8* b, u64 n) { combine_bool(d, a, b, n, 1); }
extern "C" __global__ void tc_combine_min_bool(u8* d, const u8* a, const u8* b, u64 n) { combine_bool(d, a, b, n, 1); }
extern "C" __global__ void tc_combine_band_bool(u8* d, const u8* a, const u8* b, u64 n) { combine_bool(d, a, b, n, 1); }
extern "C" __global__ void tc_combine_bxor_bool(u8* d, const u8* a, const u8* b, u64 n) { combine_bool(d, a, b, n, 2); }

#define SCALE_F(TNAME, T)                                                                      \
    extern "C" __global__ void tc_scale_##TNAME(T* dst, const T* src, u64 n, double factor) { \
        scale_float<T>(dst, src, n, factor);                                                  \
    }
SCALE_F(f16, f16) SCALE_F(bf16, bf16) SCALE_F(f32, float) SCALE_F(f64, double)
#define SCALE_I(TNAME, T, LO, HI)                                                              \
    extern "C" __global__ void tc_scale_##TNAME(T* dst, const T* src, u64 n, double factor) { \
        scale_int<T>(dst, src, n, factor, LO, HI);                                            \
    }                                                                                          \
    extern "C" __global__ void tc_divide_##TNAME(T* buf, u64 n, i64 d) { divide_int<T>(buf, n, d); }
SCALE_I(i8, i8, -128.0, 127.0)
SCALE_I(u8, u8, 0.0, 255.0)
SCALE_I(i32, i32, -2147483648.0, 2147483647.0)
SCALE_I(i64, i64, -9223372036854775808.0, 9223372036854775807.0)
