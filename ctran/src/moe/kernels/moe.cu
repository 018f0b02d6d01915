// Mixture-of-experts dispatch and combine on the device (ctran/src/moe). Compiled at run time
// by NVRTC, like the other kernel sources, and for AMD targets by the HIP checks.
//
// Two transports share every kernel:
// - mapped: every rank maps every peer's symmetric region (CUDA IPC); senders write records
//   straight into the receiver's region and raise a flag there. Nothing involves the host, so
//   a whole exchange is capturable in a CUDA graph.
// - staged: senders pack records into local scratch; the host's device_alltoallv_single (the
//   GPU progress engine over host transports) moves them between the kernels.
//
// Rounds: dispatch and combine each count their rounds in device memory (`state`), so graph
// replays advance them too. A flag holds the round that wrote it; a receiver waits until it
// reaches its own round. A sender waits for the receiver's acknowledgement of the previous
// dispatch round before overwriting its records. Combine rows need none: the owner of a token
// dispatched it after its previous combine finished reading (stream order on the owner).
//
// Errors never hang and never write out of bounds: a bad expert id is dropped from the routing
// and reported; a wait gives up at `timeout_ns`, or once the communicator aborted (the mapped
// host word `abort`), and is reported; a row that answers no routed slot is refused. The first
// error wins the mapped host word `err` (code, then three details), which the host turns into
// an exception.

typedef unsigned short u16;
typedef unsigned char u8;

#define MOE_MAX_RANKS 64
#define MOE_MAX_LOCAL 1024
#define MOE_MAX_TOP_K 256  // DeviceMoeBuffer refuses more

#define MOE_ERR_EXPERT 1    // a: token, b: slot, c: the id
// DEV_ERR_TIMEOUT 2 and DEV_ERR_ABORTED 7 (report.cuh): b is what waited (1 ack, 2 dispatch,
// 3 combine)
#define MOE_ERR_ROW 3       // a: peer, b: token, c: slot (a row answering no routed slot)
#define MOE_ERR_MISSING 4   // a: token, b: slot (no row came back)
#define MOE_ERR_COUNT 5     // a: peer, b: count (more records than max_tokens)
#define MOE_ERR_Y_ROWS 6    // a: rows received, b: rows of expert_out

// Byte offsets into the regions, computed by the host (ctran/src/moe/layout.rs).
struct MoeLayout {
    // Symmetric region (peers write it in mapped mode).
    u64 drecv;   // dispatch records: size x max_tokens x rec_stride
    u64 crecv;   // combine rows: max_tokens x top_k x hidden bf16
    u64 dflag;   // per source rank: dispatch round
    u64 dcount;  // per source rank: records sent this round
    u64 dack;    // per receiving rank: the last dispatch round it finished reading
    u64 cflag;   // per source rank: combine round
    u64 stamp;   // per (token, slot): the combine round its row arrived in (u32)
    // Scratch (this rank only).
    u64 state;   // MoeState
    u64 mask;    // per token: destination ranks (u64 bit mask)
    u64 pos;     // per (token, rank): the token's record index at that rank (u32)
    u64 idx;     // per (token, slot): checked global expert id or -1 (i32)
    u64 w;       // per (token, slot): weight (f32)
    u64 send_counts;  // per rank: records sent (i64; staged counts)
    u64 send_off;     // per rank: first record in `send` (u64)
    u64 recv_counts;  // per rank: records received (i64; staged counts)
    u64 ecnt;    // per (local expert, source): rows (u32)
    u64 elist;   // per local expert: (source << 48 | slot << 32 | record), slab rows each
    u64 eoff;    // per local expert, plus one: first packed row (u32)
    u64 epos;    // per (local expert, source): rows of that source in experts before (u32)
    u64 efirst;  // per (local expert, source): rows of sources before, in the expert (u32)
    u64 rbase;   // per source: first record of it in `drecv` (u64)
    u64 rows_per_src;  // per source: rows combine returns there (i64; staged counts)
    u64 csend_off;     // per source: first combine record for it in `send` (u64)
    u64 crecv_counts;  // per rank: combine records received (i64; staged counts)
    u64 row_src;  // per received row (indexed like the rows): MoeRow
    u64 send;     // staged: records to send
    u64 cstage;   // staged: combine records received
};

struct MoeState {
    u64 dround, cround;  // rounds started
    u32 send_done, copy_done, csend_done, index_done;
    u32 rows;            // rows of the last dispatch
    u32 tokens;          // tokens of the last dispatch
};

struct MoeRow {
    u32 src, token, slot, pack;
};

struct MoeParams {
    u32 rank, size, tokens, hidden;
    u32 top_k, local, max_tokens, num_experts;
    u32 fp8, mapped, low_latency, y_rows;  // y_rows: rows of `y`
    u64 rec_stride, crec_stride, slab, timeout_ns;
    u64 x, idx, w;                  // dispatch inputs: bf16 [tokens, hidden], i64, f32
    u64 y, out;                     // combine: expert rows (bf16), result (bf16)
    u64 recv_x, recv_x_fp8, recv_scales, recv_weights, tokens_per_expert;
    u64 scratch, err;
    u64 abort;                      // mapped host word: nonzero once the communicator aborted
    MoeLayout at;
    u64 peer[MOE_MAX_RANKS];        // every rank's symmetric region, as mapped here
};

