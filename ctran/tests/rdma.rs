//! The RDMA transfer API (`ctran::rdma`): two transports in one process, and a parent and a
//! child process (this test binary re-executed) over cross-memory attach and the TCP path.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctran::rdma::{
    AccessKey, DataPath, MemDevice, RdmaError, RdmaMemory, RdmaRemoteBuffer, RdmaTransport,
};
use ctran::transport::ib::{soft_fabric, IbProvider};

/// Set in the environment of the child process (not a tunable).
const CHILD: &str = "RDMA_TEST_CHILD";
const LEN: usize = 1 << 20;
const SHORT: Option<Duration> = Some(Duration::from_secs(30));

fn pattern(i: usize, seed: u8) -> u8 {
    (i.wrapping_mul(7) as u8).wrapping_add(seed)
}

/// A heap buffer and its registration (the buffer outlives the registration: field order).
struct Buf {
    mem: Option<Arc<RdmaMemory>>,
    data: Vec<u8>,
}

impl Buf {
    fn new(len: usize, seed: Option<u8>) -> Buf {
        let mut data: Vec<u8> = (0..len)
            .map(|i| seed.map_or(0, |s| pattern(i, s)))
            .collect();
        // SAFETY: `data` is never reallocated and is dropped after `mem` (see `Drop`).
        let mem =
            unsafe { RdmaMemory::register(data.as_mut_ptr() as u64, len as u64, MemDevice::Cpu) }
                .unwrap();
        Buf {
            mem: Some(mem),
            data,
        }
    }

    fn mem(&self) -> &Arc<RdmaMemory> {
        self.mem.as_ref().expect("registered")
    }

    fn hash(&self) -> u64 {
        self.data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        self.mem = None;
    }
}

fn pair() -> (RdmaTransport, RdmaTransport) {
    let a = RdmaTransport::new(MemDevice::Cpu).unwrap();
    let b = RdmaTransport::new(MemDevice::Cpu).unwrap();
    let ua = a.bind().unwrap();
    let ub = b.bind().unwrap();
    // In one thread, in the order upstream's test uses.
    a.connect(&ub).unwrap();
    b.connect(&ua).unwrap();
    assert!(a.connected() && b.connected());
    (a, b)
}

/// `t` writes all of `src` into all of `dst`.
fn write_whole(t: &RdmaTransport, src: &Buf, dst: &Buf, notify: bool) {
    t.write(
        &src.mem().to_view(None, None).unwrap(),
        &dst.mem().to_remote_buffer(),
        notify,
        SHORT,
    )
    .unwrap();
}

/// `a` writes 512 bytes of `src` at offset 256 into a zeroed `dst` (a partial view into a
/// partial remote buffer), then `b` reads all of `src` back.
fn partial_write_then_read_back(a: &RdmaTransport, b: &RdmaTransport, src: &Buf, dst: &mut Buf) {
    dst.data.fill(0);
    let part = src.mem().to_view(Some(256), Some(512)).unwrap();
    let whole = dst.mem().to_remote_buffer();
    let remote = RdmaRemoteBuffer {
        ptr: whole.ptr + 256,
        len: 512,
        key: whole.key,
    };
    a.write(&part, &remote, false, SHORT).unwrap();
    assert!(dst.data[..256].iter().all(|&x| x == 0));
    assert_eq!(dst.data[256..768], src.data[256..768]);
    assert!(dst.data[768..].iter().all(|&x| x == 0));
    let back = Buf::new(src.data.len(), None);
    b.read(
        &back.mem().to_mutable_view(None, None).unwrap(),
        &src.mem().to_remote_buffer(),
        SHORT,
    )
    .unwrap();
    assert!(back.data == src.data, "the read differs");
}

