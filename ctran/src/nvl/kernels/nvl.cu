// Kernels of the NVLink transport (ctran/src/nvl), compiled at run time by NVRTC.
//
// Every collective is one launch of tc_nvl_coll_<type> on a grid of the same size on every
// rank. Block b of each rank meets block b of every peer through flags in peer memory
// (st.release.sys into the peer's flag array, ld.acquire.sys on our own), so no block ever
// waits for another block of its own GPU. A kernel:
//   1. copies its "pre" segments (local staging into the comm's arena),
//   2. start barrier: once block b of peer p has arrived, p's earlier work on its comm stream is
//      done, so its inputs (and staged arena half) are readable and its outputs writable,
//   3. moves data: copies (peer arena or buffer -> ours, ours -> peer's) and at most one
//      reduction (up to MAXR sources, the same result stored to up to MAXR destinations),
//   4. optional end barrier: peers have finished reading our buffers and writing our outputs.
// Every segment of L bytes is cut the same way on every rank: block b owns bytes
// [b*part, (b+1)*part) with part = ceil(L/G) rounded up to 16, so the bytes block b of a peer
// staged before the barrier are exactly the ones our block b reads after it.
//
// Counters of barriers (epochs) live in device memory and advance in the kernels, so a CUDA
// graph replays with fresh epochs. The arena has two halves, used by alternate epochs: a
// peer still reading half h of epoch e cannot be overtaken by epoch e+2 (we passed e+1's start
// barrier, so the peer finished e).
//
// tc_nvl_p2p moves sends and receives through per-peer rings of slots in the sender's arena:
// the sender stages a chunk and raises ready, the receiver pulls it and raises consumed. One
// launch serves a whole batch and never blocks on one transfer while another could progress.
//
// Waits poll an abort word in mapped host memory and give up after timeout_ns (globaltimer),
// writing the reason to the status word, so a dead peer becomes an error, never a hang.

// Types and f16/bf16 conversions: common.cuh, prepended.

#define MAXR 8
#define MAXC 16
#define MAXP 32
#define GMAX 256

// Flag array (u64 words, in device memory, mapped by peers).
#define F_COLL(slot, src) (((slot) * MAXR + (src)) * GMAX)
#define F_READY(src) ((2 * MAXR + (src)) * GMAX)
#define F_CONSUMED(dst) ((3 * MAXR + (dst)) * GMAX)
// Counter array (local only).
#define C_COLL(slot) ((slot) * GMAX)
#define C_SEND(peer) ((2 + (peer)) * GMAX)
#define C_RECV(peer) ((2 + MAXR + (peer)) * GMAX)

// Status codes written to the status word.
#define ST_TIMEOUT 1
#define ST_ABORTED 2

struct Seg {
    u64 src, dst, len;
    u32 src_arena, dst_arena;  // nonzero: add the current arena half's offset
};

struct Sync {
    u64 flags;                // our flag array
    u64 peer_flags[MAXR];     // every rank's flag array as mapped here (ours at [rank])
    u64 counters;             // our counters
    u64 status;               // mapped host word
    u64 abort_flag;           // mapped host word
    u64 timeout_ns;
    u32 rank, nranks;
};

struct CollParams {
    Sync s;
    u64 half_bytes;           // offset of the arena's second half
    u64 rcount;               // elements reduced (0: no reduction)
    double factor;            // PREMUL_SUM factor, 1/n for float AVG
    i64 divisor;              // integer AVG
    u64 rsrc[MAXR];
    u64 rdst[MAXR];
    u32 rsrc_arena, rdst_arena;  // bit i: rsrc[i]/rdst[i] is in an arena
    u32 nsrc, ndst;
    u32 op;                   // 0 sum 1 prod 2 min 3 max 4 band 5 bor 6 bxor 7 avg 8 premul
    u32 npre, ncopy, end_barrier;
    Seg pre[MAXC];
    Seg copy[MAXC];
};

struct P2pOp {
    u64 buf, len;
    u32 peer, is_send;
};

struct P2pParams {
    Sync s;
    u64 ring;                 // our rings: [peer][slot] of slot_bytes
    u64 peer_ring[MAXR];      // every rank's rings as mapped here
    u64 slot_bytes;
    u32 slots, nops;
    P2pOp ops[MAXP];
};

