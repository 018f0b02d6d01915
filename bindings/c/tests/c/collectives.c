/*
 * Every operation of the C API over real ranks (processes), bootstrapped through a store the
 * program creates itself: rank 0 serves it on MASTER_PORT, the others connect; rank and size
 * (TORCHCOMM_RANK / TORCHCOMM_SIZE) are passed to tc_comm_create explicitly. Checks every
 * result; exits non-zero on any error or wrong value and prints "collectives OK rank R/N".
 */
#include <stdint.h>
#include <time.h>

#include "check.h"

static int env_int(const char *name) {
    const char *v = getenv(name);
    if (v == NULL) {
        fprintf(stderr, "%s is not set\n", name);
        exit(2);
    }
    return atoi(v);
}

static tc_tensor_t T(void *p, size_t n, tc_dtype_t dtype) { return tc_cpu_tensor(p, n, dtype); }

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { M = 5, MAXR = 16 };

static void all_reduce_tests(tc_comm_t *comm, int r, int n) {
    enum { N = 1031 };
    static float f[N];
    for (int i = 0; i < N; i++) f[i] = (float)(r + i);
    CHECK(tc_all_reduce(comm, T(f, N, TC_FLOAT32), TC_SUM, NULL, NULL, NULL));
    for (int i = 0; i < N; i++)
        EXPECT(f[i] == (float)(n * i + n * (n - 1) / 2), "sum f[%d] = %g", i, f[i]);

    double d = r;
    CHECK(tc_all_reduce(comm, T(&d, 1, TC_FLOAT64), TC_AVG, NULL, NULL, NULL));
    EXPECT(d == (n - 1) / 2.0, "avg = %g", d);

    tc_op_options_t o;
    CHECK(tc_op_options_init(&o));
    tc_hint_t hint = {"c_test_hint", "ignored"};
    o.premul_sum_factor = 2.0;
    o.timeout_seconds = 30.0;
    o.hints = &hint;
    o.num_hints = 1;
    float p = (float)(r + 1);
    CHECK(tc_all_reduce(comm, T(&p, 1, TC_FLOAT32), TC_PREMUL_SUM, NULL, &o, NULL));
    EXPECT(p == (float)(n * (n + 1)), "premul_sum = %g", p);

    int32_t b[3] = {~(1 << r), -1, 0x0F0F};
    CHECK(tc_all_reduce(comm, T(b, 3, TC_INT32), TC_BAND, NULL, NULL, NULL));
    EXPECT(b[0] == ~((1 << n) - 1), "band = %#x", (unsigned)b[0]);
    EXPECT(b[1] == -1 && b[2] == 0x0F0F, "band = %d %d", b[1], b[2]);

    uint8_t u = (uint8_t)(3 * r);
    CHECK(tc_all_reduce(comm, T(&u, 1, TC_UINT8), TC_MAX, NULL, NULL, NULL));
    EXPECT(u == 3 * (n - 1), "max u8 = %d", u);

    bool flag = r == n - 1;
    CHECK(tc_all_reduce(comm, T(&flag, 1, TC_BOOL), TC_BOR, NULL, NULL, NULL));
    EXPECT(flag, "bor = %d", flag);

    int64_t prod = 2;
    CHECK(tc_all_reduce(comm, T(&prod, 1, TC_INT64), TC_PRODUCT, NULL, NULL, NULL));
    EXPECT(prod == (int64_t)1 << n, "product = %lld", (long long)prod);

    /* An empty buffer may be NULL. */
    CHECK(tc_all_reduce(comm, T(NULL, 0, TC_FLOAT32), TC_SUM, NULL, NULL, NULL));
}

