#![no_main]
//! libFuzzer driver of the `ib_control` target (body in `torchcomms-fuzz`).

libfuzzer_sys::fuzz_target!(|data: &[u8]| (torchcomms_fuzz::target("ib_control")
    .expect("a target")
    .run)(data));
