/*
 * Error paths of the C API, over 2 real ranks from the environment (TORCHCOMM_RANK/SIZE,
 * MASTER_ADDR/MASTER_PORT): invalid handles (NULL), NULL buffers with a non-zero count,
 * unknown dtypes, ops and devices, ranks out of range, CUDA buffers and streams, bad options,
 * a wait that times out, and use after finalize. Each must return the right status and a
 * readable message naming the culprit, and the communicator must stay usable after argument
 * errors. Prints "errors OK rank R/N"; exits non-zero otherwise.
 */
#include <stdint.h>
#include <unistd.h>

#include "check.h"

static int g_checked = 0;

/* `status` must be `want`, with a last error that names `needle`. */
static void expect_error(const char *call, int line, tc_status_t status, tc_status_t want,
                         const char *needle) {
    const char *msg = tc_last_error();
    g_checked++;
    if (status != want) {
        g_failures++;
        fprintf(stderr, "rank %d: line %d: %s returned %s (%d), expected %s; message: %s\n",
                g_rank, line, call, tc_status_string(status), (int)status, tc_status_string(want),
                msg);
    } else if (msg == NULL || strlen(msg) < 16 || strstr(msg, needle) == NULL) {
        g_failures++;
        fprintf(stderr, "rank %d: line %d: %s: message \"%s\" does not name \"%s\"\n", g_rank,
                line, call, msg ? msg : "(null)", needle);
    } else if (g_rank == 0) {
        printf("  %-16s %s\n", tc_status_string(status), msg);
    }
}

#define EXPECT_ERROR(call, want, needle) expect_error(#call, __LINE__, (call), (want), (needle))

static tc_tensor_t T(void *p, size_t n, tc_dtype_t dtype) { return tc_cpu_tensor(p, n, dtype); }

