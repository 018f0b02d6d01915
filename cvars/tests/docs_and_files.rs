//! `docs/cvars.md` matches `cvars.toml`, and configuration files (TOML, YAML) are read with the
//! right precedence and clear errors.

use std::path::{Path, PathBuf};

use torchcomms_cvars::{markdown, Cvars, Error, Source};

fn docs_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cvars.md")
}

#[test]
fn committed_docs_are_generated_from_cvars_toml() {
    let want = markdown();
    let path = docs_path();
    if std::env::var("CVARS_UPDATE_DOCS").as_deref() == Ok("1") {
        std::fs::write(&path, &want).expect("write docs/cvars.md");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/cvars.md is stale: regenerate it with `CVARS_UPDATE_DOCS=1 cargo test -p torchcomms-cvars --test docs_and_files`"
    );
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cvars-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn with_file(path: &Path, extra: &'static [(&'static str, &'static str)]) -> Result<Cvars, Error> {
    let p = path.display().to_string();
    Cvars::load_from(move |k| {
        if k == "TORCHCOMMS_CONFIG" {
            return Some(p.clone());
        }
        extra
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
}

#[test]
fn toml_file_values_sit_between_defaults_and_environment() {
    let f = temp_file(
        "a.toml",
        "CTRAN_CHUNK_BYTES = \"4M\"\nCTRAN_BACKENDS = [\"socket\"]\nTORCHCOMMS_TRACE_BUFFER_SIZE = 10\n\
         torchcomm_timeout_seconds = 30\nTORCHCOMM_ABORT_ON_ERROR = false\n",
    );
    let cv = with_file(&f, &[("TORCHCOMMS_TRACE_BUFFER_SIZE", "20")]).unwrap();
    assert_eq!(cv.ctran_chunk_bytes(), 4 << 20);
    assert_eq!(cv.ctran_backends(), &["socket"]);
    assert_eq!(cv.torchcomm_timeout_seconds().as_secs(), 30);
    assert!(!cv.torchcomm_abort_on_error());
    assert_eq!(cv.torchcomms_trace_buffer_size(), 20);
    assert_eq!(
        cv.entry("CTRAN_CHUNK_BYTES").unwrap().source,
        Source::File(f.clone())
    );
    assert_eq!(
        cv.entry("TORCHCOMMS_TRACE_BUFFER_SIZE").unwrap().source,
        Source::Env
    );
    assert_eq!(
        cv.entry("CTRAN_SHM_BUFFER_BYTES").unwrap().source,
        Source::Default
    );
    assert_eq!(cv.file(), Some(f.as_path()));
    assert!(cv.table().contains(&format!("file {}", f.display())));
}

#[test]
fn yaml_file_is_read_too() {
    let f = temp_file(
        "b.yaml",
        "CTRAN_ALLREDUCE_ALGO: ring\nCTRAN_BACKENDS:\n  - shm\n  - socket\nCTRAN_COST_ALPHA_US: 7.5\n",
    );
    let cv = with_file(&f, &[]).unwrap();
    assert_eq!(cv.ctran_allreduce_algo(), "ring");
    assert_eq!(cv.ctran_backends(), &["shm", "socket"]);
    assert_eq!(cv.ctran_cost_alpha_us(), Some(7.5));
}

#[test]
fn file_errors_are_clear() {
    let bad_value = temp_file("c.toml", "CTRAN_CHUNK_BYTES = \"huge\"\n");
    let e = with_file(&bad_value, &[]).unwrap_err().to_string();
    assert!(
        e.contains("CTRAN_CHUNK_BYTES")
            && e.contains("huge")
            && e.contains(&bad_value.display().to_string()),
        "{e}"
    );

    let typo = temp_file("d.toml", "CTRAN_CHUNK_BYTE = \"4M\"\n");
    let e = with_file(&typo, &[]).unwrap_err().to_string();
    assert!(
        e.contains("CTRAN_CHUNK_BYTE") && e.contains("did you mean CTRAN_CHUNK_BYTES"),
        "{e}"
    );

    let broken = temp_file("e.toml", "CTRAN_CHUNK_BYTES = [\n");
    let e = with_file(&broken, &[]).unwrap_err();
    assert!(matches!(e, Error::ConfigFile { .. }), "{e}");

    let missing = Path::new("/nonexistent/torchcomms.toml");
    let e = with_file(missing, &[]).unwrap_err().to_string();
    assert!(
        e.contains("TORCHCOMMS_CONFIG") && e.contains("no such file"),
        "{e}"
    );

    let ini = temp_file("f.ini", "x=1\n");
    let e = with_file(&ini, &[]).unwrap_err().to_string();
    assert!(e.contains("unknown format"), "{e}");
}
