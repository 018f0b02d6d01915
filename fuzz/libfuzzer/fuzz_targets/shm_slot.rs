#![no_main]
//! libFuzzer driver of the `shm_slot` target (body in `torchcomms-fuzz`).

libfuzzer_sys::fuzz_target!(|data: &[u8]| (torchcomms_fuzz::target("shm_slot")
    .expect("a target")
    .run)(data));
