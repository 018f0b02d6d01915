// all_to_all_v with counts in device memory, between ranks that map each other's memory
// (ctran/src/moe/alltoallv.rs). Compiled at run time by NVRTC, like the other kernel sources.
//
// One operation is three kernels on the caller's stream:
// 1. a2av_counts: each rank writes its row of the count matrix (what it sends to every rank,
//    then its output's capacity in rows) into every rank's region, raises its flag there, and
//    waits for every rank's row. The matrix is double-buffered by the parity of the round.
// 2. a2av_send: each rank copies its rows for rank r straight into r's output, at the rows of
//    the ranks before it, unless r's output cannot hold what all ranks send it; the last block
//    raises the data flag at every rank.
// 3. a2av_recv: each rank waits for every rank's data flag and writes the counts it received.
//
// The count exchange orders everything: a peer writes this rank's output only after this rank
// ran its own a2av_counts, which follows (on its stream) whatever used the output before. A
// rank reaches round n + 2 only after every rank finished round n, so the parity buffers are
// never overwritten while read. Waits give up at the timeout; errors land in the mapped host
// word `err` (code, then three details), which the host turns into an exception.

typedef unsigned char u8;

#define A2AV_MAX_RANKS 64
#define A2AV_ERR_COUNT 1     // a: destination, b: the count (negative, or past input's rows)
// DEV_ERR_TIMEOUT and DEV_ERR_ABORTED (report.cuh): b is what waited (1 counts, 2 data)
#define A2AV_ERR_CAPACITY 3  // a: receiving rank, b: rows sent to it, c: its capacity

// Region layout (bytes): matrix[2][size][size + 1] u64, count flags[size], data flags[size],
// then this rank's state (round, finished blocks).
struct A2avParams {
    u32 rank, size;
    u64 row_bytes, in_rows, out_rows;
    u64 input, in_counts, out_counts;
    u64 timeout_ns, err;
    u64 abort;  // mapped host word: nonzero once the communicator aborted
    u64 region[A2AV_MAX_RANKS];  // every rank's region as mapped here
    u64 output[A2AV_MAX_RANKS];  // every rank's output as mapped here
};

__device__ __forceinline__ u64* matrix(const A2avParams& p, u32 rank, u64 parity) {
    return (u64*)p.region[rank] + parity * p.size * (p.size + 1);
}
__device__ __forceinline__ u64* count_flags(const A2avParams& p, u32 rank) {
    return (u64*)p.region[rank] + 2ull * p.size * (p.size + 1);
}
__device__ __forceinline__ u64* data_flags(const A2avParams& p, u32 rank) {
    return count_flags(p, rank) + p.size;
}
__device__ __forceinline__ u64* state(const A2avParams& p) {
    return data_flags(p, p.rank) + p.size;  // [0] round, [1] finished blocks
}

__device__ void a2av_fail(const A2avParams& p, u64 code, u64 a, u64 b, u64 c) {
    dev_report(p.err, DEV_SLOT_INPUT, code, a, b, c);
}

__device__ bool a2av_wait(const A2avParams& p, u64* flag, u64 round, u64 peer, u64 what) {
    return dev_wait(p.err, p.abort, p.timeout_ns, flag, round, peer, what);
}

// One block of A2AV_MAX_RANKS threads.
extern "C" __global__ void __launch_bounds__(64) a2av_counts(const __grid_constant__ A2avParams p) {
    __shared__ u64 row[A2AV_MAX_RANKS + 1];
    __shared__ u64 round;
    u32 t = threadIdx.x;
    if (t == 0) {
        round = state(p)[0] + 1;
        state(p)[0] = round;
        // Bad counts send nothing; the error names the first.
        const long long* counts = (const long long*)p.in_counts;
        u64 total = 0;
        bool ok = true;
        for (u32 r = 0; r < p.size; ++r) {
            long long c = counts[r];
            if (c < 0 || total + (u64)c > p.in_rows) {
                if (ok) a2av_fail(p, A2AV_ERR_COUNT, r, (u64)c, p.in_rows);
                ok = false;
            } else {
                total += (u64)c;
            }
            row[r] = (u64)c;
        }
        if (!ok)
            for (u32 r = 0; r < p.size; ++r) row[r] = 0;
        row[p.size] = p.out_rows;
    }
    __syncthreads();
    u64 parity = round & 1;
    if (t < p.size) {
        u64* m = matrix(p, t, parity) + (u64)p.rank * (p.size + 1);
        for (u32 i = 0; i <= p.size; ++i) m[i] = row[i];
        __threadfence_system();
        tc_st_release_sys(count_flags(p, t) + p.rank, round);
        a2av_wait(p, count_flags(p, p.rank) + t, round, t, 1);
    }
    __syncthreads();
}

