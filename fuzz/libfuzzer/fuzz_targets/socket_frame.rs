#![no_main]
//! libFuzzer driver of the `socket_frame` target (body in `torchcomms-fuzz`).

libfuzzer_sys::fuzz_target!(|data: &[u8]| (torchcomms_fuzz::target("socket_frame")
    .expect("a target")
    .run)(data));
