//! The one set of kernel sources stays portable to AMD GPUs: every source the engine hands to
//! NVRTC ([`ctran::gpu_sources`], byte for byte) also compiles for gfx90a (MI200) with
//! hipcc and with hiprtc. No AMD GPU is needed: both compile on the CPU. What differs between
//! CUDA and HIP lives in `cuda/src/kernels/gpu_compat.cuh` (docs/amd.md).
//!
//! Without hipcc (Debian: `apt-get install hipcc libamdhip64-dev`) these print SKIPPED; with
//! `TORCHCOMMS_REQUIRE_HIPCC=1` (CI sets it) a missing compiler fails them instead.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const ARCH: &str = "gfx90a";

fn required() -> bool {
    std::env::var("TORCHCOMMS_REQUIRE_HIPCC").as_deref() == Ok("1")
}

fn skip(why: &str) {
    assert!(
        !required(),
        "TORCHCOMMS_REQUIRE_HIPCC=1 but {why} (apt-get install hipcc libamdhip64-dev)"
    );
    println!("SKIPPED: {why} (apt-get install hipcc libamdhip64-dev to run this check)");
}

/// hipcc from PATH, else ROCm's usual prefix.
fn hipcc() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(r) = std::env::var_os("ROCM_PATH") {
        dirs.push(Path::new(&r).join("bin"));
    }
    dirs.push("/opt/rocm/bin".into());
    dirs.into_iter()
        .map(|d| d.join("hipcc"))
        .find(|p| p.is_file())
}

fn sources() -> Vec<(&'static str, &'static str)> {
    let s = ctran::gpu_sources();
    assert!(s.len() >= 4, "only {} kernel sources", s.len());
    s
}

#[test]
fn every_kernel_source_compiles_for_gfx90a_with_hipcc() {
    let Some(hipcc) = hipcc() else {
        return skip("hipcc not found");
    };
    let dir = std::env::temp_dir().join(format!("tc-hip-compile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t0 = Instant::now();
    // One hipcc per source, all at once: nvl.cu dominates (about 40 s of CPU).
    let jobs: Vec<_> = sources()
        .into_iter()
        .map(|(name, src)| {
            let stem = name.replace('/', "_");
            let input = dir.join(format!("{stem}.hip"));
            let output = dir.join(format!("{stem}.{ARCH}.o"));
            std::fs::write(&input, src).unwrap();
            let child = Command::new(&hipcc)
                .args(["-std=c++17", "--cuda-device-only", "-c"])
                .arg(format!("--offload-arch={ARCH}"))
                .arg(&input)
                .arg("-o")
                .arg(&output)
                .output();
            (name, output, std::thread::spawn(move || child))
        })
        .collect();
    let mut failed = Vec::new();
    for (name, output, job) in jobs {
        let out = job.join().unwrap().expect("running hipcc");
        let size = std::fs::metadata(&output).map(|m| m.len()).unwrap_or(0);
        if out.status.success() && size > 0 {
            println!("{name}: compiled for {ARCH} ({size} bytes)");
        } else {
            failed.push(format!(
                "{name}: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "hipcc: {:.1} s for every source",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        failed.is_empty(),
        "not portable to {ARCH}:\n{}",
        failed.join("\n")
    );
}

#[test]
fn every_kernel_source_compiles_for_gfx90a_with_hiprtc() {
    if hipcc().is_none() {
        return skip("hipcc not found (the HIP toolchain that hiprtc needs is not installed)");
    }
    if let Err(e) = torchcomms_hip::rtc::version() {
        return skip(&format!("hiprtc did not load: {e}"));
    }
    let t0 = Instant::now();
    let mut compiled = 0;
    for (name, src) in sources() {
        let code =
            torchcomms_hip::rtc::compile(name, src, ARCH).unwrap_or_else(|e| panic!("hiprtc: {e}"));
        assert!(!code.is_empty(), "{name}: empty code object");
        println!(
            "{name}: hiprtc code object for {ARCH} ({} bytes)",
            code.len()
        );
        compiled += 1;
    }
    assert_eq!(compiled, sources().len());
    println!(
        "hiprtc: {:.1} s for every source",
        t0.elapsed().as_secs_f64()
    );
}

/// Inline PTX, `%globaltimer` and `__nanosleep` appear only in the compatibility header: a new
/// use elsewhere would compile for CUDA and silently break the HIP build of that source.
#[test]
fn vendor_specific_code_lives_only_in_the_compat_header() {
    let compat = torchcomms_cuda::kernels::COMPAT_CUH;
    for (name, src) in sources() {
        assert!(
            src.starts_with(compat),
            "{name} does not start with gpu_compat.cuh"
        );
        let body = &src[compat.len()..];
        for needle in ["asm(", "asm volatile", "%globaltimer", "__nanosleep"] {
            assert!(
                !body.contains(needle),
                "{name} uses {needle:?} outside gpu_compat.cuh"
            );
        }
    }
}
