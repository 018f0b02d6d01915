//! Interop of our TCP store with real PyTorch (`torch.distributed.TCPStore`), both ways:
//! our client against torch's libuv and legacy servers, and torch's client against our server.
//!
//! Needs `python3` with torch importable. Without it the tests print
//! `SKIPPED: torch not importable` and return, unless `TORCHCOMMS_REQUIRE_TORCH=1`, in which case
//! they fail (CI sets it so a broken torch install cannot turn into a silent pass).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use torchcomms_core::bootstrap::tcp_store::{TcpStoreClient, TcpStoreServer};
use torchcomms_core::bootstrap::Store;
use torchcomms_core::Error;

/// Generous: torch's import alone takes seconds on a loaded CI machine.
const STEP: Duration = Duration::from_secs(60);
const WHOLE: Duration = Duration::from_secs(120);

/// True when torch is importable; otherwise prints the skip (or fails when torch is required).
fn torch_or_skip() -> bool {
    let probe = Command::new("python3")
        .args([
            "-c",
            "import torch.distributed as d; assert d.is_available()",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|c| wait_with_timeout(c, STEP));
    let (ok, why) = match probe {
        Ok((status, _out, err)) => (status.is_some_and(|s| s.success()), err),
        Err(e) => (false, format!("cannot run python3: {e}")),
    };
    if ok {
        return true;
    }
    if std::env::var("TORCHCOMMS_REQUIRE_TORCH").as_deref() == Ok("1") {
        panic!("TORCHCOMMS_REQUIRE_TORCH=1 but torch is not importable by python3:\n{why}");
    }
    eprintln!("SKIPPED: torch not importable");
    false
}

/// Waits for `child` up to `timeout`, killing it past that. Returns the exit status (`None`
/// when killed), stdout and stderr.
fn wait_with_timeout(
    mut child: Child,
    timeout: Duration,
) -> std::io::Result<(Option<ExitStatus>, String, String)> {
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    Ok((
        status,
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    ))
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_string(&mut s);
        }
        s
    })
}

/// A Python process whose stdout lines we can wait for. Killed on drop, so a failing assertion
/// never leaves it running.
struct Py {
    child: Option<Child>,
    lines: Receiver<String>,
    seen: Vec<String>,
    stderr: Option<JoinHandle<String>>,
}

impl Py {
    fn spawn(script: &str, args: &[String]) -> Py {
        let mut child = Command::new("python3")
            .arg("-u")
            .arg("-c")
            .arg(script)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn python3");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = drain(child.stderr.take());
        Py {
            child: Some(child),
            lines,
            seen: Vec::new(),
            stderr: Some(stderr),
        }
    }

    /// Waits for a stdout line starting with `prefix`; returns the rest of it.
    fn expect(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + STEP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim().to_owned();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.fail(&format!("no `{prefix}` line within {STEP:?}"))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.fail(&format!("python exited before printing `{prefix}`"))
                }
            }
        }
    }

    /// Waits for a clean exit and a final `PY_OK` line.
    fn finish(mut self) {
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + WHOLE;
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                self.fail("python did not exit in time");
            }
            thread::sleep(Duration::from_millis(20));
        };
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
        if !status.success() || !self.seen.iter().any(|l| l == "PY_OK") {
            self.fail(&format!("python ended with {status}"));
        }
    }

    fn fail(&mut self, what: &str) -> ! {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let err = self
            .stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        panic!(
            "{what}\n--- python stdout ---\n{}\n--- python stderr ---\n{err}",
            self.seen.join("\n")
        );
    }
}

impl Drop for Py {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

const T: Duration = Duration::from_secs(30);

/// Python hosts the store; our client does every `Store` op against it.
const PY_SERVER: &str = r#"
import sys
from datetime import timedelta
import torch.distributed as dist

use_libuv = sys.argv[1] == "1"
store = dist.TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=60),
                      wait_for_workers=False, use_libuv=use_libuv)
assert store.libuvBackend == use_libuv, (store.libuvBackend, use_libuv)
store.set("from_py", "hello from python")
store.add("shared_counter", 10)
print("PORT", store.port, flush=True)

store.wait(["rust_ready"])
import time; time.sleep(0.3)
store.set("late", "arrived")          # releases the Rust client's server-side wait