// ---- memory order helpers ----
// (gpu_compat.cuh: PTX under CUDA, clang's atomics and wall clock under HIP)
__device__ __forceinline__ void st_release_sys(u64* p, u64 v) { tc_st_release_sys(p, v); }
__device__ __forceinline__ u64 ld_acquire_sys(const u64* p) { return tc_ld_acquire_sys(p); }
__device__ __forceinline__ u64 globaltimer() { return tc_globaltimer(); }

// Why a wait gave up, after writing it to the status word; 0 while waiting may go on.
__device__ __noinline__ int check_give_up(const Sync& s, u64 start) {
    if (*(volatile u32*)s.abort_flag) {
        atomicCAS((u32*)s.status, 0u, (u32)ST_ABORTED);
        __threadfence_system();
        return ST_ABORTED;
    }
    if (globaltimer() - start > s.timeout_ns) {
        atomicCAS((u32*)s.status, 0u, (u32)ST_TIMEOUT);
        __threadfence_system();
        return ST_TIMEOUT;
    }
    return 0;
}

// Waits until *p >= v; false if it gave up.
__device__ bool wait_geq(const Sync& s, const u64* p, u64 v) {
    u64 start = 0;
    for (u32 i = 0;; ++i) {
        if (ld_acquire_sys(p) >= v) return true;
        if ((i & 1023u) == 0) {
            if (i == 0) start = globaltimer();
            else if (check_give_up(s, start)) return false;
        }
    }
}

// Block b of every rank meets block b of every peer. False (for the whole block) on give-up.
__device__ bool barrier(const Sync& s, int slot, u64 epoch, int* failed) {
    __syncthreads();
    u32 t = threadIdx.x;
    if (t < s.nranks && t != s.rank) {
        __threadfence_system();
        u64* mine_there = (u64*)s.peer_flags[t] + F_COLL(slot, s.rank) + blockIdx.x;
        st_release_sys(mine_there, epoch);
        const u64* theirs_here = (const u64*)s.flags + F_COLL(slot, t) + blockIdx.x;
        if (!wait_geq(s, theirs_here, epoch)) *failed = 1;
    }
    __syncthreads();
    return *failed == 0;
}

// Block b's share [lo, hi) of a segment of len bytes.
__device__ __forceinline__ void block_range(u64 len, u64* lo, u64* hi) {
    u64 part = (len + gridDim.x - 1) / gridDim.x;
    part = (part + 15) & ~15ull;
    u64 l = part * blockIdx.x;
    *lo = l < len ? l : len;
    u64 h = l + part;
    *hi = h < len ? h : len;
}

// This block's bytes of a p2p ring slot of S bytes holding a chunk of clen: block b owns
// [b * part, (b + 1) * part) of every slot, part cut from S, not from clen. Each block's ready
// and consumed flags guard only its own part, and blocks run ahead of each other; were parts
// cut from the chunk's length, a block writing a full chunk into a slot would overwrite bytes
// of a shorter chunk (an operation's last) that another block's receiver had not read yet.
__device__ __forceinline__ void slot_range(u64 S, u64 clen, u64* lo, u64* hi) {
    u64 part = (S + gridDim.x - 1) / gridDim.x;
    part = (part + 15) & ~15ull;
    u64 l = part * blockIdx.x, h = l + part;
    *lo = l < clen ? l : clen;
    *hi = h < clen ? h : clen;
}

// Copies [lo, hi) of src to dst with the whole block, 16 bytes at a time where both allow.
__device__ void copy_range(u8* dst, const u8* src, u64 lo, u64 hi) {
    if (lo >= hi) return;
    u32 t = threadIdx.x, nt = blockDim.x;
    if ((((u64)(dst + lo)) & 15) == 0 && (((u64)(src + lo)) & 15) == 0) {
        u64 n16 = (hi - lo) / 16;
        const uint4* s = (const uint4*)(src + lo);
        uint4* d = (uint4*)(dst + lo);
        u64 i = t;
        for (; i + 3 * nt < n16; i += 4 * nt) {
            uint4 a = s[i], b = s[i + nt], c = s[i + 2 * nt], e = s[i + 3 * nt];
            d[i] = a; d[i + nt] = b; d[i + 2 * nt] = c; d[i + 3 * nt] = e;
        }
        for (; i < n16; i += nt) d[i] = s[i];
        for (u64 j = lo + n16 * 16 + t; j < hi; j += nt) dst[j] = src[j];
    } else {
        for (u64 j = lo + t; j < hi; j += nt) dst[j] = src[j];
    }
}

