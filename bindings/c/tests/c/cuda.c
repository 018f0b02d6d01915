/*
 * CUDA communicators through the C API, over real ranks from the environment
 * (TORCHCOMM_RANK/SIZE, MASTER_ADDR/MASTER_PORT), rank r on GPU r modulo the GPUs present:
 * a synchronous all_reduce and an asynchronous all_gather_single on a stream of the program's
 * own, a window ring of put + signal / wait_signal for 50 iterations checked at each, and bad
 * input (a CPU buffer on a CUDA communicator). Prints "cuda OK rank R/N".
 *
 * The CUDA driver is opened at run time (no CUDA headers or libraries are needed to build it);
 * scripts/gpu-test.sh runs it on the GPU machines.
 */
#include <dlfcn.h>
#include <stdint.h>

#include "check.h"

#define N 4096

static int (*cuInit)(unsigned);
static int (*cuDeviceGetCount)(int *);
static int (*cuDeviceGet)(int *, int);
static int (*cuDevicePrimaryCtxRetain)(void **, int);
static int (*cuCtxSetCurrent)(void *);
static int (*cuMemAlloc)(uint64_t *, size_t);
static int (*cuMemFree)(uint64_t);
static int (*cuMemcpyHtoD)(uint64_t, const void *, size_t);
static int (*cuMemcpyDtoH)(void *, uint64_t, size_t);
static int (*cuStreamCreate)(void **, unsigned);
static int (*cuStreamSynchronize)(void *);

static void load(void *lib, void *fn, const char *name) {
    void *sym = dlsym(lib, name);
    if (!sym) {
        fprintf(stderr, "rank %d: libcuda has no %s\n", g_rank, name);
        exit(2);
    }
    memcpy(fn, &sym, sizeof sym);
}

