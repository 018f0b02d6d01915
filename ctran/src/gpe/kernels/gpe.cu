// Flags between a comm's stream and its GPU progress engine (ctran/src/gpe), in mapped host
// memory. Compiled at run time by NVRTC (ctran/src/gpe/kernels.rs).
//
// `posted` and `done` are 64-bit counters that only grow. The stream raises `posted` to the
// number of a step once the step's inputs are in host staging; the host thread raises `done`
// once the step's outputs are there. Both sides see the other's writes through system-scope
// fences: the copies before a post are complete before the kernel starts (stream order), and
// the host's staging writes precede its `done` store (release on the host).

typedef unsigned long long u64;

// Raises *posted to `step` (one thread).
extern "C" __global__ void gpe_post(volatile u64* posted, u64 step) {
    __threadfence_system();
    *posted = step;
    __threadfence_system();
}

// Spins until *done reaches `step` (one thread), sleeping between reads so the polling costs
// little PCIe traffic; then fences, so the copies that follow read the host's staging.
extern "C" __global__ void gpe_wait(volatile u64* done, u64 step) {
    unsigned ns = 64;
    while (*done < step) {
        tc_nanosleep(ns);
        if (ns < 2048) ns *= 2;
    }
    __threadfence_system();
}
