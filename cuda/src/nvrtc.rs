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
//!
//! A build can also embed CUBINs compiled ahead of time (`TORCHCOMMS_PREBUILT_KERNELS` at build
//! time, a folder made by `torchcomms-prebuild-kernels`): a device of one of their
//! architectures then compiles nothing, not even on a fresh machine.

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
    /// True when read from the cache or compiled ahead of time (nothing was compiled).
    pub from_cache: bool,
    /// True when compiled ahead of time into this build.
    pub prebuilt: bool,
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

/// The name of `source`'s image for `target` among the kernels compiled ahead of time: its
/// file stem, a SHA-256 of the source and the options, and the target.
pub fn prebuilt_name(name: &str, source: &str, target: &str) -> String {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    for o in OPTIONS {
        h.update(o.as_bytes());
    }
    format!("{}-{}-{target}.cubin", stem(name), hex8(&h.finalize()))
}

pub(crate) fn stem(name: &str) -> String {
    name.rsplit('/').next().unwrap_or(name).replace('.', "_")
}

pub(crate) fn hex8(digest: &[u8]) -> String {
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The image compiled ahead of time for `source` on a device of compute capability `cc`, if
/// `table` (made by NVRTC `nvrtc`) has one the driver can load: a CUBIN of exactly the
/// device's architecture, from an NVRTC whose major version the driver supports (CUDA's
/// minor-version compatibility covers CUBINs).
pub fn find_prebuilt<'a>(
    table: &[(&str, &'a [u8])],
    nvrtc: (i32, i32),
    name: &str,
    source: &str,
    cc: (i32, i32),
    driver_version: i32,
) -> Option<&'a [u8]> {
    if nvrtc.0 == 0 || driver_version / 1000 < nvrtc.0 {
        return None;
    }
    let file = prebuilt_name(name, source, &format!("sm_{}{}", cc.0, cc.1));
    table.iter().find(|(n, _)| *n == file).map(|(_, b)| *b)
}

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/prebuilt.rs"));
}

/// How many kernel images this build embeds (compiled ahead of time), and by which NVRTC.
pub fn prebuilt_count() -> (usize, (i32, i32)) {
    (embedded::PREBUILT.len(), embedded::PREBUILT_NVRTC)
}

/// Compiles `source` into a CUBIN for `target` (`sm_90`) now, without the cache: what
/// `torchcomms-prebuild-kernels` embeds into a build.
pub fn compile_cubin(name: &str, source: &str, target: &str) -> Result<Vec<u8>> {
    nvrtc()?;
    compile_now(name, source, target, true)
}

/// Compiles `source` (named `name`) for a device of compute capability `cc` under driver
/// `driver_version`, or takes it from the kernels compiled ahead of time into this build, or
/// reads it from the cache.
pub fn compile(name: &str, source: &str, cc: (i32, i32), driver_version: i32) -> Result<Image> {
    compile_with(name, source, cc, driver_version, true)
}

/// [`compile`], but `use_prebuilt: false` skips the kernels compiled ahead of time (a driver
/// that refused to load one).
pub fn compile_with(
    name: &str,
    source: &str,
    cc: (i32, i32),
    driver_version: i32,
    use_prebuilt: bool,
) -> Result<Image> {
    let prebuilt = use_prebuilt
        .then(|| {
            find_prebuilt(
                embedded::PREBUILT,
                embedded::PREBUILT_NVRTC,
                name,
                source,
                cc,
                driver_version,
            )
        })
        .flatten();
    if let Some(bytes) = prebuilt {
        tracing::debug!(name, "kernel compiled ahead of time");
        return Ok(Image {
            bytes: bytes.to_vec(),
            target: format!("sm_{}{}", cc.0, cc.1),
            cache_path: None,
            from_cache: true,
            prebuilt: true,
        });
    }
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
    let digest = hex8(&h.finalize());
    let stem = stem(name);
    let file = format!(
        "{stem}-{digest}-{target}-drv{driver_version}.{}",
        if cubin { "cubin" } else { "ptx" }
    );
    let cache_path = cache_dir().map(|d| d.join(file));
    let (bytes, from_cache) = through_cache(cache_path.as_ref(), || {
        compile_now(name, source, &target, cubin)
    })?;
    Ok(Image {
        bytes,
        target,
        cache_path,
        from_cache,
        prebuilt: false,
    })
}

/// The image in the cache file `path` when there is one, else `compile`'s, stored there for the
/// next process; `true` when it came from the file. Shared by NVRTC's and hiprtc's output.
pub(crate) fn through_cache(
    path: Option<&PathBuf>,
    compile: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<(Vec<u8>, bool)> {
    if let Some(p) = path {
        if let Ok(bytes) = std::fs::read(p) {
            if !bytes.is_empty() {
                tracing::debug!(path = %p.display(), "kernel from cache");
                return Ok((bytes, true));
            }
        }
    }
    let bytes = compile()?;
    if let Some(p) = path {
        if let Err(e) = store(p, &bytes) {
            // A read-only home must not stop the job: the next run compiles again.
            tracing::warn!("{e}");
        }
    }
    Ok((bytes, false))
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
    fn a_prebuilt_image_is_found_for_its_source_architecture_and_a_driver_of_its_major() {
        let (name, src) = ("ctran/src/x.cu", "__global__ void k() {}");
        let file = prebuilt_name(name, src, "sm_90");
        assert!(
            file.starts_with("x_cu-") && file.ends_with("-sm_90.cubin"),
            "{file}"
        );
        let image: &[u8] = b"cubin";
        let table = [(file.as_str(), image)];
        let find = |src: &str, cc, drv| find_prebuilt(&table, (13, 5), name, src, cc, drv);
        assert_eq!(
            find(src, (9, 0), 13000),
            Some(image),
            "a 13.0 driver loads 13.5 CUBINs"
        );
        assert_eq!(find(src, (9, 0), 12080), None, "a 12.x driver cannot");
        assert_eq!(find(src, (10, 0), 13000), None, "another architecture");
        assert_eq!(find("changed", (9, 0), 13000), None, "another source");
        assert_eq!(
            find_prebuilt(&table, (0, 0), name, src, (9, 0), 13000),
            None,
            "an empty build"
        );
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
