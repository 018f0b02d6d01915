use std::time::Duration;

use super::*;
use crate::file::suggest;

fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |k| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    }
}

#[test]
fn defaults_parse_and_have_the_engine_values() {
    let cv = Cvars::defaults();
    assert_eq!(cv.ctran_chunk_bytes(), 1 << 20);
    assert_eq!(cv.torchcomm_timeout_seconds(), Duration::from_secs(600));
    assert_eq!(cv.ctran_backends(), &["socket", "shm", "nvl"]);
    assert_eq!(cv.ctran_socket_ifaddr(), None);
    assert_eq!(cv.ctran_socket_spin_us(), None);
    assert_eq!(cv.ctran_shm_spin_us(), None);
    assert_eq!(cv.ctran_allreduce_algo(), "auto");
    assert!(cv.torchcomm_abort_on_error());
    assert_eq!(cv.torchcomms_trace_buffer_size(), 2000);
    assert!(cv.entries().iter().all(|e| e.source == Source::Default));
    assert_eq!(cv.entries().len(), SPECS.len());
}

#[test]
fn environment_values_are_typed_and_remember_their_source() {
    let cv = Cvars::load_from(env(&[
        ("CTRAN_CHUNK_BYTES", "2MiB"),
        ("TORCHCOMM_TIMEOUT_SECONDS", "1.5"),
        ("CTRAN_SOCKET_SPIN_US", "20ms"),
        ("CTRAN_BACKENDS", " SHM , socket,shm"),
        ("CTRAN_SOCKET_IFADDR", "10.1.2.3"),
        ("CTRAN_BROADCAST_ALGO", "Chain"),
        ("TORCHCOMM_ABORT_ON_ERROR", "n"),
        ("CTRAN_COST_ALPHA_US", "12.5"),
        ("TORCHCOMMS_TRACE_HTTP_ADDR", "[::1]:9000"),
        ("CTRAN_SHM_BUFFER_BYTES", ""),
    ]))
    .unwrap();
    assert_eq!(cv.ctran_chunk_bytes(), 2 << 20);
    assert_eq!(cv.torchcomm_timeout_seconds(), Duration::from_millis(1500));
    assert_eq!(cv.ctran_socket_spin_us(), Some(Duration::from_millis(20)));
    assert_eq!(cv.ctran_backends(), &["shm", "socket"]);
    assert_eq!(cv.ctran_socket_ifaddr(), Some("10.1.2.3".parse().unwrap()));
    assert_eq!(cv.ctran_broadcast_algo(), "chain");
    assert!(!cv.torchcomm_abort_on_error());
    assert_eq!(cv.ctran_cost_alpha_us(), Some(12.5));
    assert_eq!(cv.torchcomms_trace_http_addr().port(), 9000);
    let e = cv.entry("CTRAN_CHUNK_BYTES").unwrap();
    assert_eq!((e.value.as_str(), &e.source), ("2M", &Source::Env));
    // Empty counts as unset.
    assert_eq!(
        cv.entry("CTRAN_SHM_BUFFER_BYTES").unwrap().source,
        Source::Default
    );
    let t = cv.table();
    assert!(
        t.contains("CTRAN_SOCKET_IFADDR") && t.contains("10.1.2.3"),
        "{t}"
    );
    assert!(
        t.contains("CTRAN_COST_BETA_GBPS") && t.contains("(unset)"),
        "{t}"
    );
}

#[test]
fn invalid_values_name_the_variable_the_value_and_what_is_allowed() {
    let cases: &[(&str, &str, &str)] = &[
        ("CTRAN_CHUNK_BYTES", "lots", ">= 4096"),
        ("CTRAN_CHUNK_BYTES", "100", ">= 4096"),
        ("TORCHCOMM_TIMEOUT_SECONDS", "0", "> 0"),
        ("TORCHCOMM_TIMEOUT_SECONDS", "-3", "duration"),
        ("TORCHCOMM_ABORT_ON_ERROR", "maybe", "1/true/yes/y"),
        ("CTRAN_BACKENDS", "socket,rdma", "socket, shm"),
        ("CTRAN_ALLREDUCE_ALGO", "fastest", "ring, halving_doubling"),
        ("CTRAN_SOCKET_IFADDR", "eth0", "IP address"),
        ("CTRAN_COST_BETA_GBPS", "0", "> 0"),
        ("CTRAN_COST_BETA_GBPS", "inf", "number"),
        ("TORCHCOMMS_TRACE_BUFFER_SIZE", "-1", "non-negative integer"),
        ("TORCHCOMMS_TRACE_BUFFER_SIZE", "99999999999", "<= 10000000"),
        ("TORCHCOMMS_TRACE_HTTP_ADDR", "localhost", "port"),
        ("TORCHCOMMS_TRACE_DUMP_ON", "always", "timeout, error"),
    ];
    for &(name, value, allowed) in cases {
        let lookup = move |k: &str| (k == name).then(|| value.to_string());
        let err = Cvars::load_from(lookup).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(name) && msg.contains(value) && msg.contains(allowed),
            "{name}={value}: {msg}"
        );
        assert!(msg.contains("environment"), "{msg}");
        assert_eq!(err.name(), name);
        assert_eq!(err.value(), value);
    }
}

#[test]
fn every_default_is_valid_and_every_spec_is_documented() {
    for s in SPECS {
        assert!(!s.doc.is_empty() && s.doc.ends_with('.'), "{}", s.name);
        assert!(s
            .name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit()));
    }
    let md = markdown();
    for s in SPECS {
        assert!(md.contains(&format!("`{}`", s.name)));
    }
}

#[test]
fn suggestions_for_typos() {
    assert_eq!(suggest("CTRAN_CHUNK_BYTE"), Some("CTRAN_CHUNK_BYTES"));
    assert_eq!(suggest("SOMETHING_ELSE_ENTIRELY"), None);
}
