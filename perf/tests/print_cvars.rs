//! `torchcomms-perf --print-cvars`: every cvar with its effective value and source.

use std::process::Command;

fn perf() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_torchcomms-perf"));
    for v in [
        "TORCHCOMMS_CONFIG",
        "CTRAN_CHUNK_BYTES",
        "TORCHCOMMS_TRACE_BUFFER_SIZE",
    ] {
        c.env_remove(v);
    }
    c
}

#[test]
fn prints_every_cvar_with_value_and_source() {
    let dir = std::env::temp_dir().join(format!("perf-cvars-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tc.yaml");
    std::fs::write(&file, "TORCHCOMMS_TRACE_BUFFER_SIZE: 99\n").unwrap();
    let out = perf()
        .arg("--print-cvars")
        .env("CTRAN_CHUNK_BYTES", "2M")
        .env("TORCHCOMMS_CONFIG", &file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |name: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(line("CTRAN_CHUNK_BYTES"), "2M environment");
    assert_eq!(
        line("TORCHCOMMS_TRACE_BUFFER_SIZE"),
        format!("99 file {}", file.display())
    );
    assert_eq!(line("TORCHCOMM_TIMEOUT_SECONDS"), "600s default");
    assert_eq!(line("CTRAN_SOCKET_IFADDR"), "(unset) default");
    assert_eq!(
        text.lines().count(),
        torchcomms_cvars::SPECS.len() + 1,
        "one line per cvar plus the header:\n{text}"
    );
}

#[test]
fn an_invalid_value_is_an_error_naming_it() {
    let out = perf()
        .arg("--print-cvars")
        .env("CTRAN_CHUNK_BYTES", "lots")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("CTRAN_CHUNK_BYTES") && err.contains("lots") && err.contains(">= 4096"),
        "{err}"
    );
}
