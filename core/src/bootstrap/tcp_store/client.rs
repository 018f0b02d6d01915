//! A TCPStore client that talks to torch's servers (libuv and legacy) and to ours.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::protocol::{
    Request, CHECK_READY, MAX_VALUE_LEN, VALIDATION_MAGIC, WAIT_CANCELED, WAIT_STOP_WAITING,
};
use crate::bootstrap::Store;
use crate::error::{Error, Result};

/// torch's client puts this in front of every user key (`TCPStore::keyPrefix_`); we do the same
/// so that keys set from Python and from Rust are the same keys.
const KEY_PREFIX: &str = "/";

/// Idle connections kept for reuse; more are opened only while several threads use the client
/// at once.
const MAX_IDLE: usize = 4;

/// How long to wait for the server to answer `CANCEL_WAIT` after a wait timed out.
const CANCEL_GRACE: Duration = Duration::from_secs(30);

/// One validated connection to the server. Generic over the byte stream so that the reply
/// decoding can be fuzzed without a socket (see `fuzz` below); the client uses TCP.
#[derive(Debug)]
struct Conn<S = TcpStream> {
    stream: S,
}

/// What [`Conn`] needs of its stream: bytes both ways, with per-call deadlines.
trait Wire: Read + Write {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()>;
}

impl Wire for TcpStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, t)
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, t)
    }
}

/// An I/O failure or a reply that makes no sense; either way the connection is discarded.
#[derive(Debug)]
enum Failure {
    Io(io::Error),
    Protocol(String),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Io(e) if e.kind() == io::ErrorKind::TimedOut => {
                write!(f, "no reply before the deadline")
            }
            Failure::Io(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::UnexpectedEof
                        | io::ErrorKind::BrokenPipe
                        | io::ErrorKind::ConnectionReset
                ) =>
            {
                // The protocol has no error replies: a server of ours closes the connection of a
                // request past its limits, and logs which one.
                write!(
                    f,
                    "server closed the connection ({e}; a torchcomms-rs server does so for a \
                     request past TORCHCOMMS_STORE_MAX_VALUE_BYTES, TORCHCOMMS_STORE_MAX_BYTES or \
                     TORCHCOMMS_STORE_CLIENT_BUFFER_BYTES, and its log names the limit)"
                )
            }
            Failure::Io(e) => write!(f, "{e}"),
            Failure::Protocol(s) => write!(f, "protocol error: {s}"),
        }
    }
}