// ------------------------------------------------------------------------------ helpers

__device__ __forceinline__ MoeState* moe_state(const MoeParams& p) {
    return (MoeState*)(p.scratch + p.at.state);
}
template <typename T>
__device__ __forceinline__ T* scratch(const MoeParams& p, u64 off) {
    return (T*)(p.scratch + off);
}
template <typename T>
__device__ __forceinline__ T* sym(const MoeParams& p, u32 rank, u64 off) {
    return (T*)(p.peer[rank] + off);
}

// A peer's count out of range breaks the exchange; the other codes are this rank's input.
__device__ void moe_fail(const MoeParams& p, u64 code, u64 a, u64 b, u64 c) {
    u32 slot = code == MOE_ERR_COUNT ? DEV_SLOT_EXCHANGE : DEV_SLOT_INPUT;
    dev_report(p.err, slot, code, a, b, c);
}

__device__ bool moe_wait(const MoeParams& p, u64* flag, u64 round, u64 peer, u64 what) {
    return dev_wait(p.err, p.abort, p.timeout_ns, flag, round, peer, what);
}

// True in the block that finishes last of the grid (counter reset for the next launch).
__device__ bool moe_last_block(u32* counter) {
    __shared__ bool last;
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
        if (last) *counter = 0;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// Copies `bytes` (a multiple of 8) from src to dst with the threads of [lane0, lane0 + n).
// Four loads are issued before their stores, so each thread keeps several in flight (the
// compiler cannot reorder a load past a store through pointers that may alias).
__device__ __forceinline__ void moe_copy(u8* dst, const u8* src, u64 bytes, u32 lane, u32 n) {
    if (((bytes | (u64)dst | (u64)src) & 15) == 0) {
        const uint4* s = (const uint4*)src;
        uint4* d = (uint4*)dst;
        u64 vecs = bytes / 16, i = lane;
        for (; i + 3 * n < vecs; i += 4 * n) {
            uint4 a = s[i], b = s[i + n], c = s[i + 2 * n], e = s[i + 3 * n];
            d[i] = a;
            d[i + n] = b;
            d[i + 2 * n] = c;
            d[i + 3 * n] = e;
        }
        for (; i < vecs; i += n) d[i] = s[i];
    } else {
        const u64* s = (const u64*)src;
        u64* d = (u64*)dst;
        for (u64 i = lane; i < bytes / 8; i += n) d[i] = s[i];
    }
}

__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float((u32)b << 16); }

// Round to nearest even, NaN kept quiet: as the `half` crate the host path uses.
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x0040u);
    u32 round_bit = 0x8000u;
    if ((x & round_bit) != 0 && (x & (3 * round_bit - 1)) != 0) return (u16)((x >> 16) + 1);
    return (u16)(x >> 16);
}

// e4m3fn, round to nearest even, saturating at +-448 (backends/api/src/moe/fp8.rs).
__device__ __forceinline__ u8 f32_to_e4m3(float v) {
    u32 bits = __float_as_uint(v);
    u8 sign = (bits >> 31) ? 0x80 : 0;
    float a = fabsf(v);
    if (a != a) return sign | 0x7f;
    if (a >= 448.0f) return sign | 0x7e;
    if (a < 1.0f / 64.0f) return sign | (u8)rintf(a * 512.0f);
    u32 ab = __float_as_uint(a);
    u32 exp = ((ab >> 23) & 0xff) - 127 + 7;
    u32 mant = ab & 0x7fffff;
    u32 keep = mant >> 20, rest = mant & 0xfffff, half = 0x80000;
    u32 up = rest > half || (rest == half && (keep & 1));
    return sign | (u8)(((exp << 3) | keep) + up);
}

// Dispatch record (`rec_stride` bytes for this dispatch's dtype): payload (bf16 or fp8), scale
// f32, token u32, then per slot (local expert i32 or -1, weight f32).
__device__ __forceinline__ u64 payload_bytes(const MoeParams& p) {
    return p.fp8 ? (u64)p.hidden : 2ull * p.hidden;
}
__device__ __forceinline__ u64 scale_at(const MoeParams& p) { return payload_bytes(p); }
__device__ __forceinline__ u64 token_at(const MoeParams& p) { return scale_at(p) + 4; }
__device__ __forceinline__ u64 slot_at(const MoeParams& p, u32 k) {
    return token_at(p) + 4 + 8ull * k;
}

// Exclusive prefix of `flag` over the block's threads (blockDim.x a multiple of the warp
// size, at most 1024); *total gets the sum. Every thread must call it.
__device__ u32 block_prefix(bool flag, u32* total) {
    __shared__ u32 warp_sum[1024 / TC_WARP_SIZE];
    __shared__ u32 sum;
    u32 lane = threadIdx.x % TC_WARP_SIZE, warp = threadIdx.x / TC_WARP_SIZE;
    u64 ballot = tc_ballot(flag);
    if (lane == 0) warp_sum[warp] = (u32)__popcll(ballot);
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 acc = 0;
        for (u32 i = 0; i < blockDim.x / TC_WARP_SIZE; ++i) {
            u32 v = warp_sum[i];
            warp_sum[i] = acc;
            acc += v;
        }
        sum = acc;
    }
    __syncthreads();
    u32 r = warp_sum[warp] + (u32)__popcll(ballot & ((1ull << lane) - 1));
    *total = sum;
    __syncthreads();
    return r;
}