static void rooted_tests(tc_comm_t *comm, int r, int n) {
    int64_t x[M];
    for (int i = 0; i < M; i++) x[i] = r * 10 + i;
    CHECK(tc_reduce(comm, T(x, M, TC_INT64), n - 1, TC_SUM, NULL, NULL, NULL));
    for (int i = 0; i < M; i++) {
        int64_t want = r == n - 1 ? 10 * n * (n - 1) / 2 + n * i : r * 10 + i;
        EXPECT(x[i] == want, "reduce x[%d] = %lld", i, (long long)x[i]);
    }

    float y[M];
    int root = 1 % n;
    for (int i = 0; i < M; i++) y[i] = r == root ? 7.5f + (float)i : -1.0f;
    CHECK(tc_broadcast(comm, T(y, M, TC_FLOAT32), root, NULL, NULL, NULL));
    for (int i = 0; i < M; i++) EXPECT(y[i] == 7.5f + (float)i, "broadcast y[%d] = %g", i, y[i]);

    /* Scatter from rank 0; other ranks pass no inputs. */
    static int32_t sc_in[MAXR][M];
    static tc_tensor_t ins[MAXR];
    for (int q = 0; q < n; q++) {
        for (int i = 0; i < M; i++) sc_in[q][i] = q * 10 + i;
        ins[q] = T(sc_in[q], M, TC_INT32);
    }
    int32_t sout[M] = {0};
    CHECK(tc_scatter(comm, T(sout, M, TC_INT32), r == 0 ? ins : NULL, r == 0 ? (size_t)n : 0, 0,
                     NULL, NULL, NULL));
    for (int i = 0; i < M; i++) EXPECT(sout[i] == r * 10 + i, "scatter [%d] = %d", i, sout[i]);

    /* Gather onto the last rank, as a list and as one buffer. */
    static int32_t gout[MAXR][M];
    static tc_tensor_t outs[MAXR];
    for (int q = 0; q < n; q++) outs[q] = T(gout[q], M, TC_INT32);
    int32_t gin[M];
    for (int i = 0; i < M; i++) gin[i] = r * 10 + i;
    CHECK(tc_gather(comm, r == n - 1 ? outs : NULL, r == n - 1 ? (size_t)n : 0,
                    T(gin, M, TC_INT32), n - 1, NULL, NULL, NULL));
    if (r == n - 1)
        for (int q = 0; q < n; q++)
            for (int i = 0; i < M; i++)
                EXPECT(gout[q][i] == q * 10 + i, "gather [%d][%d] = %d", q, i, gout[q][i]);

    static int32_t gsingle[MAXR * M];
    tc_tensor_t gs = r == 0 ? T(gsingle, (size_t)n * M, TC_INT32) : T(NULL, 0, TC_INT32);
    CHECK(tc_gather_single(comm, gs, T(gin, M, TC_INT32), 0, NULL, NULL, NULL));
    if (r == 0)
        for (int k = 0; k < n * M; k++)
            EXPECT(gsingle[k] == (k / M) * 10 + k % M, "gather_single [%d] = %d", k, gsingle[k]);
}

