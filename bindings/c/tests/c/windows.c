/*
 * One-sided windows through the C API, over real ranks from the environment
 * (TORCHCOMM_RANK/SIZE, MASTER_ADDR/MASTER_PORT): a ring of put + signal / wait_signal for 200
 * iterations with the data checked at each, an asynchronous put, and bad input (a put past the
 * end, a rank out of range, a stream on a CPU communicator, a put after deregistration).
 * Prints "windows OK rank R/N".
 */
#include <stdint.h>

#include "check.h"

#define N 64

static int env_int(const char *name) {
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

int main(void) {
    int r = env_int("TORCHCOMM_RANK"), n = env_int("TORCHCOMM_SIZE");
    g_rank = r;
    const char *host = getenv("MASTER_ADDR");
    tc_store_t *store = NULL;
    CHECK(tc_store_create(host, (uint16_t)env_int("MASTER_PORT"), r == 0, 60.0, &store));
    tc_comm_options_t opts;
    CHECK(tc_comm_options_init(&opts));
    opts.timeout_seconds = 60.0;
    opts.abort_process_on_timeout_or_error = 0;
    tc_comm_t *comm = NULL;
    const tc_device_t cpu = {TC_DEVICE_CPU, 0};
    CHECK(tc_comm_create("ctran", cpu, "c_windows", store, r, n, &opts, &comm));

    int32_t win_buf[2 * N] = {0}, src[N];
    tc_window_t *win = NULL;
    CHECK(tc_window_create(comm, &win));
    CHECK(tc_window_register(win, tc_cpu_tensor(win_buf, 2 * N, TC_INT32)));
    size_t size = 0;
    CHECK(tc_window_get_size(win, &size));
    EXPECT(size == sizeof(win_buf), "window size %zu", size);
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    for (int it = 0; it < 200; it++) {
        int half = it % 2;
        for (int i = 0; i < N; i++) src[i] = it * 1000 + r;
        tc_work_t *w = NULL;
        CHECK(tc_window_put(win, tc_cpu_tensor(src, N, TC_INT32), next, (size_t)(half * N), NULL,
                            NULL, half ? &w : NULL));
        if (w) {
            CHECK(tc_work_wait(w, TC_WAIT_OP_TIMEOUT));
            CHECK(tc_work_free(w));
        }
        CHECK(tc_window_signal(win, next, NULL, NULL, NULL));
        CHECK(tc_window_wait_signal(win, prev, NULL, NULL, NULL));
        for (int i = 0; i < N; i++) {
            if (win_buf[half * N + i] != it * 1000 + prev) {
                EXPECT(0, "iteration %d: element %d is %d, want %d", it, i, win_buf[half * N + i],
                       it * 1000 + prev);
                break;
            }
        }
        /* Every second iteration the neighbours agree the checked halves may be rewritten. */
        if (half) {
            CHECK(tc_window_signal(win, prev, NULL, NULL, NULL));
            CHECK(tc_window_wait_signal(win, next, NULL, NULL, NULL));
        }
    }
    EXPECT(tc_window_put(win, tc_cpu_tensor(src, N, TC_INT32), next, N + 1, NULL, NULL, NULL) ==
               TC_ERR_INVALID_ARGUMENT,
           "a put past the end is refused: %s", tc_last_error());
    EXPECT(strstr(tc_last_error(), "target_offset_nelems") != NULL, "named: %s", tc_last_error());
    EXPECT(tc_window_signal(win, n + 2, NULL, NULL, NULL) == TC_ERR_INVALID_ARGUMENT,
           "a rank out of range is refused");
    int fake_stream;
    EXPECT(tc_window_signal(win, next, &fake_stream, NULL, NULL) == TC_ERR_INVALID_ARGUMENT &&
               strstr(tc_last_error(), "stream") != NULL,
           "a stream on a CPU communicator is refused: %s", tc_last_error());
    CHECK(tc_barrier(comm, NULL, NULL, NULL));
    CHECK(tc_window_deregister(win));
    EXPECT(tc_window_put(win, tc_cpu_tensor(src, N, TC_INT32), next, 0, NULL, NULL, NULL) ==
               TC_ERR_INVALID_ARGUMENT,
           "a put after deregistration is refused: %s", tc_last_error());
    CHECK(tc_window_destroy(win));

    CHECK(tc_comm_finalize(comm));
    CHECK(tc_comm_destroy(comm));
    CHECK(tc_store_destroy(store));
    if (g_failures) {
        fprintf(stderr, "rank %d: %d failed checks\n", r, g_failures);
        return 1;
    }
    printf("windows OK rank %d/%d\n", r, n);
    return 0;
}
