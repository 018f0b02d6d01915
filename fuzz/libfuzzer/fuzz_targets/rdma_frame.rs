#![no_main]
//! libFuzzer driver of the `rdma_frame` target (body in `torchcomms-fuzz`).

libfuzzer_sys::fuzz_target!(|data: &[u8]| (torchcomms_fuzz::target("rdma_frame")
    .expect("a target")
    .run)(data));