static void before_any_communicator(void) {
    const tc_device_t cpu = {TC_DEVICE_CPU, 0};
    tc_comm_t *c = (tc_comm_t *)&c; /* not NULL: must be cleared on error */

    EXPECT_ERROR(tc_comm_create_from_env("ctran", cpu, "x", NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                 "`comm`");
    EXPECT_ERROR(tc_comm_create_from_env(NULL, cpu, "x", NULL, &c), TC_ERR_INVALID_ARGUMENT,
                 "`backend`");
    EXPECT(c == NULL, "the out-pointer is cleared on error");
    EXPECT_ERROR(tc_comm_create_from_env("no_such_backend", cpu, "x", NULL, &c),
                 TC_ERR_INVALID_ARGUMENT, "no_such_backend");
    tc_device_t bad = {7, 0};
    EXPECT_ERROR(tc_comm_create_from_env("ctran", bad, "x", NULL, &c), TC_ERR_INVALID_ARGUMENT,
                 "device");
    tc_device_t gpu = {TC_DEVICE_CUDA, 0};
    EXPECT_ERROR(tc_comm_create_from_env("ctran", gpu, "x", NULL, &c), TC_ERR_NOT_SUPPORTED,
                 "CUDA");
    EXPECT_ERROR(tc_comm_create("ctran", cpu, "x", NULL, 5, 2, NULL, &c), TC_ERR_INVALID_ARGUMENT,
                 "`rank`");
    EXPECT_ERROR(tc_comm_create("ctran", cpu, "x", NULL, -7, 2, NULL, &c),
                 TC_ERR_INVALID_ARGUMENT, "`rank`");
    EXPECT_ERROR(tc_comm_create("ctran", cpu, "x", NULL, 0, 0, NULL, &c), TC_ERR_INVALID_ARGUMENT,
                 "`size`");
    EXPECT_ERROR(tc_comm_create_from_env("ctran", cpu, "", NULL, &c), TC_ERR_INVALID_ARGUMENT,
                 "name");
    tc_comm_options_t o;
    CHECK(tc_comm_options_init(&o));
    o.timeout_seconds = -1.0;
    EXPECT_ERROR(tc_comm_create_from_env("ctran", cpu, "x", &o, &c), TC_ERR_INVALID_ARGUMENT,
                 "timeout_seconds");
    CHECK(tc_comm_options_init(&o));
    o.abort_process_on_timeout_or_error = 7;
    EXPECT_ERROR(tc_comm_create_from_env("ctran", cpu, "x", &o, &c), TC_ERR_INVALID_ARGUMENT,
                 "abort_process_on_timeout_or_error");
    CHECK(tc_comm_options_init(&o));
    o.num_hints = 2;
    EXPECT_ERROR(tc_comm_create_from_env("ctran", cpu, "x", &o, &c), TC_ERR_INVALID_ARGUMENT,
                 "options.hints");
    EXPECT(c == NULL, "no communicator after errors");

    EXPECT_ERROR(tc_version(NULL), TC_ERR_INVALID_ARGUMENT, "`version`");
    EXPECT_ERROR(tc_has_backend(NULL, NULL), TC_ERR_INVALID_ARGUMENT, "`name`");
    tc_store_t *s = NULL;
    EXPECT_ERROR(tc_store_create(NULL, 1234, false, 1.0, &s), TC_ERR_INVALID_ARGUMENT, "`host`");
    EXPECT_ERROR(tc_store_create("127.0.0.1", 0, false, 1.0, &s), TC_ERR_INVALID_ARGUMENT,
                 "`port`");
    EXPECT_ERROR(tc_store_set(NULL, "k", "v", 1), TC_ERR_INVALID_ARGUMENT, "`store`");
    EXPECT_ERROR(tc_store_port(NULL, NULL), TC_ERR_INVALID_ARGUMENT, "`store`");
    EXPECT_ERROR(tc_comm_options_init(NULL), TC_ERR_INVALID_ARGUMENT, "`options`");

    /* Status strings are distinct and never NULL. */
    const tc_status_t all[] = {TC_OK, TC_ERR_INVALID_ARGUMENT, TC_ERR_TIMEOUT,
                               TC_ERR_COMMUNICATION, TC_ERR_NOT_SUPPORTED, TC_ERR_INTERNAL};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        for (size_t j = 0; j < i; j++)
            EXPECT(strcmp(tc_status_string(all[i]), tc_status_string(all[j])) != 0,
                   "distinct strings for %d and %d", (int)all[i], (int)all[j]);
    EXPECT(strcmp(tc_status_string(12345), "unknown status") == 0, "unknown status string");

    /* Releasing NULL is a no-op. */
    CHECK(tc_comm_destroy(NULL));
    CHECK(tc_work_free(NULL));
    CHECK(tc_store_destroy(NULL));
    EXPECT(strcmp(tc_last_error(), "") == 0, "last error cleared by a success");
}

static void argument_errors(tc_comm_t *comm, int rank, int size) {
    float buf[4] = {0};
    tc_tensor_t t = T(buf, 4, TC_FLOAT32);
    tc_work_t *w = (tc_work_t *)&w; /* not NULL: must be cleared on error */

    /* Invalid handles. */
    EXPECT_ERROR(tc_all_reduce(NULL, t, TC_SUM, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                 "`comm`");
    EXPECT_ERROR(tc_barrier(NULL, NULL, NULL, &w), TC_ERR_INVALID_ARGUMENT, "`comm`");
    EXPECT(w == NULL, "work cleared on error");
    EXPECT_ERROR(tc_comm_rank(NULL, NULL), TC_ERR_INVALID_ARGUMENT, "`comm`");
    EXPECT_ERROR(tc_comm_rank(comm, NULL), TC_ERR_INVALID_ARGUMENT, "`rank`");
    EXPECT_ERROR(tc_comm_finalize(NULL), TC_ERR_INVALID_ARGUMENT, "`comm`");
    EXPECT_ERROR(tc_work_wait(NULL, 1.0), TC_ERR_INVALID_ARGUMENT, "`work`");
    bool done = false;
    EXPECT_ERROR(tc_work_test(NULL, &done), TC_ERR_INVALID_ARGUMENT, "`work`");
    EXPECT_ERROR(tc_work_status(NULL, NULL), TC_ERR_INVALID_ARGUMENT, "`work`");

    /* NULL buffers with a non-zero count. */
    EXPECT_ERROR(tc_all_reduce(comm, T(NULL, 4, TC_FLOAT32), TC_SUM, NULL, NULL, NULL),
                 TC_ERR_INVALID_ARGUMENT, "tensor.data");
    EXPECT_ERROR(tc_broadcast(comm, T(NULL, 1, TC_INT32), 0, NULL, NULL, &w),
                 TC_ERR_INVALID_ARGUMENT, "tensor.data");
    EXPECT(w == NULL, "no work on error");
    tc_tensor_t outs[2] = {t, T(NULL, 4, TC_FLOAT32)};
    EXPECT_ERROR(tc_all_gather(comm, outs, 2, t, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                 "tensor_list[1].data");
    EXPECT_ERROR(tc_all_gather(comm, NULL, 2, t, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                 "`tensor_list`");
    EXPECT_ERROR(tc_all_to_all_v_single(comm, t, t, NULL, 2, NULL, 2, NULL, NULL, NULL),
                 TC_ERR_INVALID_ARGUMENT, "output_split_sizes");

    /* Unknown dtype, reduce op and device. */
    EXPECT_ERROR(tc_all_reduce(comm, T(buf, 4, 42), TC_SUM, NULL, NULL, NULL),
                 TC_ERR_INVALID_ARGUMENT, "42");
    EXPECT_ERROR(tc_all_reduce(comm, T(buf, 4, -1), TC_SUM, NULL, NULL, NULL),
                 TC_ERR_INVALID_ARGUMENT, "tensor.dtype");
    EXPECT_ERROR(tc_all_reduce(comm, t, 99, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "`op`");
    EXPECT_ERROR(tc_all_reduce(comm, t, TC_BXOR, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                 "bxor");
    tc_tensor_t odd = t;
    odd.device.device_type = 3;
    EXPECT_ERROR(tc_all_reduce(comm, odd, TC_SUM, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                 "tensor.device");

    /* Ranks out of range. */
    EXPECT_ERROR(tc_broadcast(comm, t, size, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "root");
    EXPECT_ERROR(tc_broadcast(comm, t, -1, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "root");
    EXPECT_ERROR(tc_reduce(comm, t, 99, TC_SUM, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                 "root");
    EXPECT_ERROR(tc_scatter(comm, t, NULL, 0, size + 1, NULL, NULL, NULL),
                 TC_ERR_INVALID_ARGUMENT, "root");
    EXPECT_ERROR(tc_send(comm, t, 7, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "dst");
    EXPECT_ERROR(tc_send(comm, t, rank, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "dst");
    EXPECT_ERROR(tc_recv(comm, t, -3, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "src");
    tc_p2p_op_t ops[1] = {{TC_P2P_SEND, size, t}};
    EXPECT_ERROR(tc_batch_p2p(comm, ops, 1, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                 "ops[0].peer");
    ops[0].peer = (rank + 1) % size;
    ops[0].kind = 5;
    EXPECT_ERROR(tc_batch_p2p(comm, ops, 1, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                 "ops[0].kind");
    EXPECT_ERROR(tc_batch_p2p(comm, NULL, 0, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "ops");
    int32_t bad_ranks[2] = {0, 9};
    tc_comm_t *child = NULL;
    EXPECT_ERROR(tc_comm_split(comm, bad_ranks, 2, "bad", NULL, &child), TC_ERR_INVALID_ARGUMENT,
                 "ranks");
    EXPECT(child == NULL, "no child on error");

    /* Mismatched sizes. */
    EXPECT_ERROR(tc_all_gather(comm, outs, 1, t, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                 "tensor_list");
    EXPECT_ERROR(tc_all_gather_single(comm, t, t, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                 "output");

    /* CUDA buffers and streams. */
    tc_tensor_t gpu = t;
    gpu.device.device_type = TC_DEVICE_CUDA;
    EXPECT_ERROR(tc_all_reduce(comm, gpu, TC_SUM, NULL, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                 "communicator's device");
    int fake_stream;
    EXPECT_ERROR(tc_all_reduce(comm, t, TC_SUM, &fake_stream, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                 "stream");
    EXPECT_ERROR(tc_barrier(comm, &fake_stream, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "stream");

    /* Bad options. */
    tc_op_options_t o;
    CHECK(tc_op_options_init(&o));
    o.timeout_seconds = -5.0;
    EXPECT_ERROR(tc_all_reduce(comm, t, TC_SUM, NULL, &o, NULL), TC_ERR_INVALID_ARGUMENT,
                 "timeout_seconds");
    CHECK(tc_op_options_init(&o));
    tc_hint_t hint = {NULL, "v"};
    o.hints = &hint;
    o.num_hints = 1;
    EXPECT_ERROR(tc_all_reduce(comm, t, TC_SUM, NULL, &o, NULL), TC_ERR_INVALID_ARGUMENT,
                 "hints[0].key");
}

/* A wait shorter than the operation: TC_ERR_TIMEOUT, and the work goes on. */
static void wait_timeout(tc_comm_t *comm, int rank) {
    int64_t v = rank == 1 ? 4242 : 0;
    CHECK(tc_barrier(comm, NULL, NULL, NULL));
    if (rank == 0) {
        tc_work_t *w = NULL;
        CHECK(tc_recv(comm, T(&v, 1, TC_INT64), 1, NULL, NULL, &w));
        EXPECT_ERROR(tc_work_wait(w, 0.2), TC_ERR_TIMEOUT, "did not complete");
        bool done = true;
        CHECK(tc_work_test(w, &done));
        EXPECT(!done, "the receive is still pending");
        CHECK(tc_work_wait(w, TC_WAIT_OP_TIMEOUT));
        CHECK(tc_work_free(w));
        EXPECT(v == 4242, "received %lld", (long long)v);
    } else if (rank == 1) {
        sleep(2);
        CHECK(tc_send(comm, T(&v, 1, TC_INT64), 0, NULL, NULL, NULL));
    }
}

int main(void) {
    const tc_device_t cpu = {TC_DEVICE_CPU, 0};
    g_rank = atoi(getenv("TORCHCOMM_RANK") ? getenv("TORCHCOMM_RANK") : "-1");
    if (g_rank == 0) printf("errors and their messages:\n");
    before_any_communicator();

    tc_comm_options_t opts;
    CHECK(tc_comm_options_init(&opts));
    opts.timeout_seconds = 30.0;
    opts.abort_process_on_timeout_or_error = 0;
    tc_comm_t *comm = NULL;
    CHECK(tc_comm_create_from_env("ctran", cpu, "c_errors", &opts, &comm));
    int32_t rank = -1, size = 0;
    CHECK(tc_comm_rank(comm, &rank));
    CHECK(tc_comm_size(comm, &size));
    if (size < 2) {
        fprintf(stderr, "run with at least 2 ranks\n");
        return 2;
    }
    argument_errors(comm, rank, size);

    /* Argument errors leave the communicator usable. */
    float x = (float)rank;
    CHECK(tc_all_reduce(comm, T(&x, 1, TC_FLOAT32), TC_SUM, NULL, NULL, NULL));
    EXPECT(x == (float)(size * (size - 1) / 2), "sum after errors = %g", x);

    wait_timeout(comm, rank);

    /* After abort, operations fail as communication errors. */
    int32_t all[2] = {0, 1};
    tc_comm_t *child = NULL;
    CHECK(tc_comm_split(comm, all, 2, "to_abort", &opts, &child));
    CHECK(tc_comm_abort(child));
    EXPECT_ERROR(tc_all_reduce(child, T(&x, 1, TC_FLOAT32), TC_SUM, NULL, NULL, NULL),
                 TC_ERR_COMMUNICATION, "`to_abort`");
    CHECK(tc_comm_destroy(child));

    /* After finalize, operations fail as communication errors. */
    CHECK(tc_comm_finalize(comm));
    EXPECT_ERROR(tc_all_reduce(comm, T(&x, 1, TC_FLOAT32), TC_SUM, NULL, NULL, NULL),
                 TC_ERR_COMMUNICATION, "finalize");
    CHECK(tc_comm_finalize(comm));
    CHECK(tc_comm_destroy(comm));

    if (g_failures) {
        fprintf(stderr, "rank %d: %d of %d error checks failed\n", rank, g_failures, g_checked);
        return 1;
    }
    printf("errors OK rank %d/%d (%d error paths)\n", rank, size, g_checked);
    return 0;
}
