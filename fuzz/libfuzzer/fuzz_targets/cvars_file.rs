#![no_main]
//! libFuzzer driver of the `cvars_file` target (body in `torchcomms-fuzz`).

libfuzzer_sys::fuzz_target!(|data: &[u8]| (torchcomms_fuzz::target("cvars_file")
    .expect("a target")
    .run)(data));
