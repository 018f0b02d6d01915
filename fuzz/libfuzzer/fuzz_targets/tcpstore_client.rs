#![no_main]
//! libFuzzer driver of the `tcpstore_client` target (body in `torchcomms-fuzz`).

libfuzzer_sys::fuzz_target!(|data: &[u8]| (torchcomms_fuzz::target("tcpstore_client")
    .expect("a target")
    .run)(data));