store.wait(["rust_done"])
assert store.get("from_rust") == b"rust value", store.get("from_rust")
assert store.get("shared_counter") == b"15", store.get("shared_counter")
assert store.get("rust_cas") == b"second", store.get("rust_cas")
assert not store.check(["rust_deleted"])
assert store.get("binary") == bytes(range(256)), store.get("binary")
print("PY_OK", flush=True)
"#;

fn rust_client_against_python_server(use_libuv: bool) {
    if !torch_or_skip() {
        return;
    }
    let mut py = Py::spawn(PY_SERVER, &[if use_libuv { "1" } else { "0" }.to_string()]);
    let port: u16 = py.expect("PORT").parse().expect("port number");
    let c = TcpStoreClient::connect("127.0.0.1", port, T).unwrap();
    c.ping().unwrap();

    assert_eq!(c.get("from_py", T).unwrap(), b"hello from python");
    assert_eq!(c.add("shared_counter", 5).unwrap(), 15);
    c.set("from_rust", b"rust value").unwrap();
    c.set("binary", &(0..=255u8).collect::<Vec<_>>()).unwrap();

    assert_eq!(c.compare_set("rust_cas", b"", b"first").unwrap(), b"first");
    assert_eq!(c.compare_set("rust_cas", b"wrong", b"x").unwrap(), b"first");
    assert_eq!(
        c.compare_set("rust_cas", b"first", b"second").unwrap(),
        b"second"
    );

    assert!(c.check(&["from_py", "from_rust"]).unwrap());
    assert!(!c.check(&["from_py", "nope"]).unwrap());

    c.set("rust_deleted", b"x").unwrap();
    assert!(c.delete("rust_deleted").unwrap());
    assert!(!c.delete("rust_deleted").unwrap());

    // A timed-out wait is cancelled on torch's server and the connection stays in sync.
    let start = Instant::now();
    let err = c.wait(&["never"], Duration::from_millis(300)).unwrap_err();
    assert!(matches!(err, Error::Store { op: "wait", .. }), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(c.get("never", Duration::from_millis(100)).is_err());
    assert!(
        c.check(&["from_rust"]).unwrap(),
        "connection usable after cancelled waits"
    );

    // Server-side wait released by Python's later set.
    c.set("rust_ready", b"1").unwrap();
    c.wait(&["late"], T).unwrap();
    assert_eq!(c.get("late", T).unwrap(), b"arrived");

    // Extended API.
    assert!(c.num_keys().unwrap() >= 6);
    c.append("app", b"ab").unwrap();
    c.append("app", b"cd").unwrap();
    c.multi_set(&[("m1", b"1"), ("m2", b"22")]).unwrap();
    assert_eq!(
        c.multi_get(&["app", "m1", "m2"]).unwrap(),
        vec![b"abcd".to_vec(), b"1".to_vec(), b"22".to_vec()]
    );
    let keys = c.list_keys().unwrap();
    assert!(keys.iter().any(|k| k == "from_py"), "{keys:?}");
    if use_libuv {
        // torch's legacy server has no queues (it never answers them).
        c.queue_push("q", b"item").unwrap();
        assert_eq!(c.queue_len("q").unwrap(), 1);
        assert_eq!(c.queue_pop("q", true, T).unwrap().unwrap(), b"item");
        assert_eq!(c.queue_pop("q", false, T).unwrap(), None);
    }
    c.barrier("solo_barrier", 1, T).unwrap();
    assert!(c.local_addr_hint().unwrap().is_loopback());

    c.set("rust_done", b"").unwrap();
    py.finish();
}

#[test]
fn rust_client_against_torch_libuv_server() {
    rust_client_against_python_server(true);
}

#[test]
fn rust_client_against_torch_legacy_server() {
    rust_client_against_python_server(false);
}

/// Rust hosts the store; torch's client does everything torch does on a store.
const PY_CLIENT: &str = r#"
import sys
from datetime import timedelta
import torch.distributed as dist

port = int(sys.argv[1])
# world_size=2 with the default wait_for_workers: the client announces itself with add("init/").
s = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=30))
s.set("py_key", "v1")
assert s.get("py_key") == b"v1"
assert s.add("py_cnt", 3) == 3
assert s.add("py_cnt", -1) == 2
assert s.compare_set("py_cas", "", "new") == b"new"
assert s.compare_set("py_cas", "wrong", "x") == b"new"
assert s.compare_set("py_cas", "new", "newer") == b"newer"
assert s.check(["py_key", "py_cnt"])
assert not s.check(["py_key", "nope"])
s.wait(["py_key"])
s.wait(["py_key"], timedelta(seconds=5))
try:
    s.wait(["nope"], timedelta(milliseconds=200))
    raise AssertionError("wait on a missing key must time out")
