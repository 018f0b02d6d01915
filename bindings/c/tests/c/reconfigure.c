/*
 * Reconfiguration through the C API, over real ranks from the environment: every rank makes a
 * reconfigurer on one store and publishes its init handle; all form a communicator of every
 * handle in reverse order (ranks follow the list), check an all-reduce, then shrink to the
 * first n - 1 processes (the last one leaves) and check again; bad lists are clear errors.
 * Prints "reconfigure OK rank R/N".
 */
#include <stdint.h>

#include "check.h"

static int env_int(const char *name) {
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

static void check_sum(tc_comm_t *comm, const char *what) {
    int32_t rank = -1, size = -1;
    CHECK(tc_comm_rank(comm, &rank));
    CHECK(tc_comm_size(comm, &size));
    float v[4];
    for (int i = 0; i < 4; i++) v[i] = (float)(rank + 1);
    CHECK(tc_all_reduce(comm, tc_cpu_tensor(v, 4, TC_FLOAT32), TC_SUM, NULL, NULL, NULL));
    float want = (float)(size * (size + 1) / 2);
    EXPECT(v[0] == want && v[3] == want, "%s: sum %f, want %f", what, (double)v[0], (double)want);
}

int main(void) {
    int r = env_int("TORCHCOMM_RANK"), n = env_int("TORCHCOMM_SIZE");
    g_rank = r;
    tc_store_t *store = NULL;
    CHECK(tc_store_create(getenv("MASTER_ADDR"), (uint16_t)env_int("MASTER_PORT"), r == 0, 60.0,
                          &store));
    tc_comm_options_t opts;
    CHECK(tc_comm_options_init(&opts));
    opts.abort_process_on_timeout_or_error = 0;
    const tc_device_t cpu = {TC_DEVICE_CPU, 0};
    tc_reconfigurer_t *re = NULL;
    CHECK(tc_reconfigurer_create("ctran", cpu, "c_reconf", store, &opts, &re));
    const char *mine = NULL;
    CHECK(tc_reconfigurer_init_handle(re, &mine));
    char key[64];
    snprintf(key, sizeof key, "handle/%d", r);
    CHECK(tc_store_set(store, key, mine, strlen(mine)));
    char handles[16][256];
    const char *list[16];
    for (int q = 0; q < n; q++) {
        size_t len = 0;
        snprintf(key, sizeof key, "handle/%d", q);
        CHECK(tc_store_get(store, key, 60.0, handles[q], sizeof handles[q] - 1, &len));
        handles[q][len] = '\0';
        list[n - 1 - q] = handles[q];
    }

    /* Everyone, in reverse order. */
    tc_comm_t *comm = NULL;
    CHECK(tc_reconfigurer_reconfigure(re, 1, list, (size_t)n, 60.0, &comm));
    int32_t rank = -1;
    CHECK(tc_comm_rank(comm, &rank));
    EXPECT(rank == n - 1 - r, "rank %d after reversing, want %d", rank, n - 1 - r);
    check_sum(comm, "all");
    CHECK(tc_comm_finalize(comm));
    CHECK(tc_comm_destroy(comm));

    /* Bad lists: this process missing, a duplicate. */
    const char *other[1] = {"nobody"};
    tc_status_t s = tc_reconfigurer_reconfigure(re, 2, other, 1, 5.0, &comm);
    EXPECT(s == TC_ERR_INVALID_ARGUMENT && strstr(tc_last_error(), "init_handles") != NULL,
           "missing handle: %s", tc_last_error());
    EXPECT(comm == NULL, "no communicator on error");
    const char *twice[2] = {mine, mine};
    s = tc_reconfigurer_reconfigure(re, 2, twice, 2, 5.0, &comm);
    EXPECT(s == TC_ERR_INVALID_ARGUMENT && strstr(tc_last_error(), "positions 0 and 1") != NULL,
           "duplicate: %s", tc_last_error());

    /* Shrink: the last process leaves, the others go on. */
    if (n > 1 && r != n - 1) {
        for (int q = 0; q < n - 1; q++) list[q] = handles[q];
        CHECK(tc_reconfigurer_reconfigure(re, 3, list, (size_t)(n - 1), 60.0, &comm));
        check_sum(comm, "shrunk");
        int32_t size = -1;
        CHECK(tc_comm_size(comm, &size));
        EXPECT(size == n - 1, "size %d after the shrink", size);
        CHECK(tc_comm_finalize(comm));
        CHECK(tc_comm_destroy(comm));
    }
    CHECK(tc_reconfigurer_destroy(re));
    /* Rank 0 serves the store: it leaves last. */
    int64_t left = 0;
    CHECK(tc_store_add(store, "left", 1, &left));
    if (r == 0) {
        while (left < n) {
            CHECK(tc_store_add(store, "left", 0, &left));
        }
    }
    CHECK(tc_store_destroy(store));
    if (g_failures) return 1;
    printf("reconfigure OK rank %d/%d\n", r, n);
    return 0;
}