// The largest of every thread's `v` (blockDim.x at most 1024). Every thread must call it.
__device__ float block_max(float v) {
    __shared__ float part[1024];
    part[threadIdx.x] = v;
    __syncthreads();
    for (u32 half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + half]);
        __syncthreads();
    }
    float r = part[0];
    __syncthreads();
    return r;
}

// ------------------------------------------------------------------------------ dispatch

// Token t's k-th expert id if it is in range and not a repeat of an earlier slot's, else -1.
__device__ __forceinline__ int moe_checked_id(const MoeParams& p, u32 t, u32 k) {
    const long long* idx_in = (const long long*)p.idx + (u64)t * p.top_k;
    long long id = idx_in[k];
    bool ok = id >= 0 && id < (long long)p.num_experts;
    for (u32 j = 0; ok && j < k; ++j) ok = idx_in[j] != id;
    return ok ? (int)id : -1;
}

// Token t's destination ranks, a bit each. With `keep`, also reports its expert ids that are
// neither valid nor -1 (an unused slot) and keeps its checked routing (ids, weights, mask) for
// the later kernels.
__device__ u64 moe_route_token(const MoeParams& p, u32 t, bool keep) {
    u32 per_rank = p.num_experts / p.size;
    u64 m = 0;
    for (u32 k = 0; k < p.top_k; ++k) {
        int id = moe_checked_id(p, t, k);
        if (keep) {
            long long raw = ((const long long*)p.idx)[(u64)t * p.top_k + k];
            if (id < 0 && raw != -1) moe_fail(p, MOE_ERR_EXPERT, t, k, (u64)raw);
            scratch<int>(p, p.at.idx)[(u64)t * p.top_k + k] = id;
            scratch<float>(p, p.at.w)[(u64)t * p.top_k + k] = ((const float*)p.w)[(u64)t * p.top_k + k];
        }
        if (id >= 0) m |= 1ull << ((u32)id / per_rank);
    }
    if (keep) scratch<u64>(p, p.at.mask)[t] = m;
    return m;
}

// Threads 0..size: waits until every destination read the previous round's records (mapped).
__device__ void moe_wait_acks(const MoeParams& p, u64 round) {
    if (p.mapped && threadIdx.x < p.size && threadIdx.x != p.rank)
        moe_wait(p, sym<u64>(p, p.rank, p.at.dack) + threadIdx.x, round - 1, threadIdx.x, 1);
}

// One thread: keeps the records sent to each rank and where each rank's start when packed.
__device__ void moe_keep_counts(const MoeParams& p, const u32* count) {
    long long* counts = scratch<long long>(p, p.at.send_counts);
    u64* off = scratch<u64>(p, p.at.send_off);
    u64 acc = 0;
    for (u32 r = 0; r < p.size; ++r) {
        counts[r] = count[r];
        off[r] = acc;
        acc += count[r];
    }
}

// One block of 1024 threads. Starts a dispatch round; checks and copies the routing; gives
// every token its record index at each destination rank (in token order); waits until every
// destination finished reading the previous round (mapped).
extern "C" __global__ void __launch_bounds__(1024) moe_route(const __grid_constant__ MoeParams p) {
    MoeState* st = moe_state(p);
    __shared__ u64 round;
    __shared__ u32 base[MOE_MAX_RANKS];
    if (threadIdx.x == 0) {
        round = st->dround + 1;
        st->dround = round;
        st->tokens = p.tokens;
    }
    if (threadIdx.x < p.size) base[threadIdx.x] = 0;
    __syncthreads();
    moe_wait_acks(p, round);
    u32* pos = scratch<u32>(p, p.at.pos);
    for (u32 chunk = 0; chunk < p.tokens; chunk += blockDim.x) {
        u32 t = chunk + threadIdx.x;
        u64 m = t < p.tokens ? moe_route_token(p, t, true) : 0;
        for (u32 r = 0; r < p.size; ++r) {
            u32 total;
            u32 before = block_prefix((m >> r) & 1, &total);
            if ((m >> r) & 1) pos[(u64)t * p.size + r] = base[r] + before;
            if (threadIdx.x == 0) base[r] += total;
            __syncthreads();
        }
    }
    if (threadIdx.x == 0) moe_keep_counts(p, base);
}

