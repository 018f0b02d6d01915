//! Embeds kernels compiled ahead of time, when `TORCHCOMMS_PREBUILT_KERNELS` names a folder
//! made by `torchcomms-prebuild-kernels` (CUBIN files and `NVRTC_VERSION`): a first
//! communicator then loads them instead of compiling at run time. Without it the table is
//! empty and kernels compile at first use, as before.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=TORCHCOMMS_PREBUILT_KERNELS");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut code = String::new();
    let dir = std::env::var_os("TORCHCOMMS_PREBUILT_KERNELS").map(PathBuf::from);
    let (version, files) = match dir.as_deref().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => read_dir(d),
        None => ((0, 0), Vec::new()),
    };
    writeln!(
        code,
        "/// NVRTC (major, minor) that compiled [`PREBUILT`].\n\
         pub(crate) const PREBUILT_NVRTC: (i32, i32) = ({}, {});",
        version.0, version.1
    )
    .expect("write to a String");
    code.push_str("/// (file name, CUBIN) of every kernel image compiled ahead of time.\n");
    code.push_str("pub(crate) static PREBUILT: &[(&str, &[u8])] = &[\n");
    for (name, path) in files {
        writeln!(
            code,
            "    ({name:?}, include_bytes!({:?})),",
            path.display()
        )
        .expect("write to a String");
    }
    code.push_str("];\n");
    std::fs::write(out.join("prebuilt.rs"), code).expect("write prebuilt.rs into OUT_DIR");
}

/// The NVRTC version and the CUBIN files of folder `d` (absolute paths, sorted).
fn read_dir(d: &Path) -> ((i32, i32), Vec<(String, PathBuf)>) {
    println!("cargo:rerun-if-changed={}", d.display());
    let d = d
        .canonicalize()
        .unwrap_or_else(|e| panic!("TORCHCOMMS_PREBUILT_KERNELS={}: {e}", d.display()));
    let version_file = d.join("NVRTC_VERSION");
    let text = std::fs::read_to_string(&version_file).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (make the folder with torchcomms-prebuild-kernels)",
            version_file.display()
        )
    });
    let (major, minor) = text
        .trim()
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        .unwrap_or_else(|| {
            panic!(
                "{}: expected MAJOR.MINOR, got {text:?}",
                version_file.display()
            )
        });
    let mut files: Vec<(String, PathBuf)> = std::fs::read_dir(&d)
        .unwrap_or_else(|e| panic!("{}: {e}", d.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cubin"))
        .map(|p| {
            println!("cargo:rerun-if-changed={}", p.display());
            let name = p
                .file_name()
                .expect("a file")
                .to_string_lossy()
                .into_owned();
            (name, p)
        })
        .collect();
    files.sort();
    ((major, minor), files)
}
