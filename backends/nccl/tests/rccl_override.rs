//! `RCCL_LIB_PATH` is the first place the `rccl` backend looks for librccl (its own test
//! binary: the cvars are read once per process, so the variable is set before anything reads
//! them).

#[test]
fn rccl_lib_path_is_tried_first() {
    // Edition 2021: set_var is safe; this binary's only test, so no other thread reads the
    // environment meanwhile.
    std::env::set_var("RCCL_LIB_PATH", "/nonexistent/torchcomms-test/librccl.so.1");
    let e = torchcomms_nccl::rccl_version().unwrap_err();
    let text = e.to_string();
    println!("{text}");
    let searched = text
        .split("searched: ")
        .nth(1)
        .expect("the error lists what it searched");
    assert!(
        searched.starts_with("/nonexistent/torchcomms-test/librccl.so.1"),
        "{text}"
    );
    assert!(text.contains("RCCL is not available"), "{text}");
}