fn in_process(path: DataPath) {
    let (mut a, mut b) = pair();
    a.set_data_path(path);
    b.set_data_path(path);
    let src = Buf::new(LEN, Some(3));
    let mut dst = Buf::new(LEN, None);
    write_whole(&a, &src, &dst, false);
    assert_eq!(src.data, dst.data);
    partial_write_then_read_back(&a, &b, &src, &mut dst);
    let s = a.stats();
    match path {
        DataPath::Auto => assert_eq!((s.cma, s.tcp), (2, 0), "{s:?}"),
        DataPath::Tcp => assert_eq!((s.cma, s.tcp), (0, 2), "{s:?}"),
        DataPath::Ib => unreachable!("in_process_over_ib"),
    }
}

/// Two transports on the ib data path over the process's software fabric.
fn ib_pair(b_path: DataPath) -> (RdmaTransport, RdmaTransport) {
    ib_pair_in_place(b_path, [true, true])
}

/// As [`ib_pair`], with in-place registration on or off per side.
fn ib_pair_in_place(b_path: DataPath, in_place: [bool; 2]) -> (RdmaTransport, RdmaTransport) {
    let mut a = RdmaTransport::new(MemDevice::Cpu).unwrap();
    let mut b = RdmaTransport::new(MemDevice::Cpu).unwrap();
    for ((t, path), in_place) in [(&mut a, DataPath::Ib), (&mut b, b_path)]
        .into_iter()
        .zip(in_place)
    {
        t.set_data_path(path);
        t.set_ib_provider(IbProvider::Soft);
        t.set_ib_in_place(in_place);
    }
    let (ua, ub) = (a.bind().unwrap(), b.bind().unwrap());
    assert!(ua.contains("/ib="), "{ua}");
    a.connect(&ub).unwrap();
    b.connect(&ua).unwrap();
    (a, b)
}

/// Writes, a notify, a partial write and a read back, an empty write, and a request past the
/// registration, with in-place registration on or off per side; `in_place`: the transfers
/// each side expects to have moved in place.
fn over_ib(sides: [bool; 2], in_place: (u64, u64)) {
    let (a, b) = ib_pair_in_place(DataPath::Ib, sides);
    let (_, moved_before) = soft_fabric().stats();
    // Three chunks and a bit: the ib path moves at most 4 MiB per round trip.
    let len = 3 * (4 << 20) + 4097;
    let src = Buf::new(len, Some(5));
    let mut dst = Buf::new(len, None);
    let whole = dst.mem().to_remote_buffer();
    a.write(&src.mem().to_view(None, None).unwrap(), &whole, true, SHORT)
        .unwrap();
    b.wait_for_write(SHORT).unwrap();
    assert!(src.data == dst.data, "the write differs");
    partial_write_then_read_back(&a, &b, &src, &mut dst);
    let empty = Buf::new(0, None);
    write_whole(&a, &empty, &empty, false);
    assert_eq!((a.stats().ib, a.stats().cma, a.stats().tcp), (3, 0, 0));
    assert_eq!((b.stats().ib, b.stats().cma, b.stats().tcp), (1, 0, 0));
    let got = (a.stats().ib_in_place, b.stats().ib_in_place);
    assert_eq!(
        got, in_place,
        "transfers moved in place (a, b), sides {sides:?}"
    );
    let (_, moved_after) = soft_fabric().stats();
    assert!(moved_after - moved_before >= 2 * len as u64);
    // The target still checks every request against its registry.
    let past = RdmaRemoteBuffer {
        ptr: whole.ptr + 1,
        len: len as u64,
        key: whole.key,
    };
    let e = a
        .write(&src.mem().to_view(None, None).unwrap(), &past, false, SHORT)
        .unwrap_err();
    assert!(matches!(e, RdmaError::Remote { .. }), "{e}");
}

#[test]
fn in_process_over_ib() {
    // In place: the empty write is staged (nothing to register), the rest moves in place.
    over_ib([true, true], (2, 1));
}

#[test]
fn in_process_over_ib_staged() {
    // A requester that stages never asks; a target that stages answers so, and the
    // requester stages from then on.
    over_ib([false, true], (0, 0));
    over_ib([true, false], (0, 0));
    over_ib([false, false], (0, 0));
}

