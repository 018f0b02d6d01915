//! Tier 1 and 3 of the backend's tests that run under `cargo test`: without CUDA or NCCL the
//! backend fails as a value that says what it searched; with a GPU, one device's kernels run.
//! The multi-GPU suite is the `torchcomms-gpu-test` binary (scripts/gpu-test.sh).

use std::sync::Arc;

use torchcomms::{new_comm, CommOptions, ErrorKind};
use torchcomms_core::bootstrap::HashStore;
use torchcomms_core::{DataType, Device, ReduceOp};
use torchcomms_cuda::{self as cuda, Context, DeviceBuffer, RawStream, ReduceKernels};
use torchcomms_nccl as _;

fn one_rank_options() -> CommOptions {
    let mut o = CommOptions::from_env().unwrap_or_default();
    o.rank = Some(0);
    o.size = Some(1);
    o.store = Some(Arc::new(HashStore::new()));
    o.abort_process_on_timeout_or_error = false;
    o
}

#[test]
fn cpu_tensors_are_refused() {
    let e = new_comm("nccl", Device::Cpu, "nccl-cpu", one_rank_options()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    assert!(e.to_string().contains("CUDA"), "{e}");
}

#[test]
fn without_nccl_creation_fails_as_a_value() {
    if torchcomms_nccl::is_available() && cuda::is_available() {
        skip(
            "without_nccl_creation_fails_as_a_value",
            "CUDA and NCCL are present here (torchcomms-gpu-test covers them)",
        );
        return;
    }
    let e = new_comm("nccl", Device::Cuda(0), "nccl-none", one_rank_options()).unwrap_err();
    println!("as expected without a GPU: {e}");
    assert!(
        matches!(e.kind(), ErrorKind::NotSupported | ErrorKind::Communication),
        "{e}"
    );
    assert!(
        e.to_string().contains("searched") || e.to_string().contains("CUDA"),
        "{e}"
    );
}

/// `rccl` is registered next to `nccl` and, without RCCL or an AMD GPU (every machine we have),
/// fails as a value naming RCCL/ROCm, never by touching CUDA.
#[test]
fn rccl_without_rocm_or_amd_gpu_fails_naming_it() {
    assert!(torchcomms::is_backend_registered("rccl"));
    let e = new_comm("rccl", Device::Cuda(0), "rccl-none", one_rank_options()).unwrap_err();
    println!("rccl here: {e}");
    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    let text = e.to_string();
    match torchcomms_nccl::rccl_version() {
        Err(_) => assert!(
            text.contains("RCCL is not available") && text.contains("librccl"),
            "{e}"
        ),
        // RCCL present: then no AMD GPU (or no HIP runtime) here, or the missing HIP layer.
        Ok(_) => assert!(
            text.contains("no AMD GPU") || text.contains("ROCm not found") || text.contains("HIP"),
            "{e}"
        ),
    }
    let e = new_comm("rccl", Device::Cpu, "rccl-cpu", one_rank_options()).unwrap_err();
    assert!(
        e.to_string().contains("rccl backend runs on AMD GPUs"),
        "{e}"
    );
}

/// Prints a skip where `cargo test` shows it for a passing test too (past the harness's capture
/// of `println!`).
fn skip(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// Skips only where there is no GPU to run on (no driver, or a driver that sees no device);
/// with a device, a kernel that NVRTC cannot build (or a missing NVRTC) is a failure.
#[test]
fn one_device_sums_like_the_cpu() {
    if let Some(why) = cuda::unavailable_reason() {
        skip(
            "one_device_sums_like_the_cpu",
            &format!("no usable GPU here: {why}"),
        );
        return;
    }
    let ctx = Context::get(0).expect("the driver sees a device: its context must open");
    let k = ReduceKernels::get(&ctx).unwrap_or_else(|e| {
        panic!("a GPU is here, but its reduction kernels cannot be built or loaded: {e}")
    });
    let a: Vec<u8> = (0..1000)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let buf = DeviceBuffer::from_host(&ctx, &a).unwrap();
    // SAFETY: buf holds 1000 f32 and outlives the synchronous read.
    unsafe {
        k.combine(
            DataType::F32,
            ReduceOp::Sum,
            buf.as_ptr(),
            buf.as_ptr(),
            buf.as_ptr(),
            1000,
            RawStream::DEFAULT,
        )
        .unwrap();
    }
    let mut out = vec![0u8; a.len()];
    buf.read(0, &mut out).unwrap();
    let got: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(
        got.iter().enumerate().all(|(i, &v)| v == i as f32),
        "{got:?}"
    );
}
