//! Finding NVIDIA's shared libraries at run time, without a CUDA toolkit at build time and
//! without starting another process (some MPI launchers forbid fork).
//!
//! Every library is looked for, in order:
//! 1. the library's own override variable (`NCCL_LIB_PATH`, `TORCHCOMMS_NVRTC_LIB`,
//!    `TORCHCOMMS_CUDA_DRIVER_LIB`): a file, or a folder holding it;
//! 2. the folders of `LD_LIBRARY_PATH`;
//! 3. `$CUDA_HOME`, `$CUDA_PATH` and `$CUDA_ROOT` (`lib64`, `lib`, `targets/<arch>-linux/lib`);
//! 4. the `lib` folders of the `nvidia` Python package that PyTorch's wheels install
//!    (`nvidia/*/lib`, `nvidia/cu13/lib`): the folders the embedding interpreter registered
//!    ([`add_nvidia_roots`], which the Python package calls at import, from `nvidia.__path__`),
//!    then the `site-packages` folders the environment names (`TORCHCOMMS_SITE_PACKAGES`,
//!    `PYTHONPATH`, `$VIRTUAL_ENV`, `$CONDA_PREFIX`, `$PYTHONUSERBASE` or `~/.local`) and the
//!    system's (`/usr/local/lib/python3*/`, `/usr/lib/python3*/`); `TORCHCOMMS_NO_PYTHON_LIBS=1`
//!    skips this step;
//! 5. the system loader's own search (`ld.so.cache`, `RUNPATH`), by file name.
//!
//! No absolute path is built in beyond the system's Python prefixes. A library is opened with
//! `RTLD_GLOBAL`, so that a later `dlopen` of the same soname (cudarc's loaders open
//! `libnvrtc.so.13` by name) finds it.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use super::error::{CudaError, Result};

/// `nvidia` package folders registered by an embedding interpreter.
static REGISTERED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Registers folders of the `nvidia` Python namespace package (`nvidia.__path__` of the
/// interpreter this library runs in): their `*/lib` folders are searched before any other
/// Python environment's.
pub fn add_nvidia_roots(roots: impl IntoIterator<Item = PathBuf>) {
    let mut r = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    for root in roots {
        if root.is_dir() && !r.contains(&root) {
            r.push(root);
        }
    }
}

/// Folders searched for NVIDIA libraries (steps 2 to 4 above), without duplicates.
pub fn search_dirs() -> Vec<PathBuf> {
    static FIXED: OnceLock<(Vec<PathBuf>, Vec<PathBuf>)> = OnceLock::new();
    let (before, python) = FIXED.get_or_init(|| {
        let mut before: Vec<PathBuf> = Vec::new();
        // LD_LIBRARY_PATH, CUDA_HOME/CUDA_PATH/CUDA_ROOT (below), VIRTUAL_ENV, CONDA_PREFIX,
        // PYTHONPATH and PYTHONUSERBASE describe the machine's installation, set by the
        // system, CUDA or the Python environment: inputs, read directly; our own knobs are
        // cvars (cvars/cvars.toml).
        if let Some(v) = std::env::var_os("LD_LIBRARY_PATH") {
            before.extend(std::env::split_paths(&v));
        }
        for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
            if let Some(root) = std::env::var_os(var).map(PathBuf::from) {
                before.push(root.join("lib64"));
                before.push(root.join("lib"));
                before.push(
                    root.join("targets")
                        .join(format!("{}-linux", std::env::consts::ARCH))
                        .join("lib"),
                );
            }
        }
        let python = if torchcomms_cvars::current().torchcomms_no_python_libs() {
            Vec::new()
        } else {
            site_packages()
                .iter()
                .map(|sp| sp.join("nvidia"))
                .flat_map(|root| nvidia_lib_dirs(&root))
                .collect()
        };
        (before, python)
    });
    let registered: Vec<PathBuf> = REGISTERED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .flat_map(|root| nvidia_lib_dirs(root))
        .collect();
    let mut dirs: Vec<PathBuf> = Vec::new();
    for d in before.iter().chain(&registered).chain(python) {
        if d.is_dir() && !dirs.contains(d) {
            dirs.push(d.clone());
        }
    }
    dirs
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

/// `site-packages` (and Debian's `dist-packages`) folders of the Python environments the
/// environment names, then the system's, most specific first.
fn site_packages() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let cv = torchcomms_cvars::current();
    out.extend(std::env::split_paths(cv.torchcomms_site_packages()));
    if let Some(v) = std::env::var_os("PYTHONPATH") {
        out.extend(std::env::split_paths(&v));
    }
    let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONUSERBASE"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(PathBuf::from))
        .collect();
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(home).join(".local"));
    }
    prefixes.extend(["/usr/local", "/usr"].map(PathBuf::from));
    for prefix in prefixes {
        let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pythons.sort();
        for py in pythons {
            out.push(py.join("site-packages"));
            out.push(py.join("dist-packages"));
        }
    }
    out.retain(|d| d.is_dir());
    out
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