static void gather_scatter_tests(tc_comm_t *comm, int r, int n) {
    static int32_t lists[MAXR][MAXR * M];
    static tc_tensor_t outs[MAXR];
    int32_t in[M];
    for (int i = 0; i < M; i++) in[i] = r * 100 + i;

    /* all_gather into a list, and into one buffer */
    for (int q = 0; q < n; q++) outs[q] = T(lists[q], M, TC_INT32);
    CHECK(tc_all_gather(comm, outs, (size_t)n, T(in, M, TC_INT32), NULL, NULL, NULL));
    for (int q = 0; q < n; q++)
        for (int i = 0; i < M; i++)
            EXPECT(lists[q][i] == q * 100 + i, "all_gather [%d][%d] = %d", q, i, lists[q][i]);
    static int32_t single[MAXR * M];
    CHECK(tc_all_gather_single(comm, T(single, (size_t)n * M, TC_INT32), T(in, M, TC_INT32), NULL,
                               NULL, NULL));
    for (int k = 0; k < n * M; k++)
        EXPECT(single[k] == (k / M) * 100 + k % M, "all_gather_single [%d] = %d", k, single[k]);

    /* Persistent all-gather: the output is bound once and filled by every execution. */
    static int32_t persistent[MAXR * M];
    tc_all_gather_p_t *agp = NULL;
    CHECK(tc_all_gather_p_init(comm, T(persistent, (size_t)n * M, TC_INT32), &agp));
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < M; i++) in[i] = round * 1000 + r * 100 + i;
        CHECK(tc_all_gather_p_exec(comm, agp, T(in, M, TC_INT32), NULL, NULL, NULL));
        for (int k = 0; k < n * M; k++)
            EXPECT(persistent[k] == round * 1000 + (k / M) * 100 + k % M,
                   "all_gather_p_exec round %d [%d] = %d", round, k, persistent[k]);
    }
    CHECK(tc_all_gather_p_free(agp));
    for (int i = 0; i < M; i++) in[i] = r * 100 + i;

    /* all_gather_v: rank q contributes q + 1 elements, all equal to q. */
    int32_t vin[MAXR];
    for (int i = 0; i <= r; i++) vin[i] = r;
    for (int q = 0; q < n; q++) outs[q] = T(lists[q], (size_t)q + 1, TC_INT32);
    CHECK(tc_all_gather_v(comm, outs, (size_t)n, T(vin, (size_t)r + 1, TC_INT32), NULL, NULL,
                          NULL));
    for (int q = 0; q < n; q++)
        for (int i = 0; i <= q; i++)
            EXPECT(lists[q][i] == q, "all_gather_v [%d][%d] = %d", q, i, lists[q][i]);

    /* reduce_scatter: block q of every rank is reduced into rank q's output. */
    static tc_tensor_t ins[MAXR];
    for (int q = 0; q < n; q++) {
        for (int i = 0; i < M; i++) lists[q][i] = r + q * 10 + i;
        ins[q] = T(lists[q], M, TC_INT32);
    }
    int32_t out[M];
    CHECK(tc_reduce_scatter(comm, T(out, M, TC_INT32), ins, (size_t)n, TC_SUM, NULL, NULL, NULL));
    for (int i = 0; i < M; i++)
        EXPECT(out[i] == n * (n - 1) / 2 + n * (r * 10 + i), "reduce_scatter [%d] = %d", i, out[i]);

    for (int k = 0; k < n * M; k++) single[k] = r + (k / M) * 10 + k % M;
    CHECK(tc_reduce_scatter_single(comm, T(out, M, TC_INT32), T(single, (size_t)n * M, TC_INT32),
                                   TC_SUM, NULL, NULL, NULL));
    for (int i = 0; i < M; i++)
        EXPECT(out[i] == n * (n - 1) / 2 + n * (r * 10 + i), "reduce_scatter_single [%d] = %d", i,
               out[i]);

    /* reduce_scatter_v: block q has q + 1 ones. */
    for (int q = 0; q < n; q++) {
        for (int i = 0; i <= q; i++) lists[q][i] = 1;
        ins[q] = T(lists[q], (size_t)q + 1, TC_INT32);
    }
    int32_t vout[MAXR];
    CHECK(tc_reduce_scatter_v(comm, T(vout, (size_t)r + 1, TC_INT32), ins, (size_t)n, TC_SUM, NULL,
                              NULL, NULL));
    for (int i = 0; i <= r; i++) EXPECT(vout[i] == n, "reduce_scatter_v [%d] = %d", i, vout[i]);
}