// Quantizes token t (FP8) and writes its record to every rank r in `m`, as record `pos(r)`
// there; `slot(k)` is its k-th checked expert id (or -1), `weight(k)` its weight. Every
// thread of the block must call it.
template <typename Pos, typename Slot, typename Weight>
__device__ void moe_send_token(const MoeParams& p, u32 t, u64 m, Pos pos, Slot slot, Weight weight) {
    __shared__ float scale_s;
    const u64* send_off = scratch<u64>(p, p.at.send_off);
    const u16* x = (const u16*)p.x + (u64)t * p.hidden;
    float scale = 1.0f;
    if (p.fp8) {
        float amax = 0.0f;
        for (u32 h = threadIdx.x; h < p.hidden; h += blockDim.x)
            amax = fmaxf(amax, fabsf(bf16_to_f32(x[h])));
        amax = block_max(amax);
        if (threadIdx.x == 0) scale_s = amax > 0.0f ? amax / 448.0f : 1.0f;
        __syncthreads();
        scale = scale_s;
    }
    for (u32 r = 0; r < p.size; ++r) {
        if (!((m >> r) & 1)) continue;
        u64 record = pos(r);
        u8* dst = p.mapped
            ? sym<u8>(p, r, p.at.drecv) + ((u64)p.rank * p.max_tokens + record) * p.rec_stride
            : scratch<u8>(p, p.at.send) + (send_off[r] + record) * p.rec_stride;
        if (p.fp8) {
            // Eight elements per thread and store.
            for (u32 h = threadIdx.x * 8; h < p.hidden; h += blockDim.x * 8) {
                u64 packed = 0;
                for (u32 j = 0; j < 8; ++j)
                    packed |= (u64)f32_to_e4m3(bf16_to_f32(x[h + j]) / scale) << (8 * j);
                *(u64*)(dst + h) = packed;
            }
        } else {
            moe_copy(dst, (const u8*)x, 2ull * p.hidden, threadIdx.x, blockDim.x);
        }
        if (threadIdx.x == 0) {
            *(float*)(dst + scale_at(p)) = scale;
            *(u32*)(dst + token_at(p)) = t;
        }
        for (u32 k = threadIdx.x; k < p.top_k; k += blockDim.x) {
            int id = slot(k);
            int e = (id >= 0 && (u32)id / p.local == r) ? (int)((u32)id % p.local) : -1;
            *(int*)(dst + slot_at(p, k)) = e;
            *(float*)(dst + slot_at(p, k) + 4) = weight(k);
        }
    }
    __syncthreads();
}

// The last block of a dispatch's send: raises the round's flag, with this rank's record
// count, at every rank (mapped).
__device__ void moe_raise_dispatch(const MoeParams& p, u64 round, const long long* counts) {
    for (u32 r = threadIdx.x; r < p.size; r += blockDim.x) {
        sym<u64>(p, r, p.at.dcount)[p.rank] = (u64)counts[r];
        __threadfence_system();
        tc_st_release_sys(sym<u64>(p, r, p.at.dflag) + p.rank, round);
    }
}

// A block per token (grid-strided): quantizes it (FP8) and writes its record to every rank of
// its experts. The last block raises the round's flag at every rank (mapped).
extern "C" __global__ void __launch_bounds__(256) moe_dispatch_send(const __grid_constant__ MoeParams p) {
    MoeState* st = moe_state(p);
    u64 round = st->dround;
    const u64* mask = scratch<u64>(p, p.at.mask);
    const u32* pos = scratch<u32>(p, p.at.pos);
    const int* idx = scratch<int>(p, p.at.idx);
    const float* w = scratch<float>(p, p.at.w);
    for (u32 t = blockIdx.x; t < p.tokens; t += gridDim.x) {
        moe_send_token(
            p, t, mask[t], [&](u32 r) { return (u64)pos[(u64)t * p.size + r]; },
            [&](u32 k) { return idx[(u64)t * p.top_k + k]; },
            [&](u32 k) { return w[(u64)t * p.top_k + k]; });
    }
    if (moe_last_block(&st->send_done) && p.mapped)
        moe_raise_dispatch(p, round, scratch<long long>(p, p.at.send_counts));
}

// Few tokens over mapped memory (at most a block's threads; a block per token): route and
// send in one kernel. Every block routes every token itself (a few KB of expert ids read
// again costs less than a kernel boundary) to find its token's record number at each rank,
// waits until every destination read the previous round, and writes its token's records.
// Block 0 keeps what later kernels read (the checked routing, the counts) and reports bad
// expert ids; the last block starts the round and raises its flags.
extern "C" __global__ void __launch_bounds__(256) moe_dispatch_fused(const __grid_constant__ MoeParams p) {
    MoeState* st = moe_state(p);
    u64 round = st->dround + 1;
    __shared__ u32 mine[MOE_MAX_RANKS];  // this block's token: its record number per rank
    __shared__ u32 counts[MOE_MAX_RANKS];
    __shared__ u64 own_mask;
    u32 t = threadIdx.x;
    const float* w_in = (const float*)p.w;
    u64 m = t < p.tokens ? moe_route_token(p, t, blockIdx.x == 0) : 0;
    if (t == blockIdx.x) own_mask = m;
    for (u32 r = 0; r < p.size; ++r) {
        u32 total;
        u32 before = block_prefix((m >> r) & 1, &total);
        if (t == blockIdx.x) mine[r] = before;
        if (threadIdx.x == 0) counts[r] = total;
    }
    moe_wait_acks(p, round);
    __syncthreads();
    u32 own = blockIdx.x;
    if (own < p.tokens) {
        moe_send_token(
            p, own, own_mask, [&](u32 r) { return (u64)mine[r]; },
            [&](u32 k) { return moe_checked_id(p, own, k); },
            [&](u32 k) { return w_in[(u64)own * p.top_k + k]; });
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) moe_keep_counts(p, counts);
    if (moe_last_block(&st->send_done)) {
        if (threadIdx.x == 0) {
            st->dround = round;
            st->tokens = p.tokens;
        }
        // Block 0's counts: every block fenced its writes before it counted itself done.
        moe_raise_dispatch(p, round, scratch<long long>(p, p.at.send_counts));
    }
}