#[test]
fn ib_on_one_side_only_uses_the_stream() {
    let (a, _b) = ib_pair(DataPath::Auto);
    let src = Buf::new(4096, Some(9));
    let dst = Buf::new(4096, None);
    write_whole(&a, &src, &dst, false);
    assert_eq!(src.data, dst.data);
    assert_eq!(a.stats().ib, 0, "{:?}", a.stats());
}

#[test]
fn in_process_cma() {
    in_process(DataPath::Auto);
}

#[test]
fn in_process_forced_tcp() {
    in_process(DataPath::Tcp);
}

#[test]
fn notify_and_wait_for_write() {
    let (a, b) = pair();
    let src = Buf::new(64, Some(1));
    let dst = Buf::new(64, None);
    let e = b
        .wait_for_write(Some(Duration::from_millis(200)))
        .unwrap_err();
    assert!(e.is_timeout(), "{e}");
    write_whole(&a, &src, &dst, true);
    b.wait_for_write(SHORT).unwrap();
    // Consumed: a second wait times out; a write without notify does not count.
    write_whole(&a, &src, &dst, false);
    assert!(b
        .wait_for_write(Some(Duration::from_millis(200)))
        .unwrap_err()
        .is_timeout());
}

#[test]
fn bad_keys_and_bounds_are_refused_and_write_nothing() {
    let (a, _b) = pair();
    let src = Buf::new(4096, Some(9));
    let dst = Buf::new(4096, None);
    let view = src.mem().to_view(Some(0), Some(64)).unwrap();
    let rb = dst.mem().to_remote_buffer();
    // Out of bounds: the last 32 bytes and 32 beyond.
    let oob = RdmaRemoteBuffer {
        ptr: rb.ptr + 4096 - 32,
        len: 64,
        key: rb.key,
    };
    let e = a.write(&view, &oob, false, SHORT).unwrap_err().to_string();
    assert!(
        e.contains("out of bounds") && e.contains("4096 bytes"),
        "{e}"
    );
    // A registration id that does not exist, a wrong generation, a key of another process
    // (another nonce).
    let bad_keys = [
        (
            "unknown or was deregistered",
            AccessKey {
                id: u64::MAX,
                ..rb.key
            },
        ),
        (
            "stale access key",
            AccessKey {
                generation: rb.key.generation + 1000,
                ..rb.key
            },
        ),
        (
            "another process",
            AccessKey {
                nonce: rb.key.nonce ^ 1,
                ..rb.key
            },
        ),
    ];
    for (want, key) in bad_keys {
        let bad = RdmaRemoteBuffer {
            ptr: rb.ptr,
            len: 64,
            key,
        };
        let e = a.write(&view, &bad, false, SHORT).unwrap_err().to_string();
        assert!(e.contains(want), "expected {want:?}: {e}");
    }
    // Lengths must agree.
    let e = a.write(&view, &rb, false, SHORT).unwrap_err();
    assert!(matches!(e, RdmaError::LengthMismatch { .. }), "{e}");
    assert!(dst.data.iter().all(|&x| x == 0), "a refused write wrote");
    // A malformed key string.
    assert!(matches!(
        RdmaRemoteBuffer::new(rb.ptr, 64, "00zz"),
        Err(RdmaError::MalformedKey(_))
    ));
}

#[test]
fn stale_key_after_deregistration() {
    let (a, _b) = pair();
    let src = Buf::new(128, Some(5));
    let mut dst = Buf::new(128, None);
    let rb = dst.mem().to_remote_buffer();
    dst.mem = None; // deregistered; the bytes stay ours
    let e = a
        .write(&src.mem().to_view(None, None).unwrap(), &rb, false, SHORT)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown or was deregistered"), "{e}");
    assert!(dst.data.iter().all(|&x| x == 0));
}