// ---- element types and operators ----
struct boolean { u8 v; };

// Tr<T>: storage type T computed as C; KIND 0 float, 1 integer, 2 bool.
template <typename T> struct Tr;
template <> struct Tr<float> { typedef float C; enum { KIND = 0 }; static __device__ C ld(float v) { return v; } static __device__ float st(C v) { return v; } };
template <> struct Tr<double> { typedef double C; enum { KIND = 0 }; static __device__ C ld(double v) { return v; } static __device__ double st(C v) { return v; } };
template <> struct Tr<f16> { typedef float C; enum { KIND = 0 }; static __device__ C ld(f16 v) { return f16_to_f32(v.bits); } static __device__ f16 st(C v) { f16 r; r.bits = f32_to_f16(v); return r; } };
template <> struct Tr<bf16> { typedef float C; enum { KIND = 0 }; static __device__ C ld(bf16 v) { return bf16_to_f32(v.bits); } static __device__ bf16 st(C v) { bf16 r; r.bits = f32_to_bf16(v); return r; } };
// Integers compute in the unsigned type of their width, so sums and products wrap.
template <> struct Tr<i8> { typedef u8 C; enum { KIND = 1 }; static __device__ C ld(i8 v) { return (C)v; } static __device__ i8 st(C v) { return (i8)v; } };
template <> struct Tr<u8> { typedef u8 C; enum { KIND = 1 }; static __device__ C ld(u8 v) { return v; } static __device__ u8 st(C v) { return v; } };
template <> struct Tr<i32> { typedef u32 C; enum { KIND = 1 }; static __device__ C ld(i32 v) { return (C)v; } static __device__ i32 st(C v) { return (i32)v; } };
template <> struct Tr<i64> { typedef u64 C; enum { KIND = 1 }; static __device__ C ld(i64 v) { return (C)v; } static __device__ i64 st(C v) { return (i64)v; } };
template <> struct Tr<boolean> { typedef u8 C; enum { KIND = 2 }; static __device__ C ld(boolean v) { return v.v != 0; } static __device__ boolean st(C v) { boolean r; r.v = v ? 1 : 0; return r; } };

template <typename T> struct Signed { typedef T S; };
template <> struct Signed<i8> { typedef i8 S; };
template <> struct Signed<i32> { typedef i32 S; };
template <> struct Signed<i64> { typedef i64 S; };

// Min/max of a value as its storage type (signedness matters for integers).
template <typename T>
__device__ __forceinline__ typename Tr<T>::C minmax(typename Tr<T>::C a, typename Tr<T>::C b, bool is_min) {
    typedef typename Tr<T>::C C;
    if constexpr (Tr<T>::KIND == 1) {
        typedef typename Signed<T>::S S;
        S x = (S)Tr<T>::st(a), y = (S)Tr<T>::st(b);
        return is_min ? (y < x ? b : a) : (y > x ? b : a);
    }
    if constexpr (Tr<T>::KIND == 0) {
        // NaN wins, as in the CPU kernels.
        if (a != a) return a;
        if (b != b) return b;
    }
    return is_min ? (b < a ? b : a) : (b > a ? b : a);
}

// One input scaled as the operator asks (PREMUL_SUM, float AVG).
template <typename T>
__device__ __forceinline__ typename Tr<T>::C prep(typename Tr<T>::C x, u32 op, double factor) {
    typedef typename Tr<T>::C C;
    if constexpr (Tr<T>::KIND == 0) {
        if (op == 7 || op == 8) return (C)(x * (C)factor);
    }
    if constexpr (Tr<T>::KIND == 1) {
        if (op == 8) {
            typedef typename Signed<T>::S S;
            double v = trunc((double)(S)Tr<T>::st(x) * factor);
            if (v != v) v = 0.0;
            return (C)(i64)v;
        }
    }
    return x;
}

