#![no_main]
//! libFuzzer driver of the `tcpstore_server` target (body in `torchcomms-fuzz`).

libfuzzer_sys::fuzz_target!(|data: &[u8]| (torchcomms_fuzz::target("tcpstore_server")
    .expect("a target")
    .run)(data));