#[test]
fn thousand_alternating_small_writes() {
    let (a, b) = pair();
    let sa = Buf::new(64, None);
    let sb = Buf::new(64, None);
    let da = Buf::new(64, None);
    let db = Buf::new(64, None);
    for i in 0..1000usize {
        let (t, s, d) = if i % 2 == 0 {
            (&a, &sa, &db)
        } else {
            (&b, &sb, &da)
        };
        // SAFETY: no transfer uses `s` now (the previous one completed).
        unsafe { std::ptr::write_bytes(s.data.as_ptr() as *mut u8, i as u8, 64) };
        write_whole(t, s, d, true);
        let peer = if i % 2 == 0 { &b } else { &a };
        peer.wait_for_write(SHORT).unwrap();
        assert!(d.data.iter().all(|&x| x == i as u8), "write {i}");
    }
}

#[test]
fn errors_before_connect_and_bad_urls() {
    let t = RdmaTransport::new(MemDevice::Cpu).unwrap();
    let e = t.connect("tcrdma1://nonsense").unwrap_err();
    assert!(matches!(e, RdmaError::MalformedUrl(_)), "{e}");
    let src = Buf::new(8, None);
    let e = t
        .write(
            &src.mem().to_view(None, None).unwrap(),
            &src.mem().to_remote_buffer(),
            false,
            SHORT,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("not connected"), "{e}");
    let me = t.bind().unwrap();
    assert!(t.connect(&me).is_err());
    assert!(RdmaTransport::supported());
}

#[test]
fn a_foreign_hello_is_refused_and_the_right_peer_still_connects() {
    let a = RdmaTransport::new(MemDevice::Cpu).unwrap();
    let b = RdmaTransport::new(MemDevice::Cpu).unwrap();
    let c = RdmaTransport::new(MemDevice::Cpu).unwrap();
    let (ua, ub, uc) = (a.bind().unwrap(), b.bind().unwrap(), c.bind().unwrap());
    // Make `lo` the listener (larger URL) and `hi` the expected dialer.
    let mut v = [(ua, &a), (ub, &b)];
    v.sort_by(|x, y| x.0.cmp(&y.0));
    let [(small, dialer), (large, listener)] = v;
    listener.connect(&small).unwrap();
    // `c` dials the listener with the right listener token but is not the expected peer.
    if uc < large {
        let e = c.connect(&large).unwrap_err().to_string();
        assert!(
            e.contains("refused") || e.contains("closed") || e.contains("timed out"),
            "{e}"
        );
    }
    dialer.connect(&large).unwrap();
    assert!(dialer.connected());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !listener.connected() {
        assert!(Instant::now() < deadline, "listener never connected");
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ----------------------------------------------------------------------- two processes

/// The child: serves a 1 MiB destination and a 1 MiB source, driven by lines on stdin.
#[test]
fn child_entry() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    if std::env::var_os("RDMA_TEST_CHILD_NOBODY").is_some() {
        // SAFETY: plain integers; drops root (and with it CAP_SYS_PTRACE) for the CMA refusal.
        let rc = unsafe { libc::setresuid(65534, 65534, 65534) };
        println!("@@ NOBODY {rc}");
    }
    let t = RdmaTransport::new(MemDevice::Cpu).unwrap();
    let out = |s: String| {
        println!("@@ {s}");
        std::io::stdout().flush().unwrap();
    };
    out(format!("URL {}", t.bind().unwrap()));
    let mut dst = Buf::new(LEN, None);
    let src = Buf::new(LEN, Some(11));
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        match w[0] {
            "URL" => {
                t.connect(w[1]).unwrap();
                let d = dst.mem().to_remote_buffer();
                let s = src.mem().to_remote_buffer();
                out(format!(
                    "BUFS {} {} {} {} {} {}",
                    d.ptr,
                    d.len,
                    d.access_key(),
                    s.ptr,
                    s.len,
                    s.access_key()
                ));
            }
            "HASH" => out(format!("HASH {}", dst.hash())),
            "DROPDST" => {
                dst.mem = None;
                out("OK".into());
            }
            "WAIT" => match t.wait_for_write(SHORT) {
                Ok(()) => out("OK".into()),
                Err(e) => out(format!("ERR {e}")),
            },
            "WRITE" => {
                let rb = RdmaRemoteBuffer::new(w[1].parse().unwrap(), w[2].parse().unwrap(), w[3])
                    .unwrap();
                let view = src.mem().to_view(None, Some(rb.len)).unwrap();
                match t.write(&view, &rb, true, SHORT) {
                    Ok(()) => out(format!("OK {:?}", t.stats())),
                    Err(e) => out(format!("ERR {e}")),
                }
            }
            "EXIT" => break,
            other => panic!("unknown command {other}"),
        }
    }
}

struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    url: String,
}

impl Peer {
    fn spawn(env: &[(&str, &str)]) -> Peer {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut p = Peer {
            child,
            stdin,
            stdout,
            url: String::new(),
        };
        p.url = p.line("URL")[0].clone();
        p
    }

    /// The next `@@ <tag> ...` line's words after the tag.
    fn line(&mut self, tag: &str) -> Vec<String> {
        loop {
            let mut l = String::new();
            assert!(
                self.stdout.read_line(&mut l).unwrap() > 0,
                "child exited early"
            );
            // The harness may print "test child_entry ... " before the first line.
            if let Some(rest) = l.find("@@ ").map(|at| l[at + 3..].trim()) {
                let mut w = rest.split_whitespace().map(String::from);
                let t = w.next().unwrap();
                if t == tag {
                    return w.collect();
                }
                if t == "ERR" {
                    panic!("child: {rest}");
                }
            }
        }
    }

    fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
    }
}

fn connect_child(
    env: &[(&str, &str)],
    path: DataPath,
) -> (RdmaTransport, Peer, RdmaRemoteBuffer, RdmaRemoteBuffer) {
    let mut p = Peer::spawn(env);
    let mut t = RdmaTransport::new(MemDevice::Cpu).unwrap();
    t.set_data_path(path);
    let me = t.bind().unwrap();
    p.send(&format!("URL {me}"));
    t.connect(&p.url).unwrap();
    let b = p.line("BUFS");
    let dst = RdmaRemoteBuffer::new(b[0].parse().unwrap(), b[1].parse().unwrap(), &b[2]).unwrap();
    let src = RdmaRemoteBuffer::new(b[3].parse().unwrap(), b[4].parse().unwrap(), &b[5]).unwrap();
    (t, p, dst, src)
}

