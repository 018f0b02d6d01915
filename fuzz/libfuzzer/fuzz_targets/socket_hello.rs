#![no_main]
//! libFuzzer driver of the `socket_hello` target (body in `torchcomms-fuzz`).

libfuzzer_sys::fuzz_target!(|data: &[u8]| (torchcomms_fuzz::target("socket_hello")
    .expect("a target")
    .run)(data));