impl<S: Wire> Conn<S> {
    fn send(&mut self, req: &Request, deadline: Instant) -> Result<(), Failure> {
        let bytes = req.encode();
        let mut sent = 0;
        while sent < bytes.len() {
            self.stream.set_write_timeout(Some(remaining(deadline)?))?;
            match self.stream.write(&bytes[sent..]) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero).into()),
                Ok(n) => sent += n,
                Err(e) if is_retry(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn read_exact(&mut self, buf: &mut [u8], deadline: Instant) -> Result<(), Failure> {
        let mut got = 0;
        while got < buf.len() {
            self.stream.set_read_timeout(Some(remaining(deadline)?))?;
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
                Ok(n) => got += n,
                Err(e) if is_retry(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn u8(&mut self, deadline: Instant) -> Result<u8, Failure> {
        let mut b = [0u8; 1];
        self.read_exact(&mut b, deadline)?;
        Ok(b[0])
    }

    fn u32(&mut self, deadline: Instant) -> Result<u32, Failure> {
        let mut b = [0u8; 4];
        self.read_exact(&mut b, deadline)?;
        Ok(u32::from_le_bytes(b))
    }

    fn i64(&mut self, deadline: Instant) -> Result<i64, Failure> {
        let mut b = [0u8; 8];
        self.read_exact(&mut b, deadline)?;
        Ok(i64::from_le_bytes(b))
    }

    fn bytes(&mut self, deadline: Instant) -> Result<Vec<u8>, Failure> {
        let len = self.i64(deadline)?;
        // A length no server of ours would send (negative, or past what a server accepts) means
        // the stream is out of step: fail now rather than read gigabytes into a key.
        let len = u64::try_from(len)
            .ok()
            .filter(|&l| l <= MAX_VALUE_LEN)
            .ok_or_else(|| Failure::Protocol(format!("a value of {len} bytes")))?;
        // Grow as bytes arrive instead of trusting the length for one allocation.
        let mut out = Vec::with_capacity(len.min(1 << 20) as usize);
        let mut left = len;
        let mut chunk = vec![0u8; len.min(1 << 16) as usize];
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            self.read_exact(&mut chunk[..n], deadline)?;
            out.extend_from_slice(&chunk[..n]);
            left -= n as u64;
        }
        Ok(out)
    }

    /// Sends WAIT and waits up to `wait_deadline` for STOP_WAITING. On timeout, cancels the wait
    /// the way torch does so that the connection stays usable. `Ok(false)` means timed out.
    fn wait(&mut self, keys: Vec<Vec<u8>>, wait_deadline: Instant) -> Result<bool, Failure> {
        // Sending gets its own deadline: a zero wait timeout still asks the server once.
        self.send(&Request::Wait { keys }, Instant::now() + CANCEL_GRACE)?;
        self.stop_waiting("WAIT", wait_deadline)
    }

    /// Reads the answer to a WAIT or BARRIER (`what`) until `wait_deadline`; on timeout,
    /// withdraws it with CANCEL_WAIT. `Ok(false)` means timed out.
    fn stop_waiting(&mut self, what: &str, wait_deadline: Instant) -> Result<bool, Failure> {
        match self.u8(wait_deadline) {
            Ok(WAIT_STOP_WAITING) => return Ok(true),
            Ok(other) => return Err(Failure::Protocol(format!("{what} answered {other}"))),
            Err(Failure::Io(e)) if e.kind() == io::ErrorKind::TimedOut => {}
            Err(e) => return Err(e),
        }
        let grace = Instant::now() + CANCEL_GRACE;
        self.send(&Request::CancelWait, grace)?;
        match self.u8(grace)? {
            WAIT_CANCELED => Ok(false),
            // The keys arrived while the cancel was in flight: the server answered the wait
            // first and then the cancel. The wait succeeded.
            WAIT_STOP_WAITING => match self.u8(grace)? {
                WAIT_CANCELED => Ok(true),
                other => Err(Failure::Protocol(format!("CANCEL_WAIT answered {other}"))),
            },
            other => Err(Failure::Protocol(format!("CANCEL_WAIT answered {other}"))),
        }
    }

    /// The answer to PING `nonce`.
    fn pong(&mut self, nonce: u32, deadline: Instant) -> Result<(), Failure> {
        match self.u32(deadline)? {
            n if n == nonce => Ok(()),
            n => Err(Failure::Protocol(format!("PING {nonce} answered {n}"))),
        }
    }

    /// The answer to LIST_KEYS: a count, then that many keys, `/` prefix removed.
    fn key_list(&mut self, deadline: Instant) -> Result<Vec<String>, Failure> {
        let n = self.i64(deadline)?;
        if n < 0 {
            return Err(Failure::Protocol(format!("LIST_KEYS answered {n} keys")));
        }
        // No allocation from the count: keys are collected as they arrive.
        (0..n)
            .map(|_| {
                let k = self.bytes(deadline)?;
                let k = String::from_utf8_lossy(&k).into_owned();
                Ok(k.strip_prefix(KEY_PREFIX).map(str::to_owned).unwrap_or(k))
            })
            .collect()
    }

    /// The answer to QUEUE_POP: the queue's length before the pop, then the item if there was
    /// one.
    fn popped(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>, Failure> {
        if self.i64(deadline)? > 0 {
            Ok(Some(self.bytes(deadline)?))
        } else {
            Ok(None)
        }
    }
}

fn is_retry(e: &io::Error) -> bool {
    // SO_RCVTIMEO expiry shows up as WouldBlock on Linux; `remaining` turns a passed deadline
    // into TimedOut on the next turn.
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn remaining(deadline: Instant) -> Result<Duration, Failure> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::from(io::ErrorKind::TimedOut).into());
    }
    // set_*_timeout rejects zero and rounds down to microseconds.
    Ok(left.max(Duration::from_millis(1)))
}

/// A client of a `torch.distributed.TCPStore` server (torch's libuv or legacy server, or our
/// [`TcpStoreServer`](super::TcpStoreServer)).
///
/// Keys are stored on the server with torch's `/` prefix, so `client.set("k", ..)` and Python's
/// `store.set("k", ..)` name the same key. Every call has a deadline: `get`/`wait` take one,
/// the others use the client's timeout. Thread-safe: each call borrows a connection from a
/// small pool, so a thread blocked in `wait` does not hold up the others (torch's client, with
/// one socket behind a mutex, would).
#[derive(Debug)]
pub struct TcpStoreClient {
    host: String,
    port: u16,
    timeout: Duration,
    local_ip: IpAddr,
    idle: Mutex<Vec<Conn>>,
}

impl TcpStoreClient {
    /// Connects to the server at `host:port`, retrying until `timeout` passes (the server may
    /// start after the clients, as in every launcher). `timeout` is also the deadline of every
    /// later call that does not take its own.
    pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        let mut delay = Duration::from_millis(10);
        let mut last_err: String;
        loop {
            match open(host, port, deadline) {
                Ok(conn) => {
                    let local_ip = conn
                        .stream
                        .local_addr()
                        .map(|a| a.ip().to_canonical())
                        .map_err(|e| Error::io("TCP store client: local address", e))?;
                    tracing::debug!(host, port, %local_ip, "TCP store client connected");
                    return Ok(TcpStoreClient {
                        host: host.to_owned(),
                        port,
                        timeout,
                        local_ip,
                        idle: Mutex::new(vec![conn]),
                    });
                }
                Err(e) => last_err = e,
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(delay.min(left));
            delay = (delay * 2).min(Duration::from_millis(500));
            if Instant::now() >= deadline {
                // Keep the last real failure for the message rather than "deadline passed".
                break;
            }
        }
        Err(Error::Store {
            op: "connect",
            key: format!("{host}:{port}"),
            reason: format!("no TCP store reachable within {timeout:?}: {last_err}"),
        })
    }

    /// The server's host as given to [`connect`](Self::connect).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The deadline of calls that do not take their own.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `f` on a pooled connection (opening one if none is idle). A connection on which `f`
    /// failed is closed: its stream position is unknown.
    fn with_conn<T>(
        &self,
        op: &'static str,
        key: &str,
        deadline: Instant,
        f: impl FnOnce(&mut Conn) -> Result<T, Failure>,
    ) -> Result<T> {
        let pooled = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.open_another(op, key, deadline)?,
        };
        match f(&mut conn) {
            Ok(v) => {
                let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
                if idle.len() < MAX_IDLE {
                    idle.push(conn);
                }
                Ok(v)
            }
            Err(e) => Err(Error::Store {
                op,
                key: key.to_owned(),
                reason: format!("{e} (TCP store {}:{})", self.host, self.port),
            }),
        }
    }

    /// Opens one more connection, for a call that found the pool empty. It gets the client
    /// timeout, not the call's: a `wait` with a short timeout should time out waiting, not
    /// connecting. One attempt only: the server was up, so a refusal means it is gone.
    fn open_another(&self, op: &'static str, key: &str, deadline: Instant) -> Result<Conn> {
        open(&self.host, self.port, deadline.max(self.op_deadline())).map_err(|reason| {
            Error::Store {
                op,
                key: key.to_owned(),
                reason: format!("cannot open another connection: {reason}"),
            }
        })
    }

    fn op_deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Waits for `keys`; `Ok(false)` on timeout.
    fn wait_keys(&self, op: &'static str, keys: &[&str], timeout: Duration) -> Result<bool> {
        let wire = keys.iter().map(|k| wire_key(k)).collect();
        let deadline = Instant::now() + timeout;
        self.with_conn(op, &keys.join(","), deadline, |c| c.wait(wire, deadline))
    }

    fn timed_out(op: &'static str, keys: &[&str], timeout: Duration) -> Error {
        Error::Store {
            op,
            key: keys.join(","),
            reason: format!("timed out after {timeout:?} waiting for the key(s) to be set"),
        }
    }

    /// Round-trips a nonce; proves the server is alive and answering.
    pub fn ping(&self) -> Result<()> {
        let nonce = std::process::id();
        self.with_conn("ping", "", self.op_deadline(), |c| {
            let d = Instant::now() + self.timeout;
            c.send(&Request::Ping { nonce }, d)?;
            c.pong(nonce, d)
        })
    }

    /// Number of keys on the server (all of them, not only ours; torch's `num_keys`).
    pub fn num_keys(&self) -> Result<i64> {
        let d = self.op_deadline();
        self.with_conn("num_keys", "", d, |c| {
            c.send(&Request::GetNumKeys, d)?;
            c.i64(d)
        })
    }

    /// Appends `value` to the value of `key` (creating it).
    pub fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        let d = self.op_deadline();
        self.with_conn("append", key, d, |c| {
            c.send(
                &Request::Append {
                    key: wire_key(key),
                    value: value.to_vec(),
                },
                d,
            )
        })
    }