// Exclusive prefix sum of every thread's `v` over the block (blockDim.x a multiple of the warp
// size, at most 1024); *total gets the sum. Every thread must call it.
__device__ u32 block_exclusive_sum(u32 v, u32* total) {
    __shared__ u32 warp_sum[1024 / TC_WARP_SIZE];
    __shared__ u32 sum;
    u32 lane = threadIdx.x % TC_WARP_SIZE, warp = threadIdx.x / TC_WARP_SIZE;
    u32 incl = v;
    for (u32 d = 1; d < TC_WARP_SIZE; d *= 2) {
        u32 other = tc_shfl_up(incl, d);
        if (lane >= d) incl += other;
    }
    if (lane == TC_WARP_SIZE - 1) warp_sum[warp] = incl;
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 acc = 0;
        for (u32 i = 0; i < blockDim.x / TC_WARP_SIZE; ++i) {
            u32 w = warp_sum[i];
            warp_sum[i] = acc;
            acc += w;
        }
        sum = acc;
    }
    __syncthreads();
    u32 r = warp_sum[warp] + incl - v;
    *total = sum;
    __syncthreads();
    return r;
}

// Exclusive prefix over i in [0, n) of value(i), written to out(i, prefix): each thread takes
// a contiguous run of i. Returns the total. Every thread of the block must call it.
template <typename Value, typename Out>
__device__ u32 block_scan_runs(u32 n, Value value, Out out) {
    u32 per = (n + blockDim.x - 1) / blockDim.x;
    u32 lo = min(n, threadIdx.x * per), hi = min(n, lo + per);
    u32 mine = 0;
    for (u32 i = lo; i < hi; ++i) mine += value(i);
    u32 total;
    u32 acc = block_exclusive_sum(mine, &total);
    for (u32 i = lo; i < hi; ++i) {
        u32 v = value(i);
        out(i, acc);
        acc += v;
    }
    return total;
}

// Places received record `rec` (from source s, its slot k) into row `dst` of the caller's
// tensors with the 32 lanes of a warp, and notes where the row came from for combine
// (`row_src` is indexed like the rows; `pack`: its place in a staged combine's packed records).
__device__ void moe_place_row(const MoeParams& p, const u8* rec, u64 dst, u32 s, u32 k, u32 pack,
                              u32 lane) {
    if (p.fp8) {
        moe_copy((u8*)p.recv_x_fp8 + dst * p.hidden, rec, p.hidden, lane, 32);
    } else {
        moe_copy((u8*)p.recv_x + dst * 2 * p.hidden, rec, 2ull * p.hidden, lane, 32);
    }
    if (lane == 0) {
        ((float*)p.recv_scales)[dst] = *(const float*)(rec + scale_at(p));
        ((float*)p.recv_weights)[dst] = *(const float*)(rec + slot_at(p, k) + 4);
        MoeRow r;
        r.src = s;
        r.token = *(const u32*)(rec + token_at(p));
        r.slot = k;
        r.pack = pack;
        scratch<MoeRow>(p, p.at.row_src)[dst] = r;
    }
}

// The fused path: low latency over mapped memory, where a row's place (its expert's slab) is
// known without the other experts' counts.
__device__ __forceinline__ bool moe_index_copies(const MoeParams& p) {
    return p.low_latency && p.mapped;
}

