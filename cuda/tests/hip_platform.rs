//! The engine's GPU layer driving HIP on a machine without an AMD GPU: with
//! `TORCHCOMMS_GPU_PLATFORM=hip` every entry point returns HIP's own reason ("ROCm not found"
//! or "no AMD GPU") as an error value: nothing falls back to CUDA, panics or crashes in ROCm.
//! On a machine with an AMD GPU it would check the device instead (never run: we have none).

use torchcomms_cuda::{self as cuda, Context, Platform, RawStream};

fn assert_hip_reason(what: &str, e: &cuda::CudaError) {
    let text = e.to_string();
    assert!(
        text.starts_with("no AMD GPU") || text.starts_with("ROCm not found"),
        "{what}: {text}"
    );
}

#[test]
fn the_hip_platform_reports_why_it_cannot_run() {
    // SAFETY: the only test of this binary, run before anything reads the environment.
    unsafe { std::env::set_var("TORCHCOMMS_GPU_PLATFORM", "hip") };
    assert_eq!(cuda::platform(), Platform::Hip);
    if let Ok(n) = torchcomms_hip::availability() {
        let d = cuda::driver().expect("HIP sees GPUs");
        assert_eq!(d.device_count as usize, n);
        let ctx = Context::get(0).expect("device 0");
        assert_eq!(ctx.platform(), Platform::Hip);
        println!("BRANCH ran: {n} AMD GPUs ({})", ctx.name());
        return;
    }
    let e = cuda::driver().unwrap_err();
    assert_hip_reason("driver", &e);
    let why = cuda::unavailable_reason().expect("HIP is not usable here");
    assert_eq!(why, e.to_string());
    assert!(!cuda::is_available());
    assert_hip_reason("Context::get", &Context::get(0).unwrap_err());
    assert_hip_reason(
        "synchronize",
        &RawStream::DEFAULT.synchronize().unwrap_err(),
    );
    assert_hip_reason(
        "is_capturing",
        &RawStream::DEFAULT.is_capturing().unwrap_err(),
    );
    println!("BRANCH ran: {why}");
}