template <typename T>
__device__ __forceinline__ typename Tr<T>::C combine(typename Tr<T>::C a, typename Tr<T>::C b, u32 op) {
    typedef typename Tr<T>::C C;
    if constexpr (Tr<T>::KIND == 2) {
        switch (op) {
            case 1: case 2: case 4: return a && b;
            case 6: return a != b;
            default: return a || b;
        }
    }
    switch (op) {
        case 1: return a * b;
        case 2: return minmax<T>(a, b, true);
        case 3: return minmax<T>(a, b, false);
        default: return a + b;  // sum, avg, premul
    }
}

template <typename T>
__device__ __forceinline__ typename Tr<T>::C combine_bits(typename Tr<T>::C a, typename Tr<T>::C b, u32 op) {
    typedef typename Tr<T>::C C;
    if constexpr (Tr<T>::KIND == 1) {
        if (op == 4) return a & b;
        if (op == 5) return a | b;
        if (op == 6) return a ^ b;
    }
    return combine<T>(a, b, op);
}

template <typename T>
__device__ __forceinline__ typename Tr<T>::C finish(typename Tr<T>::C a, u32 op, i64 divisor) {
    typedef typename Tr<T>::C C;
    if constexpr (Tr<T>::KIND == 1) {
        if (op == 7) {
            typedef typename Signed<T>::S S;
            return (C)(S)((i64)(S)Tr<T>::st(a) / divisor);
        }
    }
    return a;
}

// Reduces element range [lo, hi) of every source into every destination.
template <typename T>
__device__ void reduce_range(const CollParams& p, const u64* src, const u64* dst, u64 lo, u64 hi) {
    typedef typename Tr<T>::C C;
    const int V = 16 / sizeof(T);
    u32 t = threadIdx.x, nt = blockDim.x;
    bool aligned = true;
    for (u32 i = 0; i < p.nsrc; ++i) aligned &= ((src[i] + lo * sizeof(T)) & 15) == 0;
    for (u32 i = 0; i < p.ndst; ++i) aligned &= ((dst[i] + lo * sizeof(T)) & 15) == 0;
    u64 vec_end = lo;
    if (aligned) {
        u64 nv = (hi - lo) / V;
        vec_end = lo + nv * V;
        // Two vectors per thread per round, every load issued before any use: peer loads
        // cross NVLink, and bandwidth needs many of them in flight.
        for (u64 v = t; v < nv; v += 2 * nt) {
            const bool two = v + nt < nv;
            uint4 raw[2][MAXR];
#pragma unroll
            for (int i = 0; i < MAXR; ++i) {
                if (i < (int)p.nsrc) {
                    raw[0][i] = *(const uint4*)((const T*)src[i] + lo + v * V);
                    if (two) raw[1][i] = *(const uint4*)((const T*)src[i] + lo + (v + nt) * V);
                }
            }
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                if (u == 1 && !two) break;
                u64 e = lo + (v + u * nt) * V;
                C acc[V];
                {
                    const T* x = (const T*)&raw[u][0];
#pragma unroll
                    for (int k = 0; k < V; ++k) acc[k] = prep<T>(Tr<T>::ld(x[k]), p.op, p.factor);
                }
#pragma unroll
                for (int i = 1; i < MAXR; ++i) {
                    if (i < (int)p.nsrc) {
                        const T* x = (const T*)&raw[u][i];
#pragma unroll
                        for (int k = 0; k < V; ++k)
                            acc[k] = combine_bits<T>(acc[k], prep<T>(Tr<T>::ld(x[k]), p.op, p.factor), p.op);
                    }
                }
                uint4 out;
                T* o = (T*)&out;
#pragma unroll
                for (int k = 0; k < V; ++k) o[k] = Tr<T>::st(finish<T>(acc[k], p.op, p.divisor));
#pragma unroll
                for (int i = 0; i < MAXR; ++i)
                    if (i < (int)p.ndst) *(uint4*)((T*)dst[i] + e) = out;
            }
        }
    }
    for (u64 e = vec_end + t; e < hi; e += nt) {
        C acc = prep<T>(Tr<T>::ld(((const T*)src[0])[e]), p.op, p.factor);
        for (u32 i = 1; i < p.nsrc; ++i)
            acc = combine_bits<T>(acc, prep<T>(Tr<T>::ld(((const T*)src[i])[e]), p.op, p.factor), p.op);
        T r = Tr<T>::st(finish<T>(acc, p.op, p.divisor));
        for (u32 i = 0; i < p.ndst; ++i) ((T*)dst[i])[e] = r;
    }
}

