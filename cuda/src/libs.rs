//! Finding NVIDIA's shared libraries at run time, without a CUDA toolkit at build time.
//!
//! Every library is looked for, in order:
//! 1. the library's own override variable (`NCCL_LIB_PATH`, `TORCHCOMMS_NVRTC_LIB`,
//!    `TORCHCOMMS_CUDA_DRIVER_LIB`): a file, or a folder holding it;
//! 2. the folders of `LD_LIBRARY_PATH`;
//! 3. `$CUDA_HOME`, `$CUDA_PATH` and `$CUDA_ROOT` (`lib64`, `lib`, `targets/<arch>-linux/lib`);
//! 4. the `lib` folders of the `nvidia` Python package that PyTorch's wheels install
//!    (`site-packages/nvidia/*/lib`, `nvidia/cu13/lib`), found by asking `python3`
//!    (`TORCHCOMMS_PYTHON` names another interpreter, `TORCHCOMMS_NO_PYTHON_LIBS=1` skips this)
//!    and under `$VIRTUAL_ENV` and `$CONDA_PREFIX`;
//! 5. the system loader's own search (`ld.so.cache`, `RUNPATH`), by file name.
//!
//! No absolute path is built in. A library is opened with `RTLD_GLOBAL`, so that a later
//! `dlopen` of the same soname (cudarc's loaders open `libnvrtc.so.13` by name) finds it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::error::{CudaError, Result};

/// Folders searched for NVIDIA libraries (steps 2 to 4 above), without duplicates.
pub fn search_dirs() -> &'static [PathBuf] {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let mut dirs: Vec<PathBuf> = Vec::new();
        let mut push = |d: PathBuf| {
            if d.is_dir() && !dirs.contains(&d) {
                dirs.push(d);
            }
        };
        // LD_LIBRARY_PATH, CUDA_HOME/CUDA_PATH/CUDA_ROOT (below), VIRTUAL_ENV and CONDA_PREFIX
        // describe the machine's installation, set by the system, CUDA or the Python
        // environment: inputs, read directly; our own knobs are cvars (cvars/cvars.toml).
        if let Some(v) = std::env::var_os("LD_LIBRARY_PATH") {
            std::env::split_paths(&v).for_each(&mut push);
        }
        for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
            if let Some(root) = std::env::var_os(var).map(PathBuf::from) {
                push(root.join("lib64"));
                push(root.join("lib"));
                push(
                    root.join("targets")
                        .join(format!("{}-linux", std::env::consts::ARCH))
                        .join("lib"),
                );
            }
        }
        for root in python_nvidia_roots() {
            for d in nvidia_lib_dirs(&root) {
                push(d);
            }
        }
        dirs
    })
}

/// The `lib` folders under one `nvidia` package folder: `nvidia/<pkg>/lib`.
fn nvidia_lib_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(root) {
        let mut subs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        subs.sort();
        for s in subs {
            let lib = s.join("lib");
            if lib.is_dir() {
                out.push(lib);
            }
        }
    }
    out
}

/// Folders of the `nvidia` Python namespace package (PyTorch's CUDA wheels).
fn python_nvidia_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    let cv = torchcomms_cvars::current();
    if cv.torchcomms_no_python_libs() {
        return roots;
    }
    let python = cv.torchcomms_python().to_string();
    // Only the nvidia namespace package is imported (not torch), which takes milliseconds.
    let script = "import sys\ntry:\n import nvidia\n print('\\n'.join(nvidia.__path__))\n\
                  except Exception:\n pass\n";
    match Command::new(&python)
        .args(["-c", script])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let p = PathBuf::from(line.trim());
                if !line.trim().is_empty() && p.is_dir() {
                    roots.push(p);
                }
            }
        }
        Ok(_) => {}
        Err(e) => tracing::debug!(%python, "no Python to ask for NVIDIA's wheels: {e}"),
    }
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        let Some(prefix) = std::env::var_os(var).map(PathBuf::from) else {
            continue;
        };
        let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
            continue;
        };
        for e in entries.flatten() {
            let nv = e.path().join("site-packages").join("nvidia");
            if e.file_name().to_string_lossy().starts_with("python") && nv.is_dir() {
                roots.push(nv);
            }
        }
    }
    roots
}

/// The paths to try for a library: the override, then `names` in every search folder, then
/// the bare names for the system loader.
pub fn candidates(override_var: Option<&str>, names: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    // The override is a cvar (`NCCL_LIB_PATH`, `TORCHCOMMS_NVRTC_LIB`, ...): from the
    // environment or the `TORCHCOMMS_CONFIG` file.
    let cv = torchcomms_cvars::current();
    if let Some(p) = override_var
        .and_then(|v| cv.entry(v))
        .filter(|e| e.is_set && !e.value.is_empty())
        .map(|e| PathBuf::from(&e.value))
    {
        if p.is_dir() {
            out.extend(names.iter().map(|n| p.join(n)).filter(|f| f.exists()));
        } else {
            out.push(p);
        }
    }
    for d in search_dirs() {
        out.extend(names.iter().map(|n| d.join(n)).filter(|f| f.exists()));
    }
    out.extend(names.iter().map(PathBuf::from));
    out
}

/// A library opened by [`open`], and where it was found.
#[derive(Debug)]
pub struct Opened {
    /// The path (or bare name) that loaded.
    pub path: PathBuf,
    /// The library.
    pub lib: libloading::Library,
}

/// Opens the first candidate that loads, with `RTLD_NOW | RTLD_GLOBAL`.
pub fn open(label: &str, override_var: Option<&str>, names: &[&str]) -> Result<Opened> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    let cands = candidates(override_var, names);
    let mut reason = String::from("no candidate");
    for c in &cands {
        // SAFETY: loading runs the library's initialisers; NVIDIA's libraries are meant to be
        // loaded this way (their own tools dlopen them).
        match unsafe { Library::open(Some(c), RTLD_NOW | RTLD_GLOBAL) } {
            Ok(lib) => {
                tracing::debug!(label, path = %c.display(), "loaded");
                return Ok(Opened {
                    path: c.clone(),
                    lib: lib.into(),
                });
            }
            Err(e) => reason = e.to_string(),
        }
    }
    let searched = cands
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    Err(CudaError::LibraryNotFound {
        lib: label.into(),
        reason,
        searched,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_names_come_last() {
        let c = candidates(None, &["libtorchcomms-test-absent.so.1"]);
        assert_eq!(
            c.last().map(PathBuf::as_path),
            Some(Path::new("libtorchcomms-test-absent.so.1"))
        );
        let e = open("libabsent", None, &["libtorchcomms-test-absent.so.1"]).unwrap_err();
        assert!(
            e.to_string().contains("libtorchcomms-test-absent.so.1"),
            "{e}"
        );
    }
}
