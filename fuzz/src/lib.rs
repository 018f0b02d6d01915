//! The bodies of the fuzz targets of torchcomms-rs, one per decoder of bytes that another
//! process or a file wrote (see `docs/fuzzing.md`).
//!
//! They live in a normal crate so that two drivers share them: libFuzzer (`fuzz/libfuzzer`, a
//! crate of its own because it needs instrumentation flags) and the regression tests of this
//! crate (`tests/regressions.rs`), which run every corpus file and every past crash under a
//! plain `cargo test`. A body returns normally on any input; a panic is a finding.

mod seeds;

pub use seeds::seeds;

/// One fuzz target: its name (also its corpus folder, `fuzz/corpus/<name>`) and its body.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// Name of the target, of its libFuzzer binary and of its corpus folder.
    pub name: &'static str,
    /// What the bytes are.
    pub what: &'static str,
    /// Runs the decoder on the bytes.
    pub run: fn(&[u8]),
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "tcpstore_server",
        what: "TCPStore requests decoded and run by the server",
        run: torchcomms_core::bootstrap::tcp_store::fuzz::server_requests,
    },
    Target {
        name: "tcpstore_client",
        what: "TCPStore replies decoded by the client",
        run: torchcomms_core::bootstrap::tcp_store::fuzz::client_replies,
    },
    Target {
        name: "socket_frame",
        what: "TCP transport frame header (and an abort notice's reason)",
        run: ctran::fuzzing::socket_frame,
    },
    Target {
        name: "socket_hello",
        what: "TCP mesh set-up hello",
        run: ctran::fuzzing::socket_hello,
    },
    Target {
        name: "shm_slot",
        what: "shared-memory FIFO indices and slot headers written by a local peer",
        run: ctran::fuzzing::shm_slot,
    },
    Target {
        name: "init_records",
        what: "records ranks publish at creation (store) and at split (all_gather)",
        run: ctran::fuzzing::init_records,
    },
    Target {
        name: "rdma_frame",
        what: "frames of the RDMA transfer API's connection (requests and responses of the peer)",
        run: ctran::fuzzing::rdma_frame,
    },
    Target {
        name: "rdma_text",
        what: "an RDMA access key or peer URL handed over by the peer",
        run: ctran::fuzzing::rdma_text,
    },
    Target {
        name: "ib_control",
        what: "control slots of the ib transport, RDMA-written by the peer",
        run: ctran::fuzzing::ib_control,
    },
    Target {
        name: "colltrace_dump",
        what: "colltrace dumps loaded, analyzed and rendered by the analyzer",
        run: colltrace_dump,
    },
    Target {
        name: "cvars_env",
        what: "cvar values from the environment",
        run: torchcomms_cvars::fuzzing::env,
    },
    Target {
        name: "cvars_file",
        what: "the cvars configuration file (TOML, YAML)",
        run: torchcomms_cvars::fuzzing::config_file,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// A dump file or an endpoint's answer as the analyzer loads it: first byte odd for an HTTP
/// answer (status line, headers, body), even for a file; then analyzed and rendered as text
/// and HTML, which is where field values from the dump end up.
pub fn colltrace_dump(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let body = if sel % 2 == 1 {
        match comms_analyzer::load::http_body(rest) {
            Ok(b) => b,
            Err(_) => return,
        }
    } else {
        rest
    };
    let Ok(dumps) = colltrace::schema::parse_dumps(body) else {
        return;
    };
    let verdict = comms_analyzer::analyze(&dumps, Vec::new(), &comms_analyzer::Options::default());
    let _ = comms_analyzer::render::text(&verdict);
    let _ = comms_analyzer::render::html(&verdict, 1000);
    let _ = serde_json::to_string(&verdict);
}