__device__ __forceinline__ u64 seg_addr(u64 a, u32 in_arena, u64 half) { return in_arena ? a + half : a; }

template <typename T>
__device__ void coll(const CollParams& p) {
    __shared__ int failed;
    if (threadIdx.x == 0) failed = 0;
    u64* ctr = (u64*)p.s.counters;
    u64 epoch = ctr[C_COLL(0) + blockIdx.x] + 1;
    u64 half = (epoch & 1) ? p.half_bytes : 0;
    for (u32 i = 0; i < p.npre; ++i) {
        u64 lo, hi;
        block_range(p.pre[i].len, &lo, &hi);
        copy_range((u8*)seg_addr(p.pre[i].dst, p.pre[i].dst_arena, half),
                   (const u8*)seg_addr(p.pre[i].src, p.pre[i].src_arena, half), lo, hi);
    }
    if (!barrier(p.s, 0, epoch, &failed)) return;
    for (u32 i = 0; i < p.ncopy; ++i) {
        u64 lo, hi;
        block_range(p.copy[i].len, &lo, &hi);
        copy_range((u8*)seg_addr(p.copy[i].dst, p.copy[i].dst_arena, half),
                   (const u8*)seg_addr(p.copy[i].src, p.copy[i].src_arena, half), lo, hi);
    }
    if (p.rcount) {
        u64 src[MAXR], dst[MAXR];
        for (u32 i = 0; i < MAXR; ++i) {
            src[i] = seg_addr(p.rsrc[i], (p.rsrc_arena >> i) & 1, half);
            dst[i] = seg_addr(p.rdst[i], (p.rdst_arena >> i) & 1, half);
        }
        u64 lo, hi;
        block_range(p.rcount * sizeof(T), &lo, &hi);
        reduce_range<T>(p, src, dst, lo / sizeof(T), hi / sizeof(T));
    }
    if (p.end_barrier) {
        u64 e2 = ctr[C_COLL(1) + blockIdx.x] + 1;
        if (!barrier(p.s, 1, e2, &failed)) return;
        if (threadIdx.x == 0) ctr[C_COLL(1) + blockIdx.x] = e2;
    } else {
        __syncthreads();
    }
    if (threadIdx.x == 0) ctr[C_COLL(0) + blockIdx.x] = epoch;
}

#define COLL(NAME, T) \
    extern "C" __global__ void __launch_bounds__(512) tc_nvl_coll_##NAME(const __grid_constant__ CollParams p) { coll<T>(p); }
COLL(f32, float) COLL(f64, double) COLL(f16, f16) COLL(bf16, bf16)
COLL(i8, i8) COLL(u8, u8) COLL(i32, i32) COLL(i64, i64) COLL(bool, boolean)

// ---- low-latency all_reduce (small messages) ----
// One-shot without a barrier or a fence: every rank writes its input straight into every
// peer's LL region as 16-byte lines {data lo, flag, data hi, flag} (8 data bytes per line, the
// flag the epoch), and each rank polls its own region until every peer's line carries this
// epoch, then reduces in rank order (bitwise the same result on every rank). A line's data and
// flag land in one 8-byte store each, so seeing the flag means seeing the data: one NVLink
// crossing per operation instead of a barrier plus a remote read.
//
// Regions have two halves used by alternate epochs. Rank r writes half h of epoch e+2 only
// after its kernel e+1 finished, in which every block heard from every peer's same block in
// that peer's kernel e+1, so every peer's kernel e (which read half h) had finished. For that,
// every launched block owns at least one line (lines = max(data lines, grid), cut evenly), and
// blocks 0..grid take part in every collective, so the epochs of a kernel's blocks are equal.
struct LlParams {
    Sync s;
    u64 src, dst, bytes;
    u64 area;                 // our LL region (half 0): lines from every source
    u64 peer_area[MAXR];      // every rank's LL region as mapped here
    u64 half_bytes;           // offset of half 1
    u64 slot_bytes;           // bytes of one source's lines in a half
    double factor;            // PREMUL_SUM factor, 1/n for float AVG
    i64 divisor;              // integer AVG
    u32 op, pad;
};

