/*
 * All-reduce from C over the ranks a launcher started.
 *
 * Build (from the repository root, after `cargo build -p torchcomms-c`):
 *   gcc -std=c11 -Ibindings/c/include examples/c/allreduce.c \
 *       -Ltarget/debug -ltorchcomms_c -Wl,-rpath,$PWD/target/debug -o allreduce
 * Run 4 ranks on this host:
 *   for r in 0 1 2 3; do TORCHCOMM_RANK=$r TORCHCOMM_SIZE=4 MASTER_ADDR=127.0.0.1 \
 *       MASTER_PORT=29500 ./allreduce & done; wait
 * (torchrun, SLURM and Open MPI variables work too.) Exits non-zero on any error or wrong
 * result, and prints "allreduce OK rank R/N" on success.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <torchcomms.h>

static int32_t rank = -1;

/* Exits with the library's message when a call fails. */
#define CHECK(call)                                                                   \
    do {                                                                              \
        tc_status_t status_ = (call);                                                 \
        if (status_ != TC_OK) {                                                       \
            fprintf(stderr, "rank %d: %s failed: %s: %s\n", (int)rank, #call,         \
                    tc_status_string(status_), tc_last_error());                      \
            exit(2);                                                                  \
        }                                                                             \
    } while (0)

enum { N = 4099 }; /* odd, so chunks are uneven */

int main(void) {
    const tc_device_t cpu = {TC_DEVICE_CPU, 0};
    tc_comm_t *comm = NULL;
    int32_t size = 0;
    int errors = 0;

    /* Rank, size and the store come from the environment. */
    CHECK(tc_comm_create_from_env("ctran", cpu, "allreduce", NULL, &comm));
    CHECK(tc_comm_rank(comm, &rank));
    CHECK(tc_comm_size(comm, &size));

    /* Synchronous: returns once every rank's contribution is summed in place. */
    float *x = malloc(N * sizeof *x);
    if (x == NULL) return 3;
    for (int i = 0; i < N; i++) x[i] = (float)(rank + 1) * (float)(i % 7 + 1);
    CHECK(tc_all_reduce(comm, tc_cpu_tensor(x, N, TC_FLOAT32), TC_SUM, NULL, NULL, NULL));
    const float ranks_sum = (float)size * (float)(size + 1) / 2.0f;
    for (int i = 0; i < N; i++) {
        if (x[i] != ranks_sum * (float)(i % 7 + 1)) {
            if (errors++ < 5)
                fprintf(stderr, "rank %d: sum x[%d] = %g, expected %g\n", (int)rank, i, x[i],
                        ranks_sum * (float)(i % 7 + 1));
        }
    }

    /* Asynchronous: the call returns a work handle; the buffer stays ours to keep alive
     * until the work completes. */
    int64_t *y = malloc(N * sizeof *y);
    if (y == NULL) return 3;
    for (int i = 0; i < N; i++) y[i] = (int64_t)rank * 1000000 + i;
    tc_work_t *work = NULL;
    CHECK(tc_all_reduce(comm, tc_cpu_tensor(y, N, TC_INT64), TC_MAX, NULL, NULL, &work));
    CHECK(tc_work_wait(work, TC_WAIT_OP_TIMEOUT));
    bool done = false;
    CHECK(tc_work_test(work, &done));
    CHECK(tc_work_free(work));
    if (!done) {
        fprintf(stderr, "rank %d: work not completed after wait\n", (int)rank);
        errors++;
    }
    for (int i = 0; i < N; i++) {
        if (y[i] != (int64_t)(size - 1) * 1000000 + i) {
            if (errors++ < 10)
                fprintf(stderr, "rank %d: max y[%d] = %lld\n", (int)rank, i, (long long)y[i]);
        }
    }

    CHECK(tc_comm_finalize(comm));
    CHECK(tc_comm_destroy(comm));
    free(x);
    free(y);
    if (errors) {
        fprintf(stderr, "rank %d: %d wrong elements\n", (int)rank, errors);
        return 1;
    }
    printf("allreduce OK rank %d/%d\n", (int)rank, (int)size);
    return 0;
}