// Copies this rank's rows to every rank's output, 16 KiB chunks taken in turn by the blocks.
#define A2AV_CHUNK 16384ull
extern "C" __global__ void __launch_bounds__(256) a2av_send(const __grid_constant__ A2avParams p) {
    u64 round = state(p)[0];
    const u64* m = matrix(p, p.rank, round & 1);
    u64 w = p.size + 1;
    u64 chunk = blockIdx.x;
    u64 src_row = 0;
    for (u32 r = 0; r < p.size; ++r) {
        u64 rows = m[(u64)p.rank * w + r];
        u64 before = 0, total = 0;
        for (u32 s = 0; s < p.size; ++s) {
            if (s < p.rank) before += m[(u64)s * w + r];
            total += m[(u64)s * w + r];
        }
        u64 bytes = rows * p.row_bytes;
        u64 chunks = (bytes + A2AV_CHUNK - 1) / A2AV_CHUNK;
        bool fits = total <= m[(u64)r * w + p.size];
        const u8* src = (const u8*)p.input + src_row * p.row_bytes;
        u8* dst = (u8*)p.output[r] + before * p.row_bytes;
        for (; chunk < chunks; chunk += gridDim.x) {
            if (!fits) continue;
            u64 from = chunk * A2AV_CHUNK;
            u64 n = bytes - from < A2AV_CHUNK ? bytes - from : A2AV_CHUNK;
            if ((((u64)src | (u64)dst | from | n) & 15) == 0) {
                const uint4* s4 = (const uint4*)(src + from);
                uint4* d4 = (uint4*)(dst + from);
                for (u64 i = threadIdx.x; i < n / 16; i += blockDim.x) d4[i] = s4[i];
            } else {
                for (u64 i = threadIdx.x; i < n; i += blockDim.x) dst[from + i] = src[from + i];
            }
        }
        if (!fits && blockIdx.x == 0 && threadIdx.x == 0)
            a2av_fail(p, A2AV_ERR_CAPACITY, r, total, m[(u64)r * w + p.size]);
        // `chunk` counts across destinations, so blocks stay spread over small blocks of rows.
        chunk -= chunks;
        src_row += rows;
    }
    __shared__ bool last;
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        u32* done = (u32*)(state(p) + 1);
        last = atomicAdd(done, 1u) == gridDim.x - 1;
        if (last) *done = 0;
    }
    __syncthreads();
    if (last) {
        __threadfence_system();
        for (u32 r = threadIdx.x; r < p.size; r += blockDim.x)
            tc_st_release_sys(data_flags(p, r) + p.rank, round);
    }
}

// One block of A2AV_MAX_RANKS threads: waits for every rank's rows, writes the counts.
extern "C" __global__ void __launch_bounds__(64) a2av_recv(const __grid_constant__ A2avParams p) {
    u64 round = state(p)[0];
    const u64* m = matrix(p, p.rank, round & 1);
    u64 w = p.size + 1;
    u32 t = threadIdx.x;
    if (t < p.size) {
        a2av_wait(p, data_flags(p, p.rank) + t, round, t, 2);
        u64 total = 0;
        for (u32 s = 0; s < p.size; ++s) total += m[(u64)s * w + p.rank];
        bool fits = total <= p.out_rows;
        if (!fits && t == 0) a2av_fail(p, A2AV_ERR_CAPACITY, p.rank, total, p.out_rows);
        ((long long*)p.out_counts)[t] = fits ? (long long)m[(u64)t * w + p.rank] : 0;
    }
    __threadfence();
}