// A block per local expert: waits for every source's records (mapped), lists the records
// naming the expert (in order of source and record), and writes its row counts; on the fused
// path it then copies its rows into its slab itself (no moe_dispatch_copy launch). The last
// block to finish lays the rows out: the first row of each expert (`eoff`) and, staged, where
// each row goes back to in combine's packed records; on the fused path it acknowledges the
// round to every source.
extern "C" __global__ void __launch_bounds__(256) moe_dispatch_index(const __grid_constant__ MoeParams p) {
    MoeState* st = moe_state(p);
    u64 round = st->dround;
    u32 e = blockIdx.x;
    __shared__ u32 count[MOE_MAX_RANKS];
    __shared__ u64 first[MOE_MAX_RANKS];
    if (threadIdx.x < p.size) {
        u32 s = threadIdx.x;
        u64 n;
        if (p.mapped) {
            bool ok = moe_wait(p, sym<u64>(p, p.rank, p.at.dflag) + s, round, s, 2);
            n = ok ? *(volatile u64*)(sym<u64>(p, p.rank, p.at.dcount) + s) : 0;
            if (n > p.max_tokens) {
                if (e == 0) moe_fail(p, MOE_ERR_COUNT, s, n, 0);
                n = 0;
            }
        } else {
            n = (u64)scratch<long long>(p, p.at.recv_counts)[s];
        }
        count[s] = (u32)n;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 acc = 0;
        for (u32 s = 0; s < p.size; ++s) {
            first[s] = p.mapped ? (u64)s * p.max_tokens : acc;
            acc += count[s];
        }
    }
    __syncthreads();
    __threadfence();
    if (e == 0 && threadIdx.x < p.size) scratch<u64>(p, p.at.rbase)[threadIdx.x] = first[threadIdx.x];
    u64* list = scratch<u64>(p, p.at.elist) + (u64)e * p.slab;
    u32* ecnt = scratch<u32>(p, p.at.ecnt) + (u64)e * p.size;
    u32* efirst = scratch<u32>(p, p.at.efirst) + (u64)e * p.size;
    const u8* recv = sym<u8>(p, p.rank, p.at.drecv);
    u32 rows = 0;
    for (u32 s = 0; s < p.size; ++s) {
        u32 from_s = 0;
        for (u32 chunk = 0; chunk < count[s]; chunk += blockDim.x) {
            u32 j = chunk + threadIdx.x;
            int slot = -1;
            if (j < count[s]) {
                const u8* rec = recv + (first[s] + j) * p.rec_stride;
                // Every slot read without stopping at a match: the loads go out together.
                for (u32 k = 0; k < p.top_k; ++k) {
                    int id = *(const volatile int*)(rec + slot_at(p, k));
                    if (slot < 0 && id == (int)e) slot = (int)k;
                }
            }
            u32 total;
            u32 before = block_prefix(slot >= 0, &total);
            if (slot >= 0 && rows + before < p.slab)
                list[rows + before] = ((u64)s << 48) | ((u64)slot << 32) | j;
            rows += total;
            from_s += total;
        }
        if (threadIdx.x == 0) {
            efirst[s] = rows - from_s;
            ecnt[s] = from_s;
        }
    }
    if (threadIdx.x == 0) ((long long*)p.tokens_per_expert)[e] = rows;
    if (moe_index_copies(p)) {
        __syncthreads();  // the list is complete
        u32 lane = threadIdx.x & 31, n = min(rows, (u32)p.slab);
        for (u32 i = threadIdx.x >> 5; i < n; i += blockDim.x >> 5) {
            u64 entry = list[i];
            u32 s = (u32)(entry >> 48), k = (u32)(entry >> 32) & 0xffff, j = (u32)entry;
            moe_place_row(p, recv + (first[s] + j) * p.rec_stride, (u64)e * p.slab + i, s, k, 0,
                          lane);
        }
    }
    if (!moe_last_block(&st->index_done)) return;
    // The last block: every expert's counts are in.
    const long long* tpe = (const long long*)p.tokens_per_expert;
    u32* eoff = scratch<u32>(p, p.at.eoff);
    u32 all = block_scan_runs(
        p.local, [&](u32 i) { return (u32)tpe[i]; }, [&](u32 i, u32 at) { eoff[i] = at; });
    if (threadIdx.x == 0) {
        eoff[p.local] = all;
        st->rows = all;
    }
    if (moe_index_copies(p)) {
        // Every block copied its rows before it arrived here: the records have been read.
        for (u32 s = threadIdx.x; s < p.size; s += blockDim.x)
            tc_st_release_sys(sym<u64>(p, s, p.at.dack) + p.rank, round);
    }
    if (p.mapped) return;  // combine writes rows straight to (token, slot): no packing
    // Staged combine packs rows by source, then expert, then token: for each source, the
    // rows of experts before (`epos`), and how many rows go back to it.
    const u32* counts = scratch<u32>(p, p.at.ecnt);
    u32* epos = scratch<u32>(p, p.at.epos);
    long long* per_src = scratch<long long>(p, p.at.rows_per_src);
    for (u32 s = 0; s < p.size; ++s) {
        u32 n = block_scan_runs(
            p.local, [&](u32 i) { return counts[(u64)i * p.size + s]; },
            [&](u32 i, u32 at) { epos[(u64)i * p.size + s] = at; });
        if (threadIdx.x == 0) per_src[s] = n;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        u64* csend_off = scratch<u64>(p, p.at.csend_off);
        u64 c = 0;
        for (u32 s = 0; s < p.size; ++s) {
            csend_off[s] = c;
            c += (u64)per_src[s];
        }
    }
}

// The local expert of packed row g (eoff ascending, eoff[local] = rows).
__device__ __forceinline__ u32 expert_of(const MoeParams& p, const u32* eoff, u32 g) {
    u32 lo = 0, hi = p.local;  // eoff[lo] <= g < eoff[hi]
    while (hi - lo > 1) {
        u32 mid = (lo + hi) / 2;
        if (eoff[mid] <= g) lo = mid; else hi = mid;
    }
    return lo;
}

// Where packed row g of expert e lives in the received-rows tensors.
__device__ __forceinline__ u64 row_at(const MoeParams& p, const u32* eoff, u32 e, u32 g) {
    return p.low_latency ? (u64)e * p.slab + (g - eoff[e]) : g;
}

