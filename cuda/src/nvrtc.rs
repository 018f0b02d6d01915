//! Run-time compilation of the CUDA C sources kept in the repository, with NVRTC loaded at run
//! time, and an on-disk cache of the results.
//!
//! A source is compiled for the device's own architecture (`sm_90` on Hopper) into a CUBIN.
//! When this NVRTC does not know the device (a newer GPU), it emits PTX for the newest
//! architecture it knows at or below the device's, and the driver finishes the job at load.
//!
//! The cache lives in `$TORCHCOMMS_KERNEL_CACHE`, else `$XDG_CACHE_HOME/torchcomms/kernels`,
//! else `$HOME/.cache/torchcomms/kernels` (`TORCHCOMMS_KERNEL_CACHE=off` disables it). A file
//! is named after the source, a SHA-256 of the source, the options and NVRTC's version, the
//! architecture and the driver version, so a change of any of them compiles afresh. Files are
//! written to a temporary name and renamed, so concurrent ranks never read half a file.

use std::ffi::{c_char, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

use cudarc::nvrtc::{result as nv, sys as nvsys};
use sha2::{Digest, Sha256};

use super::error::{CudaError, Result};
use super::libs;

/// Options every kernel is compiled with: exact IEEE arithmetic (no FMA contraction, no
/// flush-to-zero), so the GPU agrees bit for bit with the CPU kernels.
const OPTIONS: [&str; 3] = ["--fmad=false", "--ftz=false", "--std=c++17"];

/// The loaded NVRTC: its version and the architectures it can target.
#[derive(Debug)]
pub struct Nvrtc {
    /// (major, minor).
    pub version: (i32, i32),
    /// Supported `sm_XY` as `10 * X + Y`.
    pub archs: Vec<i32>,
    /// Where the library was found.
    pub path: PathBuf,
    _lib: libloading::Library,
}

/// Loads NVRTC once (override: `TORCHCOMMS_NVRTC_LIB`).
pub fn nvrtc() -> Result<&'static Nvrtc> {
    static NVRTC: OnceLock<Result<Nvrtc>> = OnceLock::new();
    NVRTC
        .get_or_init(|| {
            let opened = libs::open(
                "libnvrtc (NVRTC)",
                Some("TORCHCOMMS_NVRTC_LIB"),
                &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
            )?;
            // SAFETY: only dlopens cudarc's candidate names (ours matches by soname), so its
            // panicking loader is used only after this returned true.
            if !unsafe { nvsys::is_culib_present() } {
                return Err(CudaError::LibraryNotFound {
                    lib: "libnvrtc".into(),
                    reason: "loaded, but not under a name cudarc opens".into(),
                    searched: opened.path.display().to_string(),
                });
            }
            let (mut major, mut minor) = (0, 0);
            // SAFETY: writes two ints.
            unsafe { nvsys::nvrtcVersion(&mut major, &mut minor) }
                .result()
                .map_err(|source| CudaError::Nvrtc {
                    call: "nvrtcVersion",
                    source,
                })?;
            let mut n = 0;
            // SAFETY: writes one int, then `n` ints into a buffer of that size.
            let archs = unsafe {
                nvsys::nvrtcGetNumSupportedArchs(&mut n)
                    .result()
                    .and_then(|()| {
                        let mut v = vec![0; usize::try_from(n).unwrap_or(0)];
                        nvsys::nvrtcGetSupportedArchs(v.as_mut_ptr())
                            .result()
                            .map(|()| v)
                    })
            }
            .map_err(|source| CudaError::Nvrtc {
                call: "nvrtcGetSupportedArchs",
                source,
            })?;
            Ok(Nvrtc {
                version: (major, minor),
                archs,
                path: opened.path,
                _lib: opened.lib,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A compiled image, ready for [`Module::load`](super::Module::load).
#[derive(Debug, Clone)]
pub struct Image {
    /// CUBIN bytes, or NUL-terminated PTX.
    pub bytes: Vec<u8>,
    /// The target (`sm_90`, or `compute_90` for PTX).
    pub target: String,
    /// The cache file, when the cache is on.
    pub cache_path: Option<PathBuf>,
    /// True when read from the cache (nothing was compiled).
    pub from_cache: bool,
}

/// The cache folder, or `None` when disabled or no folder can be named.
pub fn cache_dir() -> Option<PathBuf> {
    match torchcomms_cvars::torchcomms_kernel_cache() {
        Some(v) if v == "off" || v == "0" || v.is_empty() => return None,
        Some(v) => return Some(PathBuf::from(v)),
        None => {}
    }
    // XDG_CACHE_HOME and HOME: the user's environment (inputs), not torchcomms knobs.
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("torchcomms").join("kernels"))
}

/// Picks the target for compute capability `cc`: the CUBIN of the device's own architecture
/// when NVRTC knows it, else PTX of the newest one it knows below.
fn pick_target(archs: &[i32], cc: (i32, i32)) -> Option<(String, bool)> {
    let want = cc.0 * 10 + cc.1;
    if archs.contains(&want) {
        return Some((format!("sm_{want}"), true));
    }
    archs
        .iter()
        .copied()
        .filter(|&a| a <= want)
        .max()
        .map(|a| (format!("compute_{a}"), false))
}

/// Compiles `source` (named `name`) for a device of compute capability `cc` under driver
/// `driver_version`, or reads the result from the cache.
pub fn compile(name: &str, source: &str, cc: (i32, i32), driver_version: i32) -> Result<Image> {
    let nv = nvrtc()?;
    let (target, cubin) = pick_target(&nv.archs, cc).ok_or_else(|| CudaError::Compile {
        source_name: name.into(),
        arch: format!("sm_{}{}", cc.0, cc.1),
        log: format!(
            "NVRTC {}.{} supports none of the architectures up to this device's (it knows {:?})",
            nv.version.0, nv.version.1, nv.archs
        ),
    })?;
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    for o in OPTIONS {
        h.update(o.as_bytes());
    }
    h.update(format!("nvrtc {}.{}", nv.version.0, nv.version.1).as_bytes());
    let digest: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let stem = name.rsplit('/').next().unwrap_or(name).replace('.', "_");
    let file = format!(
        "{stem}-{digest}-{target}-drv{driver_version}.{}",
        if cubin { "cubin" } else { "ptx" }
    );
    let cache_path = cache_dir().map(|d| d.join(file));
    if let Some(p) = &cache_path {
        if let Ok(bytes) = std::fs::read(p) {
            if !bytes.is_empty() {
                tracing::debug!(path = %p.display(), "kernel from cache");
                return Ok(Image {
                    bytes,
                    target,
                    cache_path,
                    from_cache: true,
                });
            }
        }
    }
    let bytes = compile_now(name, source, &target, cubin)?;
    if let Some(p) = &cache_path {
        if let Err(e) = store(p, &bytes) {
            // A read-only home must not stop the job: the next run compiles again.
            tracing::warn!("{e}");
        }
    }
    Ok(Image {
        bytes,
        target,
        cache_path,
        from_cache: false,
    })
}

fn store(path: &PathBuf, bytes: &[u8]) -> Result<()> {
    let fail = |reason: String| CudaError::Cache {
        path: path.clone(),
        reason,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| fail(format!("creating the folder: {e}")))?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| fail(format!("writing: {e}")))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        fail(format!("renaming into place: {e}"))
    })
}

/// One NVRTC compilation; the program is destroyed on every path.
fn compile_now(name: &str, source: &str, target: &str, cubin: bool) -> Result<Vec<u8>> {
    let nverr = |call: &'static str| move |source| CudaError::Nvrtc { call, source };
    let src = CString::new(source).map_err(|_| CudaError::BadArgument {
        call: "nvrtcCreateProgram",
        detail: format!("{name} holds a NUL byte"),
    })?;
    let cname = CString::new(name).unwrap_or_default();
    let prog = nv::create_program(&src, Some(&cname)).map_err(nverr("nvrtcCreateProgram"))?;
    struct Guard(nvsys::nvrtcProgram);
    impl Drop for Guard {
        fn drop(&mut self) {
            // SAFETY: created above and destroyed only here.
            if let Err(e) = unsafe { nv::destroy_program(self.0) } {
                tracing::warn!("nvrtcDestroyProgram: {e}");
            }
        }
    }
    let prog = Guard(prog);
    let mut opts: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    opts.push(format!("--gpu-architecture={target}"));
    // SAFETY: `prog` is a live program.
    if let Err(e) = unsafe { nv::compile_program(prog.0, &opts) } {
        // SAFETY: as above.
        let log = unsafe { nv::get_program_log(prog.0) }
            .map(|l| c_chars_to_string(&l))
            .unwrap_or_else(|_| format!("(no log; {e})"));
        return Err(CudaError::Compile {
            source_name: name.into(),
            arch: target.into(),
            log,
        });
    }
    if cubin {
        let mut size = 0usize;
        // SAFETY: `prog` compiled; the buffer has the size NVRTC reported.
        unsafe {
            nvsys::nvrtcGetCUBINSize(prog.0, &mut size)
                .result()
                .map_err(nverr("nvrtcGetCUBINSize"))?;
            let mut out = vec![0u8; size];
            nvsys::nvrtcGetCUBIN(prog.0, out.as_mut_ptr().cast::<c_char>())
                .result()
                .map_err(nverr("nvrtcGetCUBIN"))?;
            Ok(out)
        }
    } else {
        // SAFETY: `prog` compiled.
        let ptx = unsafe { nv::get_ptx(prog.0) }.map_err(nverr("nvrtcGetPTX"))?;
        // get_ptx includes the terminating NUL, which cuModuleLoadData needs.
        Ok(ptx.iter().map(|&c| c as u8).collect())
    }
}

fn c_chars_to_string(v: &[c_char]) -> String {
    let bytes: Vec<u8> = v.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let archs = [75, 80, 86, 89, 90, 100, 120];
        assert_eq!(pick_target(&archs, (9, 0)), Some(("sm_90".into(), true)));
        assert_eq!(
            pick_target(&archs, (9, 5)),
            Some(("compute_90".into(), false))
        );
        assert_eq!(pick_target(&archs, (7, 0)), None);
    }

    #[test]
    fn cache_dir_follows_the_environment() {
        // Only reads: other tests may run in parallel, so the environment is not changed here.
        if torchcomms_cvars::torchcomms_kernel_cache().is_none() {
            if let Some(d) = cache_dir() {
                assert!(d.ends_with("torchcomms/kernels"), "{}", d.display());
            }
        }
    }
}
