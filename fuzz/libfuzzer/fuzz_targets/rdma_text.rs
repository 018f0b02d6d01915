#![no_main]
//! libFuzzer driver of the `rdma_text` target (body in `torchcomms-fuzz`).

libfuzzer_sys::fuzz_target!(|data: &[u8]| (torchcomms_fuzz::target("rdma_text")
    .expect("a target")
    .run)(data));