__device__ __forceinline__ void st_ll(u64 addr, u64 v, u32 flag) {
    tc_st_volatile_v4(addr, (u32)v, flag, (u32)(v >> 32), flag);
}

// Waits until the line at addr carries flag; false (and *failed set) if it gave up.
__device__ bool ld_ll(const Sync& s, u64 addr, u32 flag, u64* v, volatile int* failed) {
    u64 start = 0;
    for (u32 k = 0;; ++k) {
        u32 d0, f0, d1, f1;
        tc_ld_volatile_v4(addr, &d0, &f0, &d1, &f1);
        if (f0 == flag && f1 == flag) {
            *v = (u64)d0 | ((u64)d1 << 32);
            return true;
        }
        if ((k & 1023u) == 0) {
            if (k == 0) start = globaltimer();
            else if (*failed || check_give_up(s, start)) { *failed = 1; return false; }
        }
    }
}

// Bytes [8i, 8i+8) of buf clipped to len, as one word (zero beyond len).
__device__ __forceinline__ u64 ld_word(u64 buf, u64 i, u64 len, bool aligned) {
    if (aligned && 8 * i + 8 <= len) return *(const u64*)(buf + 8 * i);
    u64 v = 0;
    for (u64 j = 8 * i; j < len && j < 8 * i + 8; ++j) v |= (u64)(*(const u8*)(buf + j)) << (8 * (j - 8 * i));
    return v;
}

__device__ __forceinline__ void st_word(u64 buf, u64 i, u64 len, bool aligned, u64 v) {
    if (aligned && 8 * i + 8 <= len) { *(u64*)(buf + 8 * i) = v; return; }
    for (u64 j = 8 * i; j < len && j < 8 * i + 8; ++j) *(u8*)(buf + j) = (u8)(v >> (8 * (j - 8 * i)));
}

template <typename T>
__device__ void ll_all_reduce(const LlParams& p) {
    typedef typename Tr<T>::C C;
    const int E = 8 / sizeof(T);
    __shared__ int failed;
    u32 t = threadIdx.x, nt = blockDim.x;
    if (t == 0) failed = 0;
    __syncthreads();
    u64* ctr = (u64*)p.s.counters;
    u64 epoch = ctr[C_COLL(0) + blockIdx.x] + 1;
    u32 flag = (u32)epoch;
    u64 half = (epoch & 1) ? p.half_bytes : 0;
    u64 data = (p.bytes + 7) / 8;
    u64 lines = data > gridDim.x ? data : gridDim.x;
    u64 lo = lines * blockIdx.x / gridDim.x, hi = lines * (blockIdx.x + 1) / gridDim.x;
    bool aligned = ((p.src | p.dst) & 7) == 0;
    u32 me = p.s.rank, n = p.s.nranks;
    u64 out = half + (u64)me * p.slot_bytes;
    for (u64 i = lo + t; i < hi; i += nt) {
        u64 v = i < data ? ld_word(p.src, i, p.bytes, aligned) : 0;
        for (u32 q = 0; q < n; ++q)
            if (q != me) st_ll(p.peer_area[q] + out + 16 * i, v, flag);
    }
    for (u64 i = lo + t; i < hi; i += nt) {
        u64 own = i < data ? ld_word(p.src, i, p.bytes, aligned) : 0;
        C acc[E];
        bool ok = true;
        for (u32 q = 0; q < n; ++q) {
            u64 w = own;
            if (q != me && !ld_ll(p.s, p.area + half + (u64)q * p.slot_bytes + 16 * i, flag, &w, &failed)) {
                ok = false;
                break;
            }
            const T* x = (const T*)&w;
#pragma unroll
            for (int k = 0; k < E; ++k) {
                C y = prep<T>(Tr<T>::ld(x[k]), p.op, p.factor);
                acc[k] = q == 0 ? y : combine_bits<T>(acc[k], y, p.op);
            }
        }
        if (!ok) break;
        if (i < data) {
            u64 r;
            T* o = (T*)&r;
#pragma unroll
            for (int k = 0; k < E; ++k) o[k] = Tr<T>::st(finish<T>(acc[k], p.op, p.divisor));
            st_word(p.dst, i, p.bytes, aligned, r);
        }
    }
    __syncthreads();
    if (t == 0 && !failed) ctr[C_COLL(0) + blockIdx.x] = epoch;
}

