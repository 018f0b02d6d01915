// torchcomms.hpp: a small RAII wrapper over the C API (torchcomms.h) for C++17.
//
// Handles are move-only and released by their destructors; a failed call throws tc::Error,
// which carries the status and the library's message. Buffers are std::vector<T> or (pointer,
// count) pairs; the caller keeps them alive until the operation completes (for asynchronous
// calls: until Work::wait returns or the Work is destroyed after completion).
#pragma once

#include <torchcomms.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tc {

// A failed call: the status code and the message tc_last_error() gave.
class Error : public std::runtime_error {
  public:
    Error(tc_status_t status, const std::string &what)
        : std::runtime_error(what), status_(status) {}
    tc_status_t status() const noexcept { return status_; }

  private:
    tc_status_t status_;
};

// Throws tc::Error unless `status` is TC_OK.
inline void check(tc_status_t status, const char *call) {
    if (status != TC_OK) {
        throw Error(status, std::string(call) + ": " + tc_status_string(status) + ": " +
                                tc_last_error());
    }
}

// The dtype code of an element type.
template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr tc_dtype_t value = TC_FLOAT32; };
template <> struct dtype_of<double> { static constexpr tc_dtype_t value = TC_FLOAT64; };
template <> struct dtype_of<std::int8_t> { static constexpr tc_dtype_t value = TC_INT8; };
template <> struct dtype_of<std::uint8_t> { static constexpr tc_dtype_t value = TC_UINT8; };
template <> struct dtype_of<std::int32_t> { static constexpr tc_dtype_t value = TC_INT32; };
template <> struct dtype_of<std::int64_t> { static constexpr tc_dtype_t value = TC_INT64; };
template <> struct dtype_of<bool> { static constexpr tc_dtype_t value = TC_BOOL; };

// A host buffer descriptor.
template <class T> tc_tensor_t tensor(T *data, std::size_t count) {
    return tc_cpu_tensor(static_cast<void *>(data), count, dtype_of<T>::value);
}
template <class T> tc_tensor_t tensor(std::vector<T> &v) { return tensor(v.data(), v.size()); }

inline tc_device_t cpu() { return tc_device_t{TC_DEVICE_CPU, 0}; }

// Asynchronous work; the destructor frees the handle (the operation itself runs on).
class Work {
  public:
    explicit Work(tc_work_t *w) noexcept : w_(w) {}
    Work(Work &&o) noexcept : w_(std::exchange(o.w_, nullptr)) {}
    Work &operator=(Work &&o) noexcept {
        std::swap(w_, o.w_);
        return *this;
    }
    Work(const Work &) = delete;
    Work &operator=(const Work &) = delete;
    ~Work() {
        if (w_ != nullptr) tc_work_free(w_);
    }

    // Blocks until the work completed (throws on failure or at the deadline: a negative
    // timeout means the operation's own).
    void wait(double timeout_seconds = TC_WAIT_OP_TIMEOUT) {
        check(tc_work_wait(w_, timeout_seconds), "tc_work_wait");
    }
    // True once the work completed (throws if it failed).
    bool test() {
        bool done = false;
        check(tc_work_test(w_, &done), "tc_work_test");
        return done;
    }
    tc_work_t *get() const noexcept { return w_; }

  private:
    tc_work_t *w_;
};

// A TCP store ranks bootstrap through.
class Store {
  public:
    Store(const std::string &host, std::uint16_t port, bool is_server, double timeout_seconds = 0) {
        check(tc_store_create(host.c_str(), port, is_server, timeout_seconds, &s_),
              "tc_store_create");
    }
    Store(Store &&o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    Store(const Store &) = delete;
    Store &operator=(const Store &) = delete;
    ~Store() {
        if (s_ != nullptr) tc_store_destroy(s_);
    }
    std::uint16_t port() const {
        std::uint16_t p = 0;
        check(tc_store_port(s_, &p), "tc_store_port");
        return p;
    }
    tc_store_t *get() const noexcept { return s_; }

  private:
    tc_store_t *s_ = nullptr;
};

// A communicator. An empty one (operator bool false) is what split gives ranks left out.
class Comm {
  public:
    Comm() noexcept = default;
    explicit Comm(tc_comm_t *c) noexcept : c_(c) {}
    Comm(Comm &&o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
    Comm &operator=(Comm &&o) noexcept {
        std::swap(c_, o.c_);
        return *this;
    }
    Comm(const Comm &) = delete;
    Comm &operator=(const Comm &) = delete;
    ~Comm() {
        if (c_ != nullptr) tc_comm_destroy(c_);
    }

    // Rank, size and store from the launcher's environment (torchrun, SLURM, MPI).
    static Comm from_env(const std::string &backend, const std::string &name,
                         tc_device_t device = cpu()) {
        tc_comm_t *c = nullptr;
        check(tc_comm_create_from_env(backend.c_str(), device, name.c_str(), nullptr, &c),
              "tc_comm_create_from_env");
        return Comm(c);
    }
    // Explicit rank and size, bootstrapping through `store`.
    static Comm from_store(const std::string &backend, const std::string &name, Store &store,
                           int rank, int size, tc_device_t device = cpu()) {
        tc_comm_t *c = nullptr;
        check(tc_comm_create(backend.c_str(), device, name.c_str(), store.get(), rank, size,
                             nullptr, &c),
              "tc_comm_create");
        return Comm(c);
    }

    explicit operator bool() const noexcept { return c_ != nullptr; }
    tc_comm_t *get() const noexcept { return c_; }

    int rank() const {
        std::int32_t r = -1;
        check(tc_comm_rank(c_, &r), "tc_comm_rank");
        return r;
    }
    int size() const {
        std::int32_t n = 0;
        check(tc_comm_size(c_, &n), "tc_comm_size");
        return n;
    }
    std::string name() const {
        const char *n = nullptr;
        check(tc_comm_name(c_, &n), "tc_comm_name");
        return n;
    }

    template <class T> void all_reduce(std::vector<T> &v, tc_reduce_op_t op = TC_SUM) {
        check(tc_all_reduce(c_, tensor(v), op, nullptr, nullptr, nullptr), "tc_all_reduce");
    }
    template <class T> Work all_reduce_async(std::vector<T> &v, tc_reduce_op_t op = TC_SUM) {
        tc_work_t *w = nullptr;
        check(tc_all_reduce(c_, tensor(v), op, nullptr, nullptr, &w), "tc_all_reduce");
        return Work(w);
    }
    template <class T> void broadcast(std::vector<T> &v, int root) {
        check(tc_broadcast(c_, tensor(v), root, nullptr, nullptr, nullptr), "tc_broadcast");
    }
    // `output` holds size() blocks of `input`'s length.
    template <class T> void all_gather(std::vector<T> &output, std::vector<T> &input) {
        check(tc_all_gather_single(c_, tensor(output), tensor(input), nullptr, nullptr, nullptr),
              "tc_all_gather_single");
    }
    void barrier() { check(tc_barrier(c_, nullptr, nullptr, nullptr), "tc_barrier"); }

    // A collective of every rank: those passing an empty list get an empty Comm.
    Comm split(const std::vector<std::int32_t> &ranks, const std::string &name) {
        tc_comm_t *child = nullptr;
        check(tc_comm_split(c_, ranks.data(), ranks.size(), name.c_str(), nullptr, &child),
              "tc_comm_split");
        return Comm(child);
    }
    void finalize() { check(tc_comm_finalize(c_), "tc_comm_finalize"); }

  private:
    tc_comm_t *c_ = nullptr;
};

}  // namespace tc
