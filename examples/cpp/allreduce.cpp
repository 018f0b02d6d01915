/*
 * All-reduce from C++ through the RAII wrapper (torchcomms.hpp) over the ranks a launcher
 * started.
 *
 * Build (from the repository root, after `cargo build -p torchcomms-c`), statically:
 *   g++ -std=c++17 -Ibindings/c/include -Iexamples/cpp examples/cpp/allreduce.cpp \
 *       target/debug/libtorchcomms_c.a -lpthread -ldl -lm -lrt -o allreduce_cpp
 * Run 4 ranks on this host:
 *   for r in 0 1 2 3; do TORCHCOMM_RANK=$r TORCHCOMM_SIZE=4 MASTER_ADDR=127.0.0.1 \
 *       MASTER_PORT=29500 ./allreduce_cpp & done; wait
 * Exits non-zero on any error or wrong result; prints "allreduce OK rank R/N" on success.
 */
#include "torchcomms.hpp"

#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

int wrong = 0;

template <class T> void expect(const char *what, std::size_t i, T got, T want) {
    if (got != want && wrong++ < 10) {
        std::fprintf(stderr, "%s[%zu] = %g, expected %g\n", what, i, static_cast<double>(got),
                     static_cast<double>(want));
    }
}

}  // namespace

int main() {
    try {
        tc::Comm comm = tc::Comm::from_env("ctran", "allreduce_cpp");
        const int rank = comm.rank();
        const int size = comm.size();

        // Synchronous sum of doubles.
        std::vector<double> x(1000);
        for (std::size_t i = 0; i < x.size(); i++) x[i] = (rank + 1) * 0.5 + double(i);
        comm.all_reduce(x);
        for (std::size_t i = 0; i < x.size(); i++) {
            expect("sum", i, x[i], size * (size + 1) / 2 * 0.5 + double(size) * double(i));
        }

        // Asynchronous minimum of int32; the Work frees its handle when it goes out of scope.
        std::vector<std::int32_t> y(777);
        for (std::size_t i = 0; i < y.size(); i++) y[i] = 100 * rank - std::int32_t(i);
        {
            tc::Work work = comm.all_reduce_async(y, TC_MIN);
            work.wait();
            if (!work.test()) {
                std::fprintf(stderr, "work not completed after wait\n");
                wrong++;
            }
        }
        for (std::size_t i = 0; i < y.size(); i++) expect("min", i, y[i], -std::int32_t(i));

        // Split into even and odd ranks; all-reduce within each half.
        std::vector<std::int32_t> half;
        for (int r = rank % 2; r < size; r += 2) half.push_back(r);
        tc::Comm sub = comm.split(half, rank % 2 ? "odd" : "even");
        if (!sub || sub.size() != int(half.size())) {
            std::fprintf(stderr, "split gave no communicator of %zu ranks\n", half.size());
            return 1;
        }
        std::vector<std::int64_t> z(5, rank);
        sub.all_reduce(z);
        std::int64_t want = 0;
        for (int r : half) want += r;
        for (std::size_t i = 0; i < z.size(); i++) expect("split sum", i, z[i], want);
        sub.finalize();

        // Errors surface as exceptions carrying the status and message.
        try {
            comm.broadcast(x, size);  // root out of range
            std::fprintf(stderr, "broadcast to root %d did not fail\n", size);
            wrong++;
        } catch (const tc::Error &e) {
            if (e.status() != TC_ERR_INVALID_ARGUMENT) {
                std::fprintf(stderr, "unexpected status %d: %s\n", int(e.status()), e.what());
                wrong++;
            }
        }

        comm.barrier();
        comm.finalize();
        if (wrong) {
            std::fprintf(stderr, "rank %d: %d wrong results\n", rank, wrong);
            return 1;
        }
        std::printf("allreduce OK rank %d/%d\n", rank, size);
        return 0;
    } catch (const tc::Error &e) {
        std::fprintf(stderr, "torchcomms error: %s\n", e.what());
        return 2;
    }
}
