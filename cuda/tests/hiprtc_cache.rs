//! hiprtc's output goes to the kernel cache like NVRTC's, so an AMD machine compiles each
//! source once, not at every process's first communicator. hiprtc runs on the CPU, so this
//! runs wherever ROCm's library is installed (CI installs Debian's); without it, SKIPPED.

use torchcomms_cuda::kernels::{hiprtc_image, REDUCE_SOURCE, REDUCE_SOURCE_NAME};

#[test]
fn a_second_compile_reads_the_cache() {
    let dir = std::env::temp_dir().join(format!("tc-hiprtc-cache-{}", std::process::id()));
    // SAFETY: the only test of this binary, run before anything reads the environment.
    unsafe {
        std::env::set_var("TORCHCOMMS_KERNEL_CACHE", &dir);
        std::env::set_var("TORCHCOMMS_HIP_ARCH", "gfx90a");
    }
    if let Err(e) = torchcomms_hip::rtc::version() {
        assert!(
            std::env::var("TORCHCOMMS_REQUIRE_HIPCC").as_deref() != Ok("1"),
            "TORCHCOMMS_REQUIRE_HIPCC=1 but hiprtc does not load: {e}"
        );
        println!("SKIPPED: hiprtc does not load here ({e})");
        return;
    }
    let first = hiprtc_image(REDUCE_SOURCE_NAME, REDUCE_SOURCE).expect("hiprtc compiles reduce.cu");
    assert!(!first.from_cache && !first.bytes.is_empty());
    assert_eq!(first.target, "gfx90a");
    let path = first.cache_path.clone().expect("the cache is on");
    assert!(
        path.starts_with(&dir) && path.is_file(),
        "{}",
        path.display()
    );
    let second = hiprtc_image(REDUCE_SOURCE_NAME, REDUCE_SOURCE).expect("from the cache");
    assert!(second.from_cache);
    assert_eq!(second.bytes, first.bytes);
    // Another source is another file.
    let other = format!("{REDUCE_SOURCE}\n// another source\n");
    let third = hiprtc_image(REDUCE_SOURCE_NAME, &other).expect("compiles");
    assert!(!third.from_cache);
    assert_ne!(third.cache_path, first.cache_path);
    let _ = std::fs::remove_dir_all(&dir);
}
