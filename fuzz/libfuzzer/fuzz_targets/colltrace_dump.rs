#![no_main]
//! libFuzzer driver of the `colltrace_dump` target (body in `torchcomms-fuzz`).

libfuzzer_sys::fuzz_target!(|data: &[u8]| (torchcomms_fuzz::target("colltrace_dump")
    .expect("a target")
    .run)(data));
