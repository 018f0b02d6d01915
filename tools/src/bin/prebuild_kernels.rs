//! Compiles every CUDA kernel source of the engine into CUBINs ahead of time, for a build to
//! embed (`TORCHCOMMS_PREBUILT_KERNELS=DIR` when building; see `cuda/build.rs`). A device of
//! one of these architectures then compiles nothing at run time, not even on a fresh machine.
//!
//! ```text
//! torchcomms-prebuild-kernels --out DIR [--arch 90 --arch 100 ...]
//! ```
//!
//! Needs NVRTC (no GPU): `TORCHCOMMS_NVRTC_LIB` or the usual places, e.g. the
//! `nvidia-cuda-nvrtc` wheel. `scripts/build-gpu-wheel.sh` runs it.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use ctran::cuda::nvrtc;

/// Architectures compiled by default: Ampere (A100), Hopper (H100, H200), Blackwell (B200).
const DEFAULT_ARCHS: [i32; 3] = [80, 90, 100];

fn main() -> Result<()> {
    let mut out: Option<PathBuf> = None;
    let mut archs = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--out" => out = Some(args.next().context("--out needs a folder")?.into()),
            "--arch" => {
                let v = args.next().context("--arch needs a number such as 90")?;
                archs.push(v.parse::<i32>().with_context(|| {
                    format!("--arch: expected a number such as 90 (sm_90), got {v:?}")
                })?);
            }
            "-h" | "--help" => {
                println!("torchcomms-prebuild-kernels --out DIR [--arch 90 ...]");
                return Ok(());
            }
            other => bail!("unknown argument {other:?} (expected --out DIR, --arch N)"),
        }
    }
    let out = out.context("--out DIR is required")?;
    if archs.is_empty() {
        archs = DEFAULT_ARCHS.to_vec();
    }
    let nv = nvrtc::nvrtc().context("loading NVRTC (set TORCHCOMMS_NVRTC_LIB)")?;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut written = 0;
    for arch in archs {
        if !nv.archs.contains(&arch) {
            eprintln!(
                "skipping sm_{arch}: NVRTC {}.{} does not know it",
                nv.version.0, nv.version.1
            );
            continue;
        }
        let target = format!("sm_{arch}");
        for (name, source) in ctran::gpu_sources() {
            let started = std::time::Instant::now();
            let cubin = nvrtc::compile_cubin(name, source, &target)
                .with_context(|| format!("compiling {name} for {target}"))?;
            let file = out.join(nvrtc::prebuilt_name(name, source, &target));
            std::fs::write(&file, &cubin).with_context(|| format!("writing {}", file.display()))?;
            println!(
                "{} ({} KiB, {:.1} s)",
                file.display(),
                cubin.len() / 1024,
                started.elapsed().as_secs_f64()
            );
            written += 1;
        }
    }
    if written == 0 {
        bail!("no architecture was compiled");
    }
    let version = out.join("NVRTC_VERSION");
    std::fs::write(&version, format!("{}.{}\n", nv.version.0, nv.version.1))
        .with_context(|| format!("writing {}", version.display()))?;
    Ok(())
}