static void all_to_all_tests(tc_comm_t *comm, int r, int n) {
    static int32_t in[MAXR][M], out[MAXR][M];
    static tc_tensor_t ins[MAXR], outs[MAXR];
    for (int q = 0; q < n; q++) {
        for (int i = 0; i < M; i++) in[q][i] = r * 1000 + q * 10 + i;
        ins[q] = T(in[q], M, TC_INT32);
        outs[q] = T(out[q], M, TC_INT32);
    }
    CHECK(tc_all_to_all(comm, outs, (size_t)n, ins, (size_t)n, NULL, NULL, NULL));
    for (int q = 0; q < n; q++)
        for (int i = 0; i < M; i++)
            EXPECT(out[q][i] == q * 1000 + r * 10 + i, "all_to_all [%d][%d] = %d", q, i, out[q][i]);

    /* The same as flat buffers ([q][i] is element q * M + i). */
    memset(out, 0, sizeof out);
    CHECK(tc_all_to_all_single(comm, T(out, (size_t)n * M, TC_INT32), T(in, (size_t)n * M, TC_INT32),
                               NULL, NULL, NULL));
    for (int q = 0; q < n; q++)
        for (int i = 0; i < M; i++)
            EXPECT(out[q][i] == q * 1000 + r * 10 + i, "all_to_all_single [%d][%d] = %d", q, i,
                   out[q][i]);

    /* all_to_all_v_single: q + 1 elements go to rank q; r + 1 arrive from each rank. */
    static int64_t vin[MAXR * MAXR], vout[MAXR * MAXR];
    size_t in_splits[MAXR], out_splits[MAXR];
    size_t off = 0;
    for (int q = 0; q < n; q++) {
        in_splits[q] = (size_t)q + 1;
        out_splits[q] = (size_t)r + 1;
        for (int i = 0; i <= q; i++) vin[off++] = r * 1000 + q * 10 + i;
    }
    CHECK(tc_all_to_all_v_single(comm, T(vout, (size_t)n * (r + 1), TC_INT64), T(vin, off, TC_INT64),
                                 out_splits, (size_t)n, in_splits, (size_t)n, NULL, NULL, NULL));
    for (int p = 0; p < n; p++)
        for (int i = 0; i <= r; i++) {
            int64_t got = vout[p * (r + 1) + i];
            EXPECT(got == p * 1000 + r * 10 + i, "all_to_all_v_single [%d][%d] = %lld", p, i,
                   (long long)got);
        }

    /* device_alltoallv_single: the same blocks, counts in int64 buffers read when it runs;
       the output holds every rank's largest block (room to spare) and the received counts
       come back in recv_counts. */
    static int64_t dout[MAXR * MAXR];
    int64_t send_counts[MAXR], recv_counts[MAXR];
    for (int q = 0; q < n; q++) {
        send_counts[q] = q + 1;
        recv_counts[q] = -1;
    }
    CHECK(tc_device_alltoallv_single(comm, T(dout, (size_t)n * n, TC_INT64), T(vin, off, TC_INT64),
                                     T(recv_counts, (size_t)n, TC_INT64),
                                     T(send_counts, (size_t)n, TC_INT64), NULL, NULL, NULL));
    for (int p = 0; p < n; p++) {
        EXPECT(recv_counts[p] == r + 1, "device_alltoallv_single count from %d = %lld", p,
               (long long)recv_counts[p]);
        for (int i = 0; i <= r; i++) {
            int64_t got = dout[p * (r + 1) + i];
            EXPECT(got == p * 1000 + r * 10 + i, "device_alltoallv_single [%d][%d] = %lld", p, i,
                   (long long)got);
        }
    }
}

