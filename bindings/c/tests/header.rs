//! The committed header is what cbindgen generates from the code today, plus the prototypes of
//! the operations generated from the table of operations (`torchcomms_core::ops::OPS`, which
//! cbindgen cannot see through the macro), so it cannot drift. Regenerate it with
//! `TORCHCOMMS_BLESS=1 cargo test -p torchcomms-c --test header`.

use std::path::{Path, PathBuf};

use torchcomms_core::ops::{ArgKind, OPS};

/// Where the operations' prototypes go: before the end of the `extern "C"` block.
const OPS_BEFORE: &str = "#ifdef __cplusplus\n}  // extern \"C\"";

/// The prototypes of the table's operations, as cbindgen writes functions (`ffi/ops.rs` defines
/// them: the same parameters, in the same order).
fn op_prototypes() -> String {
    let mut out = String::new();
    for op in OPS {
        for line in op.doc {
            out.push_str(format!("//{line}").trim_end());
            out.push('\n');
        }
        out.push_str(
            "//\n// # Safety\n// Pointers as in the conventions atop torchcomms.h; tensors as in \
             `tc_tensor_t`; a\n// list or split-size array NULL or holding its `_len` count of \
             elements.\n",
        );
        let mut params = vec!["struct tc_comm_t *comm".to_string()];
        for a in op.args {
            match a.kind {
                ArgKind::Tensor => params.push(format!("struct tc_tensor_t {}", a.name)),
                ArgKind::Tensors => {
                    params.push(format!("const struct tc_tensor_t *{}", a.name));
                    params.push(format!("size_t {}_len", a.name));
                }
                ArgKind::Rank => params.push(format!("int32_t {}", a.name)),
                ArgKind::Persistent => params.push(format!("struct tc_all_gather_p_t *{}", a.name)),
                ArgKind::ReduceOp => params.push(format!("tc_reduce_op_t {}", a.name)),
                ArgKind::Splits => {
                    params.push(format!("const size_t *{}", a.name));
                    params.push(format!("size_t {}_len", a.name));
                }
            }
        }
        params.extend([
            "void *stream".to_string(),
            "const struct tc_op_options_t *options".to_string(),
            "struct tc_work_t **work".to_string(),
        ]);
        let head = format!("enum tc_status_t tc_{}(", op.name);
        let indent = " ".repeat(head.len());
        out.push_str(&head);
        out.push_str(&params.join(&format!(",\n{indent}")));
        out.push_str(");\n\n");
    }
    out
}

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
    let text = String::from_utf8(out).expect("UTF-8 header");
    let at = text
        .find(OPS_BEFORE)
        .unwrap_or_else(|| panic!("the header has no `{OPS_BEFORE}`"));
    format!("{}{}{}", &text[..at], op_prototypes(), &text[at..]).into_bytes()
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
    let mut exported: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(crate_dir().join("src/ffi")).expect("read src/ffi") {
        let src = std::fs::read_to_string(entry.expect("entry").path()).expect("read source");
        exported.extend(
            src.split("extern \"C\" fn ")
                .skip(1)
                .filter_map(|rest| rest.split('(').next())
                .filter(|name| name.starts_with("tc_"))
                .map(str::to_string),
        );
    }
    exported.extend(OPS.iter().map(|op| format!("tc_{}", op.name)));
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