    /// Values of all `keys`, waiting (up to the client timeout) until they all exist, as torch's
    /// `multi_get` does.
    pub fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        if !self.wait_keys("multi_get", keys, self.timeout)? {
            return Err(Self::timed_out("multi_get", keys, self.timeout));
        }
        let d = self.op_deadline();
        self.with_conn("multi_get", &keys.join(","), d, |c| {
            c.send(
                &Request::MultiGet {
                    keys: keys.iter().map(|k| wire_key(k)).collect(),
                },
                d,
            )?;
            keys.iter().map(|_| c.bytes(d)).collect()
        })
    }

    /// Sets several keys in one request.
    pub fn multi_set(&self, pairs: &[(&str, &[u8])]) -> Result<()> {
        let names: Vec<&str> = pairs.iter().map(|(k, _)| *k).collect();
        let d = self.op_deadline();
        let pairs = pairs
            .iter()
            .map(|(k, v)| (wire_key(k), v.to_vec()))
            .collect();
        self.with_conn("multi_set", &names.join(","), d, |c| {
            c.send(&Request::MultiSet { pairs }, d)
        })
    }

    /// All keys on the server, with torch's `/` prefix removed where present.
    pub fn list_keys(&self) -> Result<Vec<String>> {
        let d = self.op_deadline();
        self.with_conn("list_keys", "", d, |c| {
            c.send(&Request::ListKeys, d)?;
            c.key_list(d)
        })
    }

    /// Pushes `value` onto the queue `key` (libuv servers only; torch's legacy server does not
    /// implement queues and never answers, so this then fails at the client timeout).
    pub fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        let d = self.op_deadline();
        self.with_conn("queue_push", key, d, |c| {
            c.send(
                &Request::QueuePush {
                    key: wire_key(key),
                    value: value.to_vec(),
                },
                d,
            )
        })
    }

    /// Pops the front of queue `key`. With `block`, waits up to `timeout` for an item; without,
    /// returns `None` when the queue is empty.
    pub fn queue_pop(&self, key: &str, block: bool, timeout: Duration) -> Result<Option<Vec<u8>>> {
        if block && !self.wait_keys("queue_pop", &[key], timeout)? {
            return Err(Self::timed_out("queue_pop", &[key], timeout));
        }
        let d = self.op_deadline();
        self.with_conn("queue_pop", key, d, |c| {
            c.send(&Request::QueuePop { key: wire_key(key) }, d)?;
            c.popped(d)
        })
    }

    /// Length of queue `key`.
    pub fn queue_len(&self, key: &str) -> Result<i64> {
        let d = self.op_deadline();
        self.with_conn("queue_len", key, d, |c| {
            c.send(&Request::QueueLen { key: wire_key(key) }, d)?;
            c.i64(d)
        })
    }

    /// Counts this caller in at barrier `key` and waits up to `timeout` until `world_size`
    /// callers have arrived (torch's server-side `barrier`).
    pub fn barrier(&self, key: &str, world_size: i64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let done = self.with_conn("barrier", key, deadline, |c| {
            c.send(
                &Request::Barrier {
                    key: wire_key(key),
                    world_size,
                },
                self.op_deadline(),
            )?;
            c.stop_waiting("BARRIER", deadline)
        })?;
        if done {
            Ok(())
        } else {
            Err(Self::timed_out("barrier", &[key], timeout))
        }
    }
}