#define CU(call)                                                                           \
    do {                                                                                   \
        int e_ = (call);                                                                   \
        if (e_ != 0) {                                                                     \
            fprintf(stderr, "rank %d: %s:%d: %s failed: CUDA error %d\n", g_rank, __FILE__, \
                    __LINE__, #call, e_);                                                  \
            exit(2);                                                                       \
        }                                                                                  \
    } while (0)

static int env_int(const char *name) {
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

static tc_tensor_t gpu_tensor(uint64_t ptr, size_t count, int device) {
    tc_tensor_t t = tc_cpu_tensor((void *)(uintptr_t)ptr, count, TC_FLOAT32);
    t.device.device_type = TC_DEVICE_CUDA;
    t.device.index = device;
    return t;
}

int main(void) {
    int r = env_int("TORCHCOMM_RANK"), n = env_int("TORCHCOMM_SIZE");
    g_rank = r;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "rank %d: no CUDA driver: %s\n", r, dlerror());
        return 2;
    }
    load(lib, &cuInit, "cuInit");
    load(lib, &cuDeviceGetCount, "cuDeviceGetCount");
    load(lib, &cuDeviceGet, "cuDeviceGet");
    load(lib, &cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    load(lib, &cuCtxSetCurrent, "cuCtxSetCurrent");
    load(lib, &cuMemAlloc, "cuMemAlloc_v2");
    load(lib, &cuMemFree, "cuMemFree_v2");
    load(lib, &cuMemcpyHtoD, "cuMemcpyHtoD_v2");
    load(lib, &cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    load(lib, &cuStreamCreate, "cuStreamCreate");
    load(lib, &cuStreamSynchronize, "cuStreamSynchronize");
    CU(cuInit(0));
    int ngpu = 0, dev = 0;
    CU(cuDeviceGetCount(&ngpu));
    int ordinal = r % ngpu;
    CU(cuDeviceGet(&dev, ordinal));
    void *ctx = NULL, *stream = NULL;
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    /* A blocking stream: it follows the legacy-stream copies below. */
    CU(cuStreamCreate(&stream, 0));

    tc_store_t *store = NULL;
    CHECK(tc_store_create(getenv("MASTER_ADDR"), (uint16_t)env_int("MASTER_PORT"), r == 0, 60.0,
                          &store));
    tc_comm_options_t opts;
    CHECK(tc_comm_options_init(&opts));
    opts.timeout_seconds = 60.0;
    opts.abort_process_on_timeout_or_error = 0;
    tc_comm_t *comm = NULL;
    const tc_device_t gpu = {TC_DEVICE_CUDA, ordinal};
    CHECK(tc_comm_create("ctran", gpu, "c_cuda", store, r, n, &opts, &comm));

    static float host[N * 8], back[N * 8];
    uint64_t buf = 0, gathered = 0, win_buf = 0, src = 0;
    CU(cuMemAlloc(&buf, N * sizeof(float)));
    CU(cuMemAlloc(&gathered, (size_t)n * N * sizeof(float)));
    CU(cuMemAlloc(&win_buf, 2 * N * sizeof(float)));
    CU(cuMemAlloc(&src, N * sizeof(float)));

    /* all_reduce, synchronous: ordered on `stream`. */
    for (int i = 0; i < N; i++) host[i] = (float)(r + 1) * (float)(i % 7);
    CU(cuMemcpyHtoD(buf, host, N * sizeof(float)));
    CHECK(tc_all_reduce(comm, gpu_tensor(buf, N, ordinal), TC_SUM, stream, NULL, NULL));
    CU(cuStreamSynchronize(stream));
    CU(cuMemcpyDtoH(back, buf, N * sizeof(float)));
    float ranks_sum = (float)n * (float)(n + 1) / 2.0f;
    for (int i = 0; i < N; i++) {
        if (back[i] != ranks_sum * (float)(i % 7)) {
            EXPECT(0, "all_reduce element %d is %f, want %f", i, back[i], ranks_sum * (i % 7));
            break;
        }
    }

    /* all_gather_single, asynchronous: tc_work_wait orders `stream` after it. */
    for (int i = 0; i < N; i++) host[i] = (float)(r * 100000 + i);
    CU(cuMemcpyHtoD(buf, host, N * sizeof(float)));
    tc_work_t *w = NULL;
    CHECK(tc_all_gather_single(comm, gpu_tensor(gathered, (size_t)n * N, ordinal),
                               gpu_tensor(buf, N, ordinal), stream, NULL, &w));
    CHECK(tc_work_wait(w, TC_WAIT_OP_TIMEOUT));
    CHECK(tc_work_free(w));
    CU(cuStreamSynchronize(stream));
    CU(cuMemcpyDtoH(back, gathered, (size_t)n * N * sizeof(float)));
    for (int q = 0; q < n; q++) {
        for (int i = 0; i < N; i++) {
            if (back[q * N + i] != (float)(q * 100000 + i)) {
                EXPECT(0, "all_gather block %d element %d is %f", q, i, back[q * N + i]);
                q = n;
                break;
            }
        }
    }

    /* A window ring: put into the next rank's half `it % 2`, signal it, wait for the previous. */
    tc_window_t *win = NULL;
    CHECK(tc_window_create(comm, &win));
    CHECK(tc_window_register(win, gpu_tensor(win_buf, 2 * N, ordinal)));
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    for (int it = 0; it < 50; it++) {
        int half = it % 2;
        for (int i = 0; i < N; i++) host[i] = (float)(it * 1000 + r);
        CU(cuStreamSynchronize(stream));
        CU(cuMemcpyHtoD(src, host, N * sizeof(float)));
        CHECK(tc_window_put(win, gpu_tensor(src, N, ordinal), next, (size_t)(half * N), stream,
                            NULL, NULL));
        CHECK(tc_window_signal(win, next, stream, NULL, NULL));
        CHECK(tc_window_wait_signal(win, prev, stream, NULL, NULL));
        CU(cuStreamSynchronize(stream));
        CU(cuMemcpyDtoH(back, win_buf + (uint64_t)half * N * sizeof(float), N * sizeof(float)));
        for (int i = 0; i < N; i++) {
            if (back[i] != (float)(it * 1000 + prev)) {
                EXPECT(0, "iteration %d: element %d is %f, want %d", it, i, back[i],
                       it * 1000 + prev);
                break;
            }
        }
        /* Every second iteration the neighbours agree the checked halves may be rewritten. */
        if (half) {
            CHECK(tc_window_signal(win, prev, stream, NULL, NULL));
            CHECK(tc_window_wait_signal(win, next, stream, NULL, NULL));
        }
    }
    CU(cuStreamSynchronize(stream));
    CHECK(tc_barrier(comm, stream, NULL, NULL));
    CHECK(tc_window_deregister(win));
    CHECK(tc_window_destroy(win));

    /* A CPU buffer on a CUDA communicator. */
    EXPECT(tc_all_reduce(comm, tc_cpu_tensor(host, N, TC_FLOAT32), TC_SUM, stream, NULL, NULL) ==
                   TC_ERR_INVALID_ARGUMENT &&
               strstr(tc_last_error(), "communicator's device") != NULL,
           "a CPU buffer is refused: %s", tc_last_error());

    CU(cuStreamSynchronize(stream));
    CHECK(tc_comm_finalize(comm));
    CHECK(tc_comm_destroy(comm));
    CHECK(tc_store_destroy(store));
    CU(cuMemFree(buf));
    CU(cuMemFree(gathered));
    CU(cuMemFree(win_buf));
    CU(cuMemFree(src));
    if (g_failures) {
        fprintf(stderr, "rank %d: %d failure(s)\n", r, g_failures);
        return 1;
    }
    printf("cuda OK rank %d/%d\n", r, n);
    return 0;
}