static void p2p_tests(tc_comm_t *comm, int r, int n) {
    if (n < 2) return;
    double v[M];
    if (r == 0) {
        for (int i = 0; i < M; i++) v[i] = 0.25 * i;
        CHECK(tc_send(comm, T(v, M, TC_FLOAT64), 1, NULL, NULL, NULL));
    } else if (r == 1) {
        CHECK(tc_recv(comm, T(v, M, TC_FLOAT64), 0, NULL, NULL, NULL));
        for (int i = 0; i < M; i++) EXPECT(v[i] == 0.25 * i, "recv [%d] = %g", i, v[i]);
    }

    /* A ring shift in one batch. */
    int32_t send[M], recv[M];
    for (int i = 0; i < M; i++) send[i] = r * 10 + i;
    tc_p2p_op_t ops[2] = {
        {TC_P2P_SEND, (r + 1) % n, T(send, M, TC_INT32)},
        {TC_P2P_RECV, (r + n - 1) % n, T(recv, M, TC_INT32)},
    };
    tc_work_t *w = NULL;
    CHECK(tc_batch_p2p(comm, ops, 2, NULL, NULL, &w));
    CHECK(tc_work_wait(w, TC_WAIT_OP_TIMEOUT));
    CHECK(tc_work_free(w));
    for (int i = 0; i < M; i++)
        EXPECT(recv[i] == ((r + n - 1) % n) * 10 + i, "ring recv [%d] = %d", i, recv[i]);
}

static void async_tests(tc_comm_t *comm, int r, int n) {
    /* Several operations in flight, waited in reverse order. */
    enum { K = 4, L = 257 };
    static float bufs[K][L];
    tc_work_t *works[K];
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < L; i++) bufs[k][i] = (float)(k + r);
        CHECK(tc_all_reduce(comm, T(bufs[k], L, TC_FLOAT32), TC_MAX, NULL, NULL, &works[k]));
        EXPECT(works[k] != NULL, "a work handle for async op %d", k);
    }
    for (int k = K - 1; k >= 0; k--) {
        CHECK(tc_work_wait(works[k], 60.0));
        tc_work_status_t st = -1;
        CHECK(tc_work_status(works[k], &st));
        EXPECT(st == TC_WORK_COMPLETED, "work %d status %d", k, st);
        CHECK(tc_work_free(works[k]));
        for (int i = 0; i < L; i++)
            EXPECT(bufs[k][i] == (float)(k + n - 1), "async max [%d][%d] = %g", k, i, bufs[k][i]);
    }

    /* Polling with test. */
    tc_work_t *w = NULL;
    CHECK(tc_barrier(comm, NULL, NULL, &w));
    bool done = false;
    double deadline = now() + 60.0;
    while (!done && now() < deadline) CHECK(tc_work_test(w, &done));
    EXPECT(done, "barrier completed within 60 s of polling");
    CHECK(tc_work_free(w));
}

static void split_tests(tc_comm_t *comm, int r, int n) {
    /* Evens and odds. */
    int32_t half[MAXR];
    size_t k = 0;
    for (int q = r % 2; q < n; q += 2) half[k++] = q;
    tc_comm_t *sub = NULL;
    CHECK(tc_comm_split(comm, half, k, r % 2 ? "odds" : "evens", NULL, &sub));
    EXPECT(sub != NULL, "a child communicator");
    if (sub == NULL) return;
    int32_t sr = -1, sn = -1;
    CHECK(tc_comm_rank(sub, &sr));
    CHECK(tc_comm_size(sub, &sn));
    EXPECT(sr == r / 2 && sn == (int)k, "child rank %d of %d", sr, sn);
    const char *name = NULL;
    CHECK(tc_comm_name(sub, &name));
    EXPECT(strcmp(name, r % 2 ? "odds" : "evens") == 0, "child name %s", name);
    int64_t x = r;
    CHECK(tc_all_reduce(sub, T(&x, 1, TC_INT64), TC_SUM, NULL, NULL, NULL));
    int64_t want = 0;
    for (size_t i = 0; i < k; i++) want += half[i];
    EXPECT(x == want, "child sum %lld, expected %lld", (long long)x, (long long)want);
    CHECK(tc_comm_finalize(sub));
    CHECK(tc_comm_destroy(sub));

    /* Odd ranks stay out: they pass no ranks and get no communicator. */
    k = 0;
    if (r % 2 == 0)
        for (int q = 0; q < n; q += 2) half[k++] = q;
    sub = NULL;
    CHECK(tc_comm_split(comm, half, k, "evens_only", NULL, &sub));
    EXPECT((sub != NULL) == (r % 2 == 0), "child only on even ranks (got %p)", (void *)sub);
    if (sub != NULL) {
        CHECK(tc_barrier(sub, NULL, NULL, NULL));
        CHECK(tc_comm_finalize(sub));
        CHECK(tc_comm_destroy(sub));
    }
}