// A warp per received row: activations, scale and weight into the caller's tensors, and where
// the row came from for combine. The last block acknowledges the round to every source.
extern "C" __global__ void __launch_bounds__(256) moe_dispatch_copy(const __grid_constant__ MoeParams p) {
    MoeState* st = moe_state(p);
    u64 round = st->dround;
    const u32* eoff = scratch<u32>(p, p.at.eoff);
    const u32* epos = scratch<u32>(p, p.at.epos);
    const u32* efirst = scratch<u32>(p, p.at.efirst);
    const u64* list = scratch<u64>(p, p.at.elist);
    const u64* rbase = scratch<u64>(p, p.at.rbase);
    const u64* csend_off = scratch<u64>(p, p.at.csend_off);
    const u8* recv = sym<u8>(p, p.rank, p.at.drecv);
    u32 total = eoff[p.local];
    u32 lane = threadIdx.x & 31;
    u32 warps = gridDim.x * (blockDim.x >> 5);
    for (u32 g = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); g < total; g += warps) {
        u32 e = expert_of(p, eoff, g);
        u32 i = g - eoff[e];
        u64 entry = list[(u64)e * p.slab + i];
        u32 s = (u32)(entry >> 48), k = (u32)(entry >> 32) & 0xffff, j = (u32)entry;
        const u8* rec = recv + (rbase[s] + j) * p.rec_stride;
        u32 pack = (u32)csend_off[s] + epos[(u64)e * p.size + s] + (i - efirst[(u64)e * p.size + s]);
        moe_place_row(p, rec, row_at(p, eoff, e, g), s, k, pack, lane);
    }
    if (moe_last_block(&st->copy_done) && p.mapped) {
        for (u32 s = threadIdx.x; s < p.size; s += blockDim.x)
            tc_st_release_sys(sym<u64>(p, s, p.at.dack) + p.rank, round);
    }
}

// ------------------------------------------------------------------------------ combine

// A warp per received row: the expert's output goes back to the token's rank, into its
// (token, slot) row (mapped) or packed for that rank (staged). The last block starts the
// combine round and raises its flag at every rank (mapped).
extern "C" __global__ void __launch_bounds__(256) moe_combine_send(const __grid_constant__ MoeParams p) {
    MoeState* st = moe_state(p);
    u32 round = (u32)(st->cround + 1);
    const u32* eoff = scratch<u32>(p, p.at.eoff);
    const MoeRow* rows = scratch<MoeRow>(p, p.at.row_src);
    u32 total = eoff[p.local];
    u32 lane = threadIdx.x & 31;
    u32 warps = gridDim.x * (blockDim.x >> 5);
    u64 row_bytes = 2ull * p.hidden;
    for (u32 g = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); g < total; g += warps) {
        u32 e = expert_of(p, eoff, g);
        u64 y_row = row_at(p, eoff, e, g);
        MoeRow r = rows[y_row];
        if (y_row >= p.y_rows) {
            if (lane == 0 && g == p.y_rows) moe_fail(p, MOE_ERR_Y_ROWS, total, p.y_rows, 0);
            continue;
        }
        const u8* y = (const u8*)p.y + y_row * row_bytes;
        if (p.mapped) {
            if (r.token >= p.max_tokens || r.slot >= p.top_k || r.src >= p.size) {
                if (lane == 0) moe_fail(p, MOE_ERR_ROW, r.src, r.token, r.slot);
                continue;
            }
            u64 at = (u64)r.token * p.top_k + r.slot;
            moe_copy(sym<u8>(p, r.src, p.at.crecv) + at * row_bytes, y, row_bytes, lane, 32);
            if (lane == 0) sym<u32>(p, r.src, p.at.stamp)[at] = round;
        } else {
            u8* dst = scratch<u8>(p, p.at.send) + (u64)r.pack * p.crec_stride;
            moe_copy(dst, y, row_bytes, lane, 32);
            if (lane == 0) {
                *(u32*)(dst + row_bytes) = r.token;
                *(u32*)(dst + row_bytes + 4) = r.slot;
            }
        }
    }
    if (moe_last_block(&st->csend_done)) {
        if (threadIdx.x == 0) st->cround = round;
        if (p.mapped) {
            for (u32 s = threadIdx.x; s < p.size; s += blockDim.x)
                tc_st_release_sys(sym<u64>(p, s, p.at.cflag) + p.rank, round);
        }
    }
}

