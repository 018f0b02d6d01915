//! What this machine's HIP says, in both possible worlds without an AMD GPU: ROCm absent
//! ("ROCm not found") or present without a device ("no AMD GPU"). The test asserts the branch
//! that matches the machine and prints which ran; on a machine with an AMD GPU it checks the
//! count instead (never run: we have none).

use torchcomms_hip::{availability, HipError};

/// Whether the system loader finds a HIP runtime at all (what `availability` should agree with).
fn hip_library_present() -> bool {
    [
        "libamdhip64.so",
        "libamdhip64.so.7",
        "libamdhip64.so.6",
        "libamdhip64.so.5",
    ]
    .iter()
    // SAFETY: loading ROCm's runtime runs only its initialisers, as the crate itself does.
    .any(|n| unsafe { libloading::Library::new(*n) }.is_ok())
}

#[test]
fn reports_rocm_not_found_or_no_amd_gpu() {
    let present = hip_library_present();
    match availability() {
        Err(e @ HipError::LibraryNotFound { .. }) => {
            assert!(!present, "libamdhip64 loads here but availability says {e}");
            assert!(e.to_string().starts_with("ROCm not found"), "{e}");
            println!("BRANCH ran: ROCm absent -> {e}");
        }
        Err(e @ HipError::NoDevice { .. }) => {
            assert!(present);
            assert!(e.to_string().starts_with("no AMD GPU"), "{e}");
            println!("BRANCH ran: ROCm present, no AMD GPU -> {e}");
            // Every resource fails with the same reason instead of crashing.
            let err = torchcomms_hip::Stream::new().unwrap_err();
            assert!(matches!(err, HipError::NoDevice { .. }), "{err}");
            let err = torchcomms_hip::DeviceBuffer::new(64).unwrap_err();
            assert!(matches!(err, HipError::NoDevice { .. }), "{err}");
        }
        Ok(n) => {
            assert!(n > 0);
            println!("BRANCH ran: {n} AMD GPUs");
        }
        Err(e) => panic!("unexpected HIP error: {e}"),
    }
}

#[test]
fn override_path_is_tried_first() {
    let c =
        torchcomms_hip::sys::candidates(Some("/nonexistent/libamdhip64.so"), &["libamdhip64.so"]);
    assert_eq!(
        c[0],
        std::path::PathBuf::from("/nonexistent/libamdhip64.so")
    );
    assert_eq!(
        c.last().unwrap(),
        &std::path::PathBuf::from("libamdhip64.so")
    );
}

#[test]
fn override_folder_holds_the_library() {
    let dir = std::env::temp_dir().join(format!("tc-hip-override-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("libamdhip64.so.6"), b"not a library").unwrap();
    let c = torchcomms_hip::sys::candidates(
        Some(dir.to_str().unwrap()),
        &["libamdhip64.so", "libamdhip64.so.6"],
    );
    // Only the names the folder holds, first.
    assert_eq!(c[0], dir.join("libamdhip64.so.6"));
    assert!(!c.contains(&dir.join("libamdhip64.so")));
    // A file that is not a library fails as a value naming ROCm, not a crash.
    let e = torchcomms_hip::sys::open(
        "libamdhip64",
        Some(dir.join("libamdhip64.so.6").to_str().unwrap()),
        &[],
    )
    .unwrap_err();
    assert!(e.to_string().starts_with("ROCm not found"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