static void store_tests(tc_store_t *store, tc_comm_t *comm, int r, int n) {
    char key[32], value[32];
    snprintf(key, sizeof key, "c_test/rank%d", r);
    snprintf(value, sizeof value, "hello from %d", r);
    CHECK(tc_store_set(store, key, value, strlen(value)));
    int64_t count = 0;
    CHECK(tc_store_add(store, "c_test/count", 1, &count));
    EXPECT(count >= 1 && count <= n, "count %lld", (long long)count);
    CHECK(tc_barrier(comm, NULL, NULL, NULL));

    int peer = (r + 1) % n;
    snprintf(key, sizeof key, "c_test/rank%d", peer);
    char got[64] = {0};
    size_t len = 0;
    CHECK(tc_store_get(store, key, 30.0, got, sizeof got - 1, &len));
    snprintf(value, sizeof value, "hello from %d", peer);
    EXPECT(len == strlen(value) && memcmp(got, value, len) == 0, "store value '%s'", got);
    /* A buffer too small: an error, and the length needed. */
    tc_status_t s = tc_store_get(store, key, 30.0, got, 2, &len);
    EXPECT(s == TC_ERR_INVALID_ARGUMENT && len == strlen(value), "short buffer: %d, len %zu", s,
           len);
    CHECK(tc_store_add(store, "c_test/count", 0, &count));
    EXPECT(count == n, "final count %lld", (long long)count);
    uint16_t port = 0;
    CHECK(tc_store_port(store, &port));
    EXPECT(port == (uint16_t)env_int("MASTER_PORT"), "store port %u", (unsigned)port);
}

static void query_tests(tc_comm_t *comm, int r, int n) {
    const char *s = NULL;
    CHECK(tc_version(&s));
    int32_t ma = -1, mi = -1, pa = -1;
    CHECK(tc_version_numbers(&ma, &mi, &pa));
    EXPECT(ma == TC_VERSION_MAJOR && mi == TC_VERSION_MINOR && pa == TC_VERSION_PATCH,
           "version %d.%d.%d vs header", ma, mi, pa);
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", ma, mi, pa);
    EXPECT(strcmp(s, v) == 0, "version string %s", s);
    CHECK(tc_backends(&s));
    EXPECT(strstr(s, "ctran") != NULL, "backends %s", s);
    CHECK(tc_transports(&s));
    EXPECT(strstr(s, "socket") != NULL, "transports %s", s);
    bool has = false;
    CHECK(tc_has_backend("ctran", &has));
    EXPECT(has, "has ctran");
    CHECK(tc_has_backend("no_such_backend", &has));
    EXPECT(!has, "no such backend");
    CHECK(tc_has_transport("socket", &has));
    EXPECT(has, "has socket");
    CHECK(tc_has_transport("shm", &has));
    EXPECT(has, "has shm");
    CHECK(tc_has_transport("carrier_pigeon", &has));
    EXPECT(!has, "no such transport");

    int32_t cr = -1, cn = -1;
    CHECK(tc_comm_rank(comm, &cr));
    CHECK(tc_comm_size(comm, &cn));
    EXPECT(cr == r && cn == n, "rank %d size %d", cr, cn);
    CHECK(tc_comm_name(comm, &s));
    EXPECT(strcmp(s, "c_collectives") == 0, "name %s", s);
    CHECK(tc_comm_backend(comm, &s));
    EXPECT(strcmp(s, "ctran") == 0, "backend %s", s);
    CHECK(tc_comm_backend_version(comm, &s));
    EXPECT(strstr(s, "ctran") != NULL, "backend version %s", s);
    tc_device_t dev = {-1, -1};
    CHECK(tc_comm_device(comm, &dev));
    EXPECT(dev.device_type == TC_DEVICE_CPU, "device type %d", dev.device_type);
    EXPECT(strcmp(tc_last_error(), "") == 0, "no error after success: %s", tc_last_error());
}