fn wire_key(key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(KEY_PREFIX.len() + key.len());
    k.extend_from_slice(KEY_PREFIX.as_bytes());
    k.extend_from_slice(key.as_bytes());
    k
}

/// Opens and validates one connection: connect, `VALIDATE` with the magic, then `PING` to make
/// sure a store (not some other service) answers. Errors are strings: the caller decides
/// whether to retry.
fn open(host: &str, port: u16, deadline: Instant) -> Result<Conn, String> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}:{port}: {e}"))?
        .collect();
    let mut last: Option<String> = None;
    for addr in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let last = last.unwrap_or_else(|| "none".to_owned());
            return Err(format!("deadline passed (last error: {last})"));
        }
        let stream = match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => s,
            Err(e) => {
                last = Some(format!("connect {addr}: {e}"));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let mut conn = Conn { stream };
        let nonce = std::process::id();
        let handshake = (|| {
            conn.send(
                &Request::Validate {
                    magic: VALIDATION_MAGIC,
                },
                deadline,
            )?;
            conn.send(&Request::Ping { nonce }, deadline)?;
            conn.pong(nonce, deadline)
        })();
        match handshake {
            Ok(()) => return Ok(conn),
            Err(e) => last = Some(format!("handshake with {addr}: {e}")),
        }
    }
    Err(last.unwrap_or_else(|| format!("{host} resolved to no address")))
}