except dist.DistStoreError:
    pass
assert s.get("py_key") == b"v1", "connection usable after a cancelled wait"
s.set("py_del", "x")
assert s.delete_key("py_del")
assert not s.delete_key("py_del")
n = s.num_keys()
assert n >= 4, n
s.multi_set(["m1", "m2"], ["a", "bb"])
assert s.multi_get(["m1", "m2"]) == [b"a", b"bb"]
s.append("ap", "x")
s.append("ap", "y")
assert s.get("ap") == b"xy"
assert "py_key" in s.list_keys(), s.list_keys()
s.queue_push("q", "one")
s.queue_push("q", "two")
assert s.queue_len("q") == 2
assert s.queue_pop("q") == b"one"
assert s.queue_pop("q", block=False) == b"two"
assert s.queue_len("q") == 0
s.barrier("py_barrier", 1, timedelta(seconds=5))
c = s.clone()                          # a second connection, validated afresh
assert c.get("py_cnt") == b"2"

s.set("py_ready", "1")
assert s.get("rust_key") == b"from rust"   # server-side wait, released by Rust's set
print("PY_OK", flush=True)
s.set("py_done", "1")
"#;

#[test]
fn torch_client_against_rust_server() {
    if !torch_or_skip() {
        return;
    }
    let server = TcpStoreServer::bind("127.0.0.1", 0).unwrap();
    let c = TcpStoreClient::connect("127.0.0.1", server.port(), T).unwrap();
    let py = Py::spawn(PY_CLIENT, &[server.port().to_string()]);

    c.wait(&["py_ready"], STEP).unwrap();
    assert_eq!(c.get("py_key", T).unwrap(), b"v1");
    assert_eq!(c.get("py_cnt", T).unwrap(), b"2");
    assert_eq!(c.get("py_cas", T).unwrap(), b"newer");
    assert_eq!(c.get("ap", T).unwrap(), b"xy");
    assert_eq!(c.get("m2", T).unwrap(), b"bb");
    assert!(!c.check(&["py_del"]).unwrap());
    assert_eq!(c.add("py_cnt", 1).unwrap(), 3);
    // torch's waitForWorkers key is outside the `/` namespace.
    let keys = c.list_keys().unwrap();
    assert!(keys.iter().any(|k| k == "init/"), "{keys:?}");
    c.set("rust_key", b"from rust").unwrap();

    c.wait(&["py_done"], STEP).unwrap();
    py.finish();
}

/// Several torch clients wait on one key at our server; one Rust set releases them all.
const PY_WAITER: &str = r#"
import sys
from datetime import timedelta
import torch.distributed as dist

port, me = int(sys.argv[1]), sys.argv[2]
s = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30))
s.add("arrived", 1)
assert s.get("go") == b"now"
s.set("ack/" + me, me)
print("PY_OK", flush=True)
"#;

#[test]
fn many_torch_waiters_released_by_one_rust_set() {
    if !torch_or_skip() {
        return;
    }
    let server = TcpStoreServer::bind("127.0.0.1", 0).unwrap();
    let port = server.port().to_string();
    let c = TcpStoreClient::connect("127.0.0.1", server.port(), T).unwrap();
    let n = 3;
    let procs: Vec<Py> = (0..n)
        .map(|i| Py::spawn(PY_WAITER, &[port.clone(), i.to_string()]))
        .collect();
    let deadline = Instant::now() + STEP;
    while !c.check(&["arrived"]).unwrap()
        || c.get("arrived", T).unwrap() != n.to_string().as_bytes()
    {
        assert!(
            Instant::now() < deadline,
            "python clients did not all arrive"
        );
        thread::sleep(Duration::from_millis(50));
    }
    c.set("go", b"now").unwrap();
    let acks: Vec<String> = (0..n).map(|i| format!("ack/{i}")).collect();
    let acks: Vec<&str> = acks.iter().map(String::as_str).collect();
    c.wait(&acks, STEP).unwrap();
    for p in procs {
        p.finish();
    }
}