/* tc_dump_trace writes this rank's colltrace where asked, and names a directory it cannot
 * write. */
static void trace_dump_tests(tc_comm_t *comm, int r, int n) {
    (void)comm;
    (void)n;
    char dir[256], file[320];
    snprintf(dir, sizeof dir, "/tmp/tc_c_trace_%s", getenv("MASTER_PORT"));
    snprintf(file, sizeof file, "%s/colltrace_rank%d.json", dir, r);
    CHECK(tc_dump_trace(dir));
    FILE *f = fopen(file, "rb");
    EXPECT(f != NULL, "no dump at %s", file);
    if (f) {
        static char text[1 << 20];
        size_t len = fread(text, 1, sizeof text - 1, f);
        text[len] = 0;
        fclose(f);
        EXPECT(strstr(text, "torchcomms-colltrace") != NULL, "not a colltrace dump: %s", file);
        EXPECT(strstr(text, "\"c_collectives\"") != NULL, "comm missing from %s", file);
        EXPECT(strstr(text, "\"all_reduce\"") != NULL, "all_reduce missing from %s", file);
        EXPECT(strstr(text, "tc_dump_trace") != NULL, "reason missing from %s", file);
        remove(file);
    }
    tc_status_t s = tc_dump_trace("/proc/self/no/such/dir");
    EXPECT(s == TC_ERR_INVALID_ARGUMENT, "unwritable dir: status %d", s);
    EXPECT(strstr(tc_last_error(), "/proc/self/no/such/dir") != NULL, "error names the dir: %s",
           tc_last_error());
}

int main(void) {
    int r = env_int("TORCHCOMM_RANK"), n = env_int("TORCHCOMM_SIZE");
    g_rank = r;
    if (n > MAXR) {
        fprintf(stderr, "at most %d ranks\n", MAXR);
        return 2;
    }
    const char *host = getenv("MASTER_ADDR");
    tc_store_t *store = NULL;
    CHECK(tc_store_create(host, (uint16_t)env_int("MASTER_PORT"), r == 0, 60.0, &store));

    tc_comm_options_t opts;
    CHECK(tc_comm_options_init(&opts));
    opts.timeout_seconds = 60.0;
    opts.abort_process_on_timeout_or_error = 0;
    tc_hint_t hint = {"c_test_comm_hint", "1"};
    opts.hints = &hint;
    opts.num_hints = 1;
    tc_comm_t *comm = NULL;
    const tc_device_t cpu = {TC_DEVICE_CPU, 0};
    CHECK(tc_comm_create("ctran", cpu, "c_collectives", store, r, n, &opts, &comm));

    query_tests(comm, r, n);
    all_reduce_tests(comm, r, n);
    rooted_tests(comm, r, n);
    gather_scatter_tests(comm, r, n);
    all_to_all_tests(comm, r, n);
    p2p_tests(comm, r, n);
    async_tests(comm, r, n);
    split_tests(comm, r, n);
    store_tests(store, comm, r, n);
    trace_dump_tests(comm, r, n);

    CHECK(tc_comm_finalize(comm));
    CHECK(tc_comm_finalize(comm)); /* twice is fine */
    CHECK(tc_comm_destroy(comm));
    CHECK(tc_store_destroy(store));
    if (g_failures) {
        fprintf(stderr, "rank %d: %d failed checks\n", r, g_failures);
        return 1;
    }
    printf("collectives OK rank %d/%d\n", r, n);
    return 0;
}