#define LL(NAME, T) \
    extern "C" __global__ void __launch_bounds__(512) tc_nvl_ll_##NAME(const __grid_constant__ LlParams p) { ll_all_reduce<T>(p); }
LL(f32, float) LL(f64, double) LL(f16, f16) LL(bf16, bf16)
LL(i8, i8) LL(u8, u8) LL(i32, i32) LL(i64, i64) LL(bool, boolean)

// ---- point to point ----
extern "C" __global__ void __launch_bounds__(512) tc_nvl_p2p(const __grid_constant__ P2pParams p) {
    __shared__ int ok;
    __shared__ u64 sseq[MAXR], rseq[MAXR];
    __shared__ u64 done[MAXP];
    u32 t = threadIdx.x;
    u64* ctr = (u64*)p.s.counters;
    u32 b = blockIdx.x;
    if (t < MAXR) {
        sseq[t] = ctr[C_SEND(t) + b];
        rseq[t] = ctr[C_RECV(t) + b];
    }
    if (t < MAXP) done[t] = 0;
    __syncthreads();
    u64 S = p.slot_bytes;
    u64 start = 0;
    for (u32 spin = 0;; ++spin) {
        bool all_done = true, progressed = false;
        u32 busy_send = 0, busy_recv = 0;  // peers whose earlier op in this batch is unfinished
        for (u32 i = 0; i < p.nops; ++i) {
            const P2pOp& op = p.ops[i];
            u64 nchunks = (op.len + S - 1) / S;
            u32 bit = 1u << op.peer;
            if (done[i] >= nchunks) continue;
            all_done = false;
            if (op.is_send ? (busy_send & bit) : (busy_recv & bit)) continue;
            if (op.is_send) busy_send |= bit; else busy_recv |= bit;
            u64 c = done[i];
            u64 clen = op.len - c * S < S ? op.len - c * S : S;
            u64 lo, hi;
            slot_range(S, clen, &lo, &hi);
            if (op.is_send) {
                u64 seq = sseq[op.peer];
                u64* slot = (u64*)(p.ring + ((u64)op.peer * p.slots + seq % p.slots) * S);
                if (t == 0) ok = ld_acquire_sys((const u64*)p.s.flags + F_CONSUMED(op.peer) + b) + p.slots > seq;
                __syncthreads();
                int go = ok;
                __syncthreads();
                if (!go) continue;
                copy_range((u8*)slot, (const u8*)(op.buf + c * S), lo, hi);
                __syncthreads();
                if (t == 0) {
                    __threadfence_system();
                    st_release_sys((u64*)p.s.peer_flags[op.peer] + F_READY(p.s.rank) + b, seq + 1);
                    sseq[op.peer] = seq + 1;
                    done[i] = c + 1;
                }
            } else {
                u64 seq = rseq[op.peer];
                const u64* slot = (const u64*)(p.peer_ring[op.peer] + ((u64)p.s.rank * p.slots + seq % p.slots) * S);
                if (t == 0) ok = ld_acquire_sys((const u64*)p.s.flags + F_READY(op.peer) + b) > seq;
                __syncthreads();
                int go = ok;
                __syncthreads();
                if (!go) continue;
                copy_range((u8*)(op.buf + c * S), (const u8*)slot, lo, hi);
                __syncthreads();
                if (t == 0) {
                    __threadfence_system();
                    st_release_sys((u64*)p.s.peer_flags[op.peer] + F_CONSUMED(p.s.rank) + b, seq + 1);
                    rseq[op.peer] = seq + 1;
                    done[i] = c + 1;
                }
            }
            progressed = true;
            __syncthreads();
        }
        if (all_done) break;
        if (!progressed && (spin & 1023u) == 0) {
            if (t == 0) {
                if (start == 0) start = globaltimer();
                ok = check_give_up(p.s, start) == 0;
            }
            __syncthreads();
            if (!ok) return;
        }
        __syncthreads();
    }
    __syncthreads();
    if (t < MAXR) {
        ctr[C_SEND(t) + b] = sseq[t];
        ctr[C_RECV(t) + b] = rseq[t];
    }
}