fn hash_of(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn two_processes(env: &[(&str, &str)], path: DataPath) -> ctran::rdma::PathStats {
    let (t, mut p, dst, src) = connect_child(env, path);
    let mine = Buf::new(LEN, Some(21));
    // Whole write with notify; the child waits for it.
    t.write(&mine.mem().to_view(None, None).unwrap(), &dst, true, SHORT)
        .unwrap();
    p.send("WAIT");
    assert_eq!(p.line("OK"), Vec::<String>::new());
    p.send("HASH");
    assert_eq!(p.line("HASH")[0], hash_of(&mine.data).to_string());
    // Partial write.
    let mut expect = mine.data.clone();
    let other = Buf::new(LEN, Some(99));
    let part = RdmaRemoteBuffer {
        ptr: dst.ptr + 256,
        len: 512,
        key: dst.key,
    };
    t.write(
        &other.mem().to_view(Some(256), Some(512)).unwrap(),
        &part,
        false,
        SHORT,
    )
    .unwrap();
    expect[256..768].copy_from_slice(&other.data[256..768]);
    p.send("HASH");
    assert_eq!(p.line("HASH")[0], hash_of(&expect).to_string());
    // Read the child's source.
    let back = Buf::new(LEN, None);
    t.read(
        &back.mem().to_mutable_view(None, None).unwrap(),
        &src,
        SHORT,
    )
    .unwrap();
    assert!(back
        .data
        .iter()
        .enumerate()
        .all(|(i, &x)| x == pattern(i, 11)));
    // Out of bounds and unknown ids: refused, nothing written.
    let oob = RdmaRemoteBuffer {
        ptr: dst.ptr + dst.len - 8,
        len: 16,
        key: dst.key,
    };
    let e = t
        .write(
            &mine.mem().to_view(None, Some(16)).unwrap(),
            &oob,
            false,
            SHORT,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("out of bounds"), "{e}");
    let unknown = RdmaRemoteBuffer {
        ptr: dst.ptr,
        len: 16,
        key: AccessKey {
            id: dst.key.id + 1000,
            ..dst.key
        },
    };
    let e = t
        .write(
            &mine.mem().to_view(None, Some(16)).unwrap(),
            &unknown,
            false,
            SHORT,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown or was deregistered"), "{e}");
    // The child writes into our memory with notify.
    let landing = Buf::new(4096, None);
    let rb = landing.mem().to_remote_buffer();
    p.send(&format!("WRITE {} {} {}", rb.ptr, rb.len, rb.access_key()));
    let ok = p.line("OK");
    t.wait_for_write(SHORT).unwrap();
    assert!(
        landing
            .data
            .iter()
            .enumerate()
            .all(|(i, &x)| x == pattern(i, 11)),
        "child's write: {ok:?}"
    );
    // Stale key: the child deregisters its destination, keeps the bytes.
    p.send("DROPDST");
    p.line("OK");
    let e = t
        .write(&mine.mem().to_view(None, None).unwrap(), &dst, false, SHORT)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown or was deregistered"), "{e}");
    p.send("HASH");
    assert_eq!(
        p.line("HASH")[0],
        hash_of(&expect).to_string(),
        "a refused write wrote"
    );
    p.send("EXIT");
    assert!(p.child.wait().unwrap().success());
    t.stats()
}

#[test]
fn two_processes_cma() {
    let s = two_processes(&[], DataPath::Auto);
    assert!(s.cma >= 3 && s.tcp == 0, "{s:?}");
}

#[test]
fn two_processes_forced_tcp() {
    // The child is forced through its cvar, the parent through the setter.
    let s = two_processes(&[("TORCHCOMMS_RDMA_PATH", "tcp")], DataPath::Tcp);
    assert!(s.cma == 0 && s.tcp >= 3, "{s:?}");
}

#[test]
fn cma_refused_falls_back_to_tcp() {
    // A child without the right to attach to us (another uid, no CAP_SYS_PTRACE) refuses
    // cross-memory attach; our transfers then go over TCP.
    if unsafe_is_root() {
        let s = two_processes(&[("RDMA_TEST_CHILD_NOBODY", "1")], DataPath::Auto);
        assert_eq!(s.cma_denied, 1, "{s:?}");
        assert!(s.tcp >= 3, "{s:?}");
    } else {
        // Without root the child cannot change uid; the same-uid path must still work.
        println!("not root: the EPERM fallback cannot be provoked here; ran the CMA path only");
        let s = two_processes(&[], DataPath::Auto);
        assert!(s.cma >= 3, "{s:?}");
    }
}

fn unsafe_is_root() -> bool {
    nix_uid() == 0
}

fn nix_uid() -> u32 {
    // SAFETY: getuid has no failure modes and takes no arguments.
    unsafe { libc::getuid() }
}

#[test]
fn killed_peer_fails_within_the_timeout() {
    let (t, mut p, dst, _src) = connect_child(&[], DataPath::Auto);
    let mine = Buf::new(LEN, Some(1));
    t.write(&mine.mem().to_view(None, None).unwrap(), &dst, false, SHORT)
        .unwrap();
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    let started = Instant::now();
    let e = t
        .write(
            &mine.mem().to_view(None, None).unwrap(),
            &dst,
            false,
            Some(Duration::from_secs(5)),
        )
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "took {:?}",
        started.elapsed()
    );
    let text = e.to_string();
    assert!(
        text.contains(&p.url) || text.contains("timed out"),
        "{text}"
    );
    assert!(!t.connected());
    let e = t
        .wait_for_write(Some(Duration::from_secs(5)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("closed") || e.contains("timed out"), "{e}");
}