impl Store for TcpStoreClient {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        // Refused here rather than by a closed connection, when this process's configuration
        // is the server's (the usual case: one job, one environment).
        let max = torchcomms_cvars::current().torchcomms_store_max_value_bytes();
        if value.len() > max {
            return Err(Error::Store {
                op: "set",
                key: key.to_owned(),
                reason: format!(
                    "a value of {} bytes is above the store's limit of {max} bytes \
                     (TORCHCOMMS_STORE_MAX_VALUE_BYTES raises it)",
                    value.len()
                ),
            });
        }
        let d = self.op_deadline();
        self.with_conn("set", key, d, |c| {
            c.send(
                &Request::Set {
                    key: wire_key(key),
                    value: value.to_vec(),
                },
                d,
            )
        })
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        // torch's `get` is WAIT then GET: the server never blocks a GET.
        if !self.wait_keys("get", &[key], timeout)? {
            return Err(Self::timed_out("get", &[key], timeout));
        }
        let d = self.op_deadline();
        self.with_conn("get", key, d, |c| {
            c.send(&Request::Get { key: wire_key(key) }, d)?;
            c.bytes(d)
        })
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let d = self.op_deadline();
        self.with_conn("add", key, d, |c| {
            c.send(
                &Request::Add {
                    key: wire_key(key),
                    delta,
                },
                d,
            )?;
            c.i64(d)
        })
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let d = self.op_deadline();
        self.with_conn("compare_set", key, d, |c| {
            c.send(
                &Request::CompareSet {
                    key: wire_key(key),
                    expected: expected.to_vec(),
                    desired: desired.to_vec(),
                },
                d,
            )?;
            c.bytes(d)
        })
    }

    fn delete(&self, key: &str) -> Result<bool> {
        let d = self.op_deadline();
        self.with_conn("delete", key, d, |c| {
            c.send(&Request::DeleteKey { key: wire_key(key) }, d)?;
            Ok(c.i64(d)? == 1)
        })
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        let d = self.op_deadline();
        self.with_conn("check", &keys.join(","), d, |c| {
            c.send(
                &Request::Check {
                    keys: keys.iter().map(|k| wire_key(k)).collect(),
                },
                d,
            )?;
            Ok(c.u8(d)? == CHECK_READY)
        })
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        if self.wait_keys("wait", keys, timeout)? {
            Ok(())
        } else {
            Err(Self::timed_out("wait", keys, timeout))
        }
    }

    fn local_addr_hint(&self) -> Option<IpAddr> {
        Some(self.local_ip)
    }
}

/// Fuzzing entry of the reply decoding (feature `fuzzing`): a [`Conn`] over bytes instead of a
/// socket, so a fuzzer plays a hostile or broken server.
#[cfg(feature = "fuzzing")]
pub(super) mod fuzz {
    use super::*;

    /// A stream whose reads return the fuzzer's bytes, then end of file; writes are dropped.
    struct Bytes<'a>(&'a [u8]);

    impl Read for Bytes<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.0.read(buf)
        }
    }

    impl Write for Bytes<'_> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Wire for Bytes<'_> {
        fn set_read_timeout(&self, _: Option<Duration>) -> io::Result<()> {
            Ok(())
        }

        fn set_write_timeout(&self, _: Option<Duration>) -> io::Result<()> {
            Ok(())
        }
    }

    /// Reads `data` as a server's replies: each reply is one selector byte (which request the
    /// client made) followed by what the server answered. Stops at the first failure, as the
    /// client closes the connection then.
    pub fn replies(data: &[u8]) {
        let mut c = Conn {
            stream: Bytes(data),
        };
        let d = Instant::now() + Duration::from_secs(60);
        loop {
            let Ok(op) = c.u8(d) else { return };
            let ok = match op % 9 {
                0 => c.pong(0x1234_5678, d).is_ok(),
                1 => c.i64(d).is_ok(),
                2 => c.bytes(d).is_ok(),
                3 => c.stop_waiting("WAIT", d).is_ok(),
                4 => c.key_list(d).is_ok(),
                5 => c.popped(d).is_ok(),
                6 => c.u8(d).is_ok(),
                7 => (0..op / 9).all(|_| c.bytes(d).is_ok()),
                _ => c.wait(vec![b"/k".to_vec()], d).is_ok(),
            };
            if !ok {
                return;
            }
        }
    }
}