// ---- pipelined all_reduce (ctran/src/nvl/pipeline.rs) ----
// Copy engines move the data between GPUs; these kernels only order the copies across ranks
// (tc_nvl_pipe_sync: one warp raises a flag in every peer, then waits for every peer's) and
// reduce a chunk in local memory (tc_nvl_pipe_reduce_<type>). A flag value is the comm's
// pipeline base (a device counter, so graphs replay) plus a step number the host computed;
// the operation's last sync advances the base past every value it used.
#define PIPE_KINDS 3  // 0 barrier, 1 chunk arrived in the owner's scratch, 2 scratch slot free
#define F_PIPE(kind, src) ((4 * MAXR + (src)) * GMAX + (kind) * 16)
#define C_PIPE ((2 + 2 * MAXR) * GMAX)

struct PipeSync {
    Sync s;
    u64 signal_value;            // raised in every peer's word (signal_kind, our rank)
    u64 wait_value;              // awaited in our word (wait_kind, peer) of every peer
    u64 advance;                 // added to the base at the end (0: none)
    u32 signal_kind, wait_kind;  // PIPE_KINDS or more: none
};

extern "C" __global__ void tc_nvl_pipe_sync(const __grid_constant__ PipeSync p) {
    __shared__ int failed;
    u32 t = threadIdx.x;
    if (t == 0) failed = *(volatile u32*)p.s.status != 0;
    __syncthreads();
    // An earlier wait of this comm gave up: what follows is moot, and waiting again would
    // only add one timeout per chunk.
    if (failed) return;
    u64* ctr = (u64*)p.s.counters;
    u64 base = ctr[C_PIPE];
    bool peer = t < p.s.nranks && t != p.s.rank;
    if (peer && p.signal_kind < PIPE_KINDS) {
        __threadfence_system();
        st_release_sys((u64*)p.s.peer_flags[t] + F_PIPE(p.signal_kind, p.s.rank), base + p.signal_value);
    }
    if (peer && p.wait_kind < PIPE_KINDS) {
        if (!wait_geq(p.s, (const u64*)p.s.flags + F_PIPE(p.wait_kind, t), base + p.wait_value)) failed = 1;
    }
    __syncthreads();
    if (t == 0 && p.advance) ctr[C_PIPE] = base + p.advance;
}

// Reduces rcount elements of rsrc[0..nsrc) into rdst[0..ndst), all in local memory.
template <typename T>
__device__ void pipe_reduce(const CollParams& p) {
    u64 lo, hi;
    block_range(p.rcount * sizeof(T), &lo, &hi);
    reduce_range<T>(p, p.rsrc, p.rdst, lo / sizeof(T), hi / sizeof(T));
}

#define PIPE_REDUCE(NAME, T) \
    extern "C" __global__ void __launch_bounds__(512) tc_nvl_pipe_reduce_##NAME(const __grid_constant__ CollParams p) { pipe_reduce<T>(p); }
PIPE_REDUCE(f32, float) PIPE_REDUCE(f64, double) PIPE_REDUCE(f16, f16) PIPE_REDUCE(bf16, bf16)
PIPE_REDUCE(i8, i8) PIPE_REDUCE(u8, u8) PIPE_REDUCE(i32, i32) PIPE_REDUCE(i64, i64) PIPE_REDUCE(bool, boolean)
