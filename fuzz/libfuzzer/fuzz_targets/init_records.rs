#![no_main]
//! libFuzzer driver of the `init_records` target (body in `torchcomms-fuzz`).

libfuzzer_sys::fuzz_target!(|data: &[u8]| (torchcomms_fuzz::target("init_records")
    .expect("a target")
    .run)(data));
