//! SIGUSR1 makes the process dump, and the live endpoint serves the trace (process-wide state:
//! one test binary of its own).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use colltrace::{CommMeta, CommTrace, DumpOn, OpInfo, Outcome, TraceConfig, Trigger};

fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn sigusr1_dumps_and_the_live_endpoint_serves_the_trace() {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("colltrace-signal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    colltrace::configure(&TraceConfig {
        buffer_size: 16,
        dir: dir.clone(),
        dump_on: DumpOn {
            timeout: true,
            error: true,
            abort: true,
            signal: true,
        },
        http: Some("127.0.0.1:0".parse().unwrap()),
        tsc: true,
    });
    let meta = CommMeta {
        name: "sig".into(),
        instance: 1,
        rank: 3,
        size: 4,
        global_ranks: vec![0, 1, 2, 3],
    };
    let t = CommTrace::new(meta, 16);
    let mut w = t.writer();
    let mut h = t.submit(false, 1, "all_gather", None, Duration::from_secs(9));
    let info = || OpInfo {
        op: "all_gather",
        ..Default::default()
    };
    w.start(&mut h, info, Some("socket"), None);

    // SIGUSR1: the handler only wakes the dump thread.
    // SAFETY: raise(3) with a signal whose handler colltrace installed above.
    assert_eq!(unsafe { libc::raise(libc::SIGUSR1) }, 0);
    let file = dir.join("colltrace_rank3.json");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !file.exists() {
        assert!(
            Instant::now() < deadline,
            "no dump after SIGUSR1 in {}",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let d = &colltrace::schema::parse_dumps(&std::fs::read(&file).unwrap()).unwrap()[0];
    assert_eq!(d.trigger, Trigger::Signal);
    assert_eq!(d.comms[0].records[0].op, "all_gather");
    assert_eq!(
        d.comms[0].records[0].state,
        colltrace::schema::State::Started
    );

    // The live endpoint.
    let addr = colltrace::http_addr().expect("serving");
    assert!(addr.ip().is_loopback());
    w.finish(&mut h, Outcome::Completed);
    let resp = get(addr, "/colltrace");
    assert!(resp.starts_with("HTTP/1.0 200"), "{resp}");
    let body = &resp[resp.find("\r\n\r\n").unwrap() + 4..];
    let dumps = colltrace::schema::parse_dumps(body.as_bytes()).unwrap();
    let live = dumps.iter().find(|d| d.rank == 3).unwrap();
    assert_eq!(live.trigger, Trigger::Live);
    assert_eq!(live.endpoint.as_deref(), Some(addr.to_string().as_str()));
    assert_eq!(live.comms[0].collective.completed, 1);
    assert!(get(addr, "/health").contains("{\"ok\":true}"));
    assert!(get(addr, "/nope").starts_with("HTTP/1.0 404"));

    // Failures dump by themselves.
    std::fs::remove_file(&file).unwrap();
    let paths = colltrace::on_failure(&t, Trigger::Timeout, "all_gather (seq 1) timed out");
    assert_eq!(paths, vec![file.clone()]);
    let d = &colltrace::schema::parse_dumps(&std::fs::read(&file).unwrap()).unwrap()[0];
    assert_eq!(d.trigger, Trigger::Timeout);
    assert_eq!(d.comms[0].state, colltrace::CommState::Failed);
}
