//! The committed header is what cbindgen generates from the code today, so it cannot drift.
//! Regenerate it with `TORCHCOMMS_BLESS=1 cargo test -p torchcomms-c --test header`.

use std::path::{Path, PathBuf};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The header cbindgen generates from `src/` with `cbindgen.toml`.
fn generate(dir: &Path) -> Vec<u8> {
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("read cbindgen.toml: {e}"));
    // Parsing from the source file (following `mod` declarations) needs no `cargo metadata`.
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen: {e}"));
    let mut out = Vec::new();
    bindings.write(&mut out);
    out
}

#[test]
fn committed_header_matches_the_code() {
    let dir = crate_dir();
    let path = dir.join("include/torchcomms.h");
    let fresh = generate(&dir);
    if std::env::var_os("TORCHCOMMS_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    if committed != fresh {
        let fresh_path = std::env::temp_dir().join(format!("torchcomms.h.{}", std::process::id()));
        let _ = std::fs::write(&fresh_path, &fresh);
        let first_diff = String::from_utf8_lossy(&committed)
            .lines()
            .zip(String::from_utf8_lossy(&fresh).lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .map(|(i, (a, b))| format!("line {}:\n  committed: {a}\n  generated: {b}", i + 1))
            .unwrap_or_else(|| "one file is a prefix of the other".into());
        panic!(
            "{} is out of date with bindings/c/src ({first_diff}).\nThe generated header is at {}.\n\
             Regenerate: TORCHCOMMS_BLESS=1 cargo test -p torchcomms-c --test header",
            path.display(),
            fresh_path.display()
        );
    }
}

#[test]
fn header_declares_every_exported_function() {
    let header = String::from_utf8(generate(&crate_dir())).expect("UTF-8 header");
    let src = std::fs::read_to_string(crate_dir().join("src/ffi.rs")).expect("read src/ffi.rs");
    let exported: Vec<&str> = src
        .split("extern \"C\" fn ")
        .skip(1)
        .filter_map(|rest| rest.split('(').next())
        .collect();
    assert!(
        exported.len() > 40,
        "found only {} entry points",
        exported.len()
    );
    for name in exported {
        assert!(
            header.contains(&format!("{name}(")),
            "{name} is not in the header"
        );
    }
}