// Staged: a block per received combine record (grid-strided): checked against this rank's
// routing (each routed slot answered once, by the rank of its expert), then written to its
// (token, slot) row.
extern "C" __global__ void __launch_bounds__(256) moe_combine_scatter(const __grid_constant__ MoeParams p) {
    MoeState* st = moe_state(p);
    u32 round = (u32)st->cround;
    const long long* counts = scratch<long long>(p, p.at.crecv_counts);
    const int* idx = scratch<int>(p, p.at.idx);
    u32* stamp = sym<u32>(p, p.rank, p.at.stamp);
    u8* comb = sym<u8>(p, p.rank, p.at.crecv);
    __shared__ bool ok;
    u64 total = 0;
    for (u32 s = 0; s < p.size; ++s) total += (u64)counts[s];
    u64 row_bytes = 2ull * p.hidden;
    for (u64 g = blockIdx.x; g < total; g += gridDim.x) {
        const u8* rec = scratch<u8>(p, p.at.cstage) + g * p.crec_stride;
        u32 t = *(const u32*)(rec + row_bytes), k = *(const u32*)(rec + row_bytes + 4);
        u64 at = (u64)t * p.top_k + k;
        if (threadIdx.x == 0) {
            u32 s = 0;
            u64 acc = 0;
            while (s + 1 < p.size && acc + (u64)counts[s] <= g) acc += (u64)counts[s++];
            bool good = t < st->tokens && k < p.top_k;
            if (good) {
                int id = idx[at];
                good = id >= 0 && (u32)id / (p.num_experts / p.size) == s;
            }
            if (good) good = atomicExch(stamp + at, round) != round;
            if (!good) moe_fail(p, MOE_ERR_ROW, s, t, k);
            ok = good;
        }
        __syncthreads();
        if (ok) moe_copy(comb + at * row_bytes, rec, row_bytes, threadIdx.x, blockDim.x);
        __syncthreads();
    }
}

// Blocks per token: each thread sums one run of 8 elements of a token's slots. Grid-strided
// over (token, part), `parts` blocks per token (ceil(hidden / 8 / blockDim.x)).
__device__ __forceinline__ u32 reduce_parts(const MoeParams& p) {
    return (p.hidden / 8 + blockDim.x - 1) / blockDim.x;
}

// Adds 8 bf16 of `q`, weighted by `w`, to acc in f32 (product rounded, then the sum: the host
// path's order, no FMA).
__device__ __forceinline__ void add_weighted(float* acc, uint4 q, float w) {
    u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (u32 j = 0; j < 4; ++j) {
        acc[2 * j] = __fadd_rn(acc[2 * j], __fmul_rn(w, bf16_to_f32((u16)(words[j] & 0xffff))));
        acc[2 * j + 1] = __fadd_rn(acc[2 * j + 1], __fmul_rn(w, bf16_to_f32((u16)(words[j] >> 16))));
    }
}

// Waits for every rank's rows (mapped), then writes each token's weighted sum of its slots,
// in slot order, in f32, rounded to bf16. A token's slot states (routed and arrived, weight)
// are read once per block into shared memory; rows are read 16 bytes at a time, four slots'
// loads in flight together.
extern "C" __global__ void __launch_bounds__(256) moe_combine_reduce(const __grid_constant__ MoeParams p) {
    MoeState* st = moe_state(p);
    u32 round = (u32)st->cround;
    if (p.mapped && threadIdx.x < p.size)
        moe_wait(p, sym<u64>(p, p.rank, p.at.cflag) + threadIdx.x, round, threadIdx.x, 3);
    __syncthreads();
    __threadfence();
    __shared__ bool use[MOE_MAX_TOP_K];
    __shared__ float weight[MOE_MAX_TOP_K];
    const int* idx = scratch<int>(p, p.at.idx);
    const float* w = scratch<float>(p, p.at.w);
    const volatile u32* stamp = sym<u32>(p, p.rank, p.at.stamp);
    const uint4* comb = (const uint4*)sym<u8>(p, p.rank, p.at.crecv);
    uint4* out = (uint4*)p.out;
    u32 vecs = p.hidden / 8, parts = reduce_parts(p);
    u64 blocks = (u64)st->tokens * parts;
    for (u64 b = blockIdx.x; b < blocks; b += gridDim.x) {
        u32 t = (u32)(b / parts), part = (u32)(b % parts);
        __syncthreads();  // the previous token's slot states are no longer read
        for (u32 k = threadIdx.x; k < p.top_k; k += blockDim.x) {
            u64 at = (u64)t * p.top_k + k;
            bool routed = idx[at] >= 0, arrived = stamp[at] == round;
            if (routed && !arrived && part == 0) moe_fail(p, MOE_ERR_MISSING, t, k, 0);
            use[k] = routed && arrived;
            weight[k] = w[at];
        }
        __syncthreads();
        u32 v = part * blockDim.x + threadIdx.x;
        if (v >= vecs) continue;
        const uint4* row = comb + (u64)t * p.top_k * vecs + v;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (u32 k0 = 0; k0 < p.top_k; k0 += 4) {
            uint4 q[4];
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                u32 k = k0 + j;
                if (k < p.top_k && use[k]) q[j] = row[(u64)k * vecs];
            }
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                u32 k = k0 + j;
                if (k < p.top_k && use[k]) add_weighted(acc, q[j], weight[k]);
            }
        }
        uint4 r;
        r.x = (u32)f32_to_bf16(acc[0]) | ((u32)f32_to_bf16(acc[1]) << 16);
        r.y = (u32)f32_to_bf16(acc[2]) | ((u32)f32_to_bf16(acc[3]) << 16);
        r.z = (u32)f32_to_bf16(acc[4]) | ((u32)f32_to_bf16(acc[5]) << 16);
        r.w = (u32)f32_to_bf16(acc[6]) | ((u32)f32_to_bf16(acc[7]) << 16);
        out[(u64)t * vecs + v] = r;
    }
}
