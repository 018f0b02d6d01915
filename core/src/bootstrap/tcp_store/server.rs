//! A TCPStore server that torch clients (and ours) can use.
//!
//! One background thread runs a `poll(2)` loop over the listening socket, a wake-up socket and
//! every client connection, like torch's libuv daemon. Being single-threaded makes every
//! operation atomic without locks, and lets a `WAIT` be parked server-side: the reply is queued
//! on the waiting connection when another connection sets the last missing key.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use socket2::{Domain, Protocol, Socket, Type};

use super::protocol::{
    Encoder, Query, Request, CHECK_NOT_READY, CHECK_READY, VALIDATION_MAGIC, WAIT_CANCELED,
    WAIT_STOP_WAITING,
};
use crate::error::{Error, Result};

/// Connection identifier inside the server thread.
type ConnId = u64;

/// Replies produced by one request: (connection, bytes). Usually one entry for the requester,
/// plus one `STOP_WAITING` per waiter the request released.
type Outbox = Vec<(ConnId, Vec<u8>)>;

/// The key-value state and the parked waiters. Pure logic, no sockets: unit-testable.
#[derive(Debug, Default)]
struct Db {
    kv: HashMap<Vec<u8>, Vec<u8>>,
    queues: HashMap<Vec<u8>, VecDeque<Vec<u8>>>,
    /// key -> connections waiting for it (each at most once per key).
    waiting: HashMap<Vec<u8>, Vec<ConnId>>,
    /// connection -> number of its awaited keys still missing.
    awaited: HashMap<ConnId, usize>,
}

/// Why a request made the server drop the connection (torch drops it too: the protocol has no
/// error reply).
#[derive(Debug)]
struct Fatal(String);

impl Db {
    fn present(&self, key: &[u8]) -> bool {
        self.kv.contains_key(key) || self.queues.get(key).is_some_and(|q| !q.is_empty())
    }

    fn handle(&mut self, conn: ConnId, req: Request, out: &mut Outbox) -> Result<(), Fatal> {
        let mut reply = Encoder::default();
        match req {
            // The server loop consumes VALIDATE before requests reach here; a second one on a
            // validated connection is harmless.
            Request::Validate { .. } => {}
            Request::Ping { nonce } => {
                reply.u32(nonce);
            }
            Request::Set { key, value } => self.set(key, value, out),
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                // Same answers as torch: a missing key is created only when `expected` is
                // empty; otherwise the reply is `expected` itself (torch's documented "lie").
                let now = match self.kv.get_mut(&key) {
                    None if expected.is_empty() => {
                        self.kv.insert(key.clone(), desired.clone());
                        desired
                    }
                    None => expected,
                    Some(cur) => {
                        if *cur == expected {
                            *cur = desired;
                        }
                        cur.clone()
                    }
                };
                reply.bytes(&now);
                // torch's libuv server wakes waiters here even when the key is still missing;
                // only a key that now exists releases them.
                if self.kv.contains_key(&key) {
                    self.wake_all(&key, out);
                }
            }
            Request::Get { key } => {
                // torch's client always waits before GET; a key deleted in between reads as
                // empty (libuv server behaviour) rather than killing the connection.
                reply.bytes(self.kv.get(&key).map_or(&[][..], Vec::as_slice));
            }
            Request::Add { key, delta } => {
                let new = self.add(&key, delta)?;
                reply.i64(new);
                self.wake_all(&key, out);
            }
            Request::Check { keys } => {
                let ready = keys.iter().all(|k| self.present(k));
                reply.u8(if ready { CHECK_READY } else { CHECK_NOT_READY });
            }
            Request::Wait { keys } => {
                if !self.park(conn, &keys) {
                    reply.u8(WAIT_STOP_WAITING);
                }
            }
            Request::GetNumKeys => {
                reply.i64(self.kv.len() as i64);
            }
            Request::DeleteKey { key } => {
                reply.i64(i64::from(self.kv.remove(&key).is_some()));
            }
            Request::Append { key, value } => {
                self.kv
                    .entry(key.clone())
                    .or_default()
                    .extend_from_slice(&value);
                self.wake_all(&key, out);
            }
            Request::MultiGet { keys } => {
                for k in &keys {
                    reply.bytes(self.kv.get(k).map_or(&[][..], Vec::as_slice));
                }
            }
            Request::MultiSet { pairs } => {
                for (k, v) in pairs {
                    self.set(k, v, out);
                }
            }
            Request::CancelWait => {
                self.forget(conn);
                reply.u8(WAIT_CANCELED);
            }
            Request::QueuePush { key, value } => {
                self.queues.entry(key.clone()).or_default().push_back(value);
                // One item can satisfy one blocked pop.
                self.wake_one(&key, out);
            }
            Request::QueuePop { key } => {
                let q = self.queues.entry(key).or_default();
                reply.i64(q.len() as i64);
                if let Some(v) = q.pop_front() {
                    reply.bytes(&v);
                }
            }
            Request::QueueLen { key } => {
                reply.i64(self.queues.get(&key).map_or(0, VecDeque::len) as i64);
            }
            Request::ListKeys => {
                reply.i64(self.kv.len() as i64);
                for k in self.kv.keys() {
                    reply.bytes(k);
                }
            }
            Request::Barrier { key, world_size } => {
                let count = self.add(&key, 1)?;
                if count >= world_size {
                    reply.u8(WAIT_STOP_WAITING);
                    self.wake_all(&key, out);
                } else {
                    self.forget(conn);
                    self.waiting.entry(key).or_default().push(conn);
                    self.awaited.insert(conn, 1);
                }
            }
        }
        if !reply.0.is_empty() {
            out.push((conn, reply.0));
        }
        Ok(())
    }

    fn set(&mut self, key: Vec<u8>, value: Vec<u8>, out: &mut Outbox) {
        self.kv.insert(key.clone(), value);
        self.wake_all(&key, out);
    }

    /// `ADD`: values are decimal text so that `get` shows them (`std::to_string` in torch).
    fn add(&mut self, key: &[u8], delta: i64) -> Result<i64, Fatal> {
        let old = match self.kv.get(key) {
            None => 0,
            Some(v) => parse_leading_i64(v).ok_or_else(|| {
                Fatal(format!(
                    "ADD on key {:?} whose value {:?} is not an integer",
                    String::from_utf8_lossy(key),
                    String::from_utf8_lossy(v)
                ))
            })?,
        };
        let new = old.checked_add(delta).ok_or_else(|| {
            Fatal(format!(
                "ADD on key {:?} overflows i64",
                String::from_utf8_lossy(key)
            ))
        })?;
        self.kv.insert(key.to_vec(), new.to_string().into_bytes());
        Ok(new)
    }

    /// Registers `conn` as waiting for the missing ones of `keys`; false when none is missing.
    fn park(&mut self, conn: ConnId, keys: &[Vec<u8>]) -> bool {
        if keys.iter().all(|k| self.present(k)) {
            return false;
        }
        // A client has at most one outstanding WAIT; drop stale state defensively.
        self.forget(conn);
        let mut missing = 0;
        for k in keys {
            if !self.present(k) {
                let list = self.waiting.entry(k.clone()).or_default();
                if !list.contains(&conn) {
                    list.push(conn);
                    missing += 1;
                }
            }
        }
        self.awaited.insert(conn, missing);
        true
    }

    fn wake_all(&mut self, key: &[u8], out: &mut Outbox) {
        if let Some(conns) = self.waiting.remove(key) {
            for c in conns {
                self.release(c, out);
            }
        }
    }

    fn wake_one(&mut self, key: &[u8], out: &mut Outbox) {
        let Some(list) = self.waiting.get_mut(key) else {
            return;
        };
        if list.is_empty() {
            return;
        }
        let c = list.remove(0);
        if list.is_empty() {
            self.waiting.remove(key);
        }
        self.release(c, out);
    }

    /// One of `c`'s keys arrived; answer its WAIT when it was the last one.
    fn release(&mut self, c: ConnId, out: &mut Outbox) {
        if let Some(n) = self.awaited.get_mut(&c) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.awaited.remove(&c);
                out.push((c, vec![WAIT_STOP_WAITING]));
            }
        }
    }

    /// Drops every wait registration of `conn` (cancel, or the connection closed).
    fn forget(&mut self, conn: ConnId) {
        if self.awaited.remove(&conn).is_none() {
            return;
        }
        self.waiting.retain(|_, list| {
            list.retain(|c| *c != conn);
            !list.is_empty()
        });
    }
}

/// `std::stoll` semantics: optional leading whitespace and sign, then digits; trailing bytes
/// are ignored.
fn parse_leading_i64(v: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(v).ok()?.trim_start();
    let digits_start = usize::from(s.starts_with(['-', '+']));
    let end = s[digits_start..]
        .find(|c: char| !c.is_ascii_digit())
        .map_or(s.len(), |i| i + digits_start);
    if end == digits_start {
        return None;
    }
    s[..end].parse().ok()
}

/// One client connection as seen by the server thread.
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    peer: Option<SocketAddr>,
    /// Received bytes; `in_pos..` is not decoded yet.
    inbuf: Vec<u8>,
    in_pos: usize,
    /// Reply bytes; `out_pos..` is not written yet.
    outbuf: Vec<u8>,
    out_pos: usize,
    validated: bool,
    /// Decoding stopped at the output high-water mark with requests still buffered. Nothing on
    /// the socket announces them once the replies drain (the client sent them long ago), so the
    /// server must not sleep in `poll` while the backlog is gone and they wait, nor close a
    /// half-closed connection before answering them.
    held: bool,
    /// The peer closed its sending side: finish what it sent, then close.
    eof: bool,
    dead: bool,
}

/// Most bytes read from one connection per poll round, so one chatty client cannot starve the
/// others.
const READ_BUDGET: usize = 4 << 20;

/// Stop decoding requests from a connection while this many reply bytes wait for it to read
/// them: a client that sends without reading cannot grow the server's memory without bound.
/// Far above anything a synchronous client (torch's, ours) leaves unread.
const OUTPUT_HIGH_WATER: usize = 64 << 20;

impl Conn {
    fn new(stream: TcpStream, peer: SocketAddr) -> Conn {
        Conn {
            stream,
            peer: Some(peer),
            inbuf: Vec::new(),
            in_pos: 0,
            outbuf: Vec::new(),
            out_pos: 0,
            validated: false,
            held: false,
            eof: false,
            dead: false,
        }
    }

    /// Reads what is available (up to the budget); false on a read error.
    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 64 * 1024];
        let mut budget = READ_BUDGET;
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    self.eof = true;
                    return true;
                }
                Ok(n) => {
                    self.inbuf.extend_from_slice(&chunk[..n]);
                    budget = budget.saturating_sub(n);
                    if budget == 0 {
                        return true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!(peer = ?self.peer, error = %e, "TCP store server: read failed");
                    return false;
                }
            }
        }
    }

    /// Writes queued bytes until the socket would block; false on error.
    fn flush(&mut self) -> bool {
        while self.out_pos < self.outbuf.len() {
            match self.stream.write(&self.outbuf[self.out_pos..]) {
                Ok(0) => return false,
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!(peer = ?self.peer, error = %e, "TCP store server: write failed");
                    return false;
                }
            }
        }
        self.outbuf.clear();
        self.out_pos = 0;
        true
    }

    fn pending_output(&self) -> bool {
        self.out_pos < self.outbuf.len()
    }

    /// More than `high_water` reply bytes wait for the peer to read them.
    fn backlogged(&self, high_water: usize) -> bool {
        self.outbuf.len() - self.out_pos > high_water
    }

    /// Held requests that can be decoded again: the backlog drained below the mark.
    fn resumable(&self, high_water: usize) -> bool {
        self.held && !self.dead && !self.backlogged(high_water)
    }

    fn pending_input(&self) -> bool {
        self.in_pos < self.inbuf.len()
    }
}

/// The server thread's state.
struct Daemon {
    listener: TcpListener,
    wake_rx: UnixStream,
    stop: Arc<AtomicBool>,
    conns: HashMap<ConnId, Conn>,
    next_id: ConnId,
    db: Db,
    /// [`OUTPUT_HIGH_WATER`], smaller in tests.
    high_water: usize,
}

impl Daemon {
    fn run(mut self) {
        loop {
            let (listener_ready, conn_events) = match self.poll_once() {
                Ok(ev) => ev,
                Err(e) => {
                    tracing::error!(error = %e, "TCP store server: poll failed; stopping");
                    return;
                }
            };
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if listener_ready {
                self.accept_all();
            }
            for (id, flags) in conn_events {
                self.service(id, flags);
            }
            // Decode everything buffered, including input left over while a connection was
            // backlogged (no new POLLIN will announce it).
            let ready: Vec<ConnId> = self
                .conns
                .iter()
                .filter(|(_, c)| c.pending_input() || c.eof)
                .map(|(id, _)| *id)
                .collect();
            for id in ready {
                self.process(id);
            }
            for c in self.conns.values_mut() {
                if !c.dead && c.pending_output() && !c.flush() {
                    c.dead = true;
                }
            }
            self.reap();
        }
    }

    /// Waits for activity; returns whether the listener is readable and the connections with
    /// events.
    fn poll_once(&mut self) -> io::Result<(bool, Vec<(ConnId, PollFlags)>)> {
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        let mut fds = Vec::with_capacity(ids.len() + 2);
        fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
        fds.push(PollFd::new(self.wake_rx.as_fd(), PollFlags::POLLIN));
        for id in &ids {
            let c = &self.conns[id];
            let mut flags = PollFlags::empty();
            // After EOF the socket stays readable forever: stop asking.
            if !c.backlogged(self.high_water) && !c.eof {
                flags |= PollFlags::POLLIN;
            }
            if c.pending_output() {
                flags |= PollFlags::POLLOUT;
            }
            fds.push(PollFd::new(c.stream.as_fd(), flags));
        }
        // Requests held at the high-water mark whose replies have all been written since: decode
        // them now rather than wait for an event that will not come.
        let timeout = if self.conns.values().any(|c| c.resumable(self.high_water)) {
            PollTimeout::ZERO
        } else {
            PollTimeout::NONE
        };
        loop {
            match poll(&mut fds, timeout) {
                Ok(_) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(io::Error::from(e)),
            }
        }
        let listener_ready = fds[0].any().unwrap_or(false);
        let events = ids
            .iter()
            .zip(&fds[2..])
            .filter_map(|(id, fd)| fd.revents().filter(|r| !r.is_empty()).map(|r| (*id, r)))
            .collect();
        Ok((listener_ready, events))
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    if let Err(e) = stream.set_nonblocking(true) {
                        tracing::warn!(%peer, error = %e, "TCP store server: cannot use connection");
                        continue;
                    }
                    // Replies are tiny; do not let Nagle hold them back.
                    let _ = stream.set_nodelay(true);
                    let id = self.next_id;
                    self.next_id += 1;
                    tracing::trace!(%peer, id, "TCP store server: accepted");
                    self.conns.insert(id, Conn::new(stream, peer));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE and friends: keep serving the connections we have.
                    tracing::warn!(error = %e, "TCP store server: accept failed");
                    return;
                }
            }
        }
    }

    /// Moves bytes for one connection according to its poll events.
    fn service(&mut self, id: ConnId, flags: PollFlags) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if flags.intersects(PollFlags::POLLOUT) && !conn.flush() {
            conn.dead = true;
            return;
        }
        // An error, or a hang-up while we are not reading (so no EOF would be seen): the peer
        // can take no more replies.
        if flags.intersects(PollFlags::POLLERR)
            || (flags.intersects(PollFlags::POLLHUP)
                && (conn.backlogged(self.high_water) || conn.eof))
        {
            conn.dead = true;
            return;
        }
        if flags.intersects(PollFlags::POLLIN | PollFlags::POLLHUP) && !conn.fill() {
            conn.dead = true;
        }
    }

    /// Decodes and runs the buffered requests of one connection while it can take replies.
    fn process(&mut self, id: ConnId) {
        loop {
            let Some(conn) = self.conns.get_mut(&id) else {
                return;
            };
            conn.held = false;
            if conn.dead {
                break;
            }
            if conn.backlogged(self.high_water) {
                conn.held = conn.pending_input();
                break;
            }
            // Like torch: the first request must be VALIDATE with the magic. Checking the
            // command byte first drops a stray client before we buffer its data.
            let first = conn.inbuf.get(conn.in_pos).copied();
            if !conn.validated && first.is_some_and(|b| b != Query::Validate as u8) {
                tracing::warn!(peer = ?conn.peer, first_byte = ?first,
                    "TCP store server: client did not start with VALIDATE; closing");
                conn.dead = true;
                break;
            }
            let req = match Request::parse(&conn.inbuf[conn.in_pos..]) {
                Ok(Some((req, n))) => {
                    conn.in_pos += n;
                    req
                }
                // Nothing complete left (after EOF, nothing more will come: `reap` closes the
                // connection once its replies are out).
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(peer = ?conn.peer, error = %e,
                        "TCP store server: bad request; closing");
                    conn.dead = true;
                    break;
                }
            };
            if !conn.validated {
                if req
                    == (Request::Validate {
                        magic: VALIDATION_MAGIC,
                    })
                {
                    conn.validated = true;
                    continue;
                }
                tracing::warn!(peer = ?conn.peer, request = ?req,
                    "TCP store server: wrong VALIDATE magic; closing");
                conn.dead = true;
                break;
            }
            let peer = conn.peer;
            let mut out = Outbox::new();
            if let Err(Fatal(why)) = self.db.handle(id, req, &mut out) {
                tracing::warn!(?peer, "TCP store server: {why}; closing");
                if let Some(c) = self.conns.get_mut(&id) {
                    c.dead = true;
                }
                break;
            }
            for (to, bytes) in out {
                if let Some(c) = self.conns.get_mut(&to) {
                    if !c.dead {
                        c.outbuf.extend_from_slice(&bytes);
                    }
                }
            }
        }
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.inbuf.drain(..conn.in_pos);
            conn.in_pos = 0;
        }
    }

    fn reap(&mut self) {
        let dead: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.dead || (c.eof && !c.pending_output() && !c.held))
            .map(|(id, _)| *id)
            .collect();
        for id in dead {
            self.db.forget(id);
            if let Some(c) = self.conns.remove(&id) {
                tracing::trace!(peer = ?c.peer, id, "TCP store server: connection closed");
            }
        }
    }
}

/// A TCPStore server compatible with `torch.distributed.TCPStore` clients (torch ≥ 2.4, which
/// send the VALIDATE/PING handshake) and with [`TcpStoreClient`](super::TcpStoreClient).
///
/// Serves on a background thread until dropped or [`shutdown`](Self::shutdown); then every
/// connection is closed and the port is free to bind again at once (the listener uses
/// `SO_REUSEADDR`, so connections lingering in `TIME_WAIT` do not block the next server).
#[derive(Debug)]
pub struct TcpStoreServer {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    wake_tx: Option<UnixStream>,
    thread: Option<JoinHandle<()>>,
}

impl TcpStoreServer {
    /// Binds `host:port` and starts serving. `port` 0 picks an ephemeral port (see
    /// [`port`](Self::port)). An empty `host`, `0.0.0.0` or `::` listens on every interface
    /// (IPv6 dual-stack when the host has IPv6, else IPv4), as torch's server does.
    pub fn bind(host: &str, port: u16) -> Result<Self> {
        Self::bind_with(host, port, OUTPUT_HIGH_WATER)
    }

    /// [`bind`](Self::bind) with another output high-water mark per connection.
    fn bind_with(host: &str, port: u16, high_water: usize) -> Result<Self> {
        let listener = bind_listener(host, port)?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| Error::io("TCP store server: local address of listener", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("TCP store server: set listener non-blocking", e))?;
        let (wake_tx, wake_rx) =
            UnixStream::pair().map_err(|e| Error::io("TCP store server: wake-up socket", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let daemon = Daemon {
            listener,
            wake_rx,
            stop: stop.clone(),
            conns: HashMap::new(),
            next_id: 0,
            db: Db::default(),
            high_water,
        };
        let thread = std::thread::Builder::new()
            .name(format!("tcpstore-{}", local_addr.port()))
            .spawn(move || daemon.run())
            .map_err(|e| Error::io("TCP store server: spawn thread", e))?;
        tracing::debug!(%local_addr, "TCP store server listening");
        Ok(TcpStoreServer {
            local_addr,
            stop,
            wake_tx: Some(wake_tx),
            thread: Some(thread),
        })
    }

    /// The port the server listens on (the ephemeral one when bound with port 0).
    pub fn port(&self) -> u16 {
        self.local_addr.port()
    }

    /// The address the listener is bound to (a wildcard address when bound to all interfaces).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops serving, closes all connections and frees the port; reports a server thread that
    /// died abnormally.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<()> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        self.stop.store(true, Ordering::Release);
        if let Some(mut tx) = self.wake_tx.take() {
            // A failed write means the thread is gone already; join tells us how.
            let _ = tx.write_all(&[1]);
        }
        thread.join().map_err(|_| Error::Bootstrap {
            comm: String::new(),
            reason: format!("TCP store server on {} panicked", self.local_addr),
        })
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        if let Err(e) = self.stop_and_join() {
            tracing::error!(error = %e, "TCP store server shutdown");
        }
    }
}

fn bind_listener(host: &str, port: u16) -> Result<TcpListener> {
    let wildcard = matches!(host, "" | "0.0.0.0" | "::" | "[::]" | "*");
    if wildcard {
        let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
        match listen_on(v6, true) {
            Ok(l) => return Ok(l),
            // Hosts without IPv6 fail with EAFNOSUPPORT/EADDRNOTAVAIL; a port conflict is real.
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                return Err(Error::io(format!("TCP store server: bind {v6}"), e));
            }
            Err(e) => tracing::debug!(error = %e, "TCP store server: no IPv6, using IPv4"),
        }
        let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
        return listen_on(v4, false)
            .map_err(|e| Error::io(format!("TCP store server: bind {v4}"), e));
    }
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::io(format!("TCP store server: resolve {host}:{port}"), e))?
        .collect();
    let mut last = None;
    for addr in addrs {
        match listen_on(addr, false) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some((addr, e)),
        }
    }
    Err(match last {
        Some((addr, e)) => Error::io(format!("TCP store server: bind {addr}"), e),
        None => Error::invalid("host", "a resolvable host name or address", host),
    })
}

fn listen_on(addr: SocketAddr, dual_stack: bool) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if dual_stack {
        socket.set_only_v6(false)?;
    }
    socket.set_cloexec(true)?;
    socket.bind(&addr.into())?;
    // Every rank connects at once during bootstrap: a deep backlog avoids refused/dropped SYNs
    // (the kernel caps it at somaxconn).
    socket.listen(65535)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server whose high-water mark of 0 makes every reply hold back the requests after it,
    /// and a client that sent it `n` PINGs (nonces `0..n`) at once, replies unread.
    fn pings_held_one_by_one(n: u32) -> (TcpStoreServer, TcpStream) {
        let server = TcpStoreServer::bind_with("127.0.0.1", 0, 0).unwrap();
        let mut s = super::super::tests::raw_client(server.port());
        let pings: Vec<u8> = (0..n)
            .flat_map(|nonce| Request::Ping { nonce }.encode())
            .collect();
        s.write_all(&pings).unwrap();
        (server, s)
    }

    /// Once the reply ahead of the held requests is written in full, nothing on the socket wakes
    /// the server (the client sent everything at the start): it must go on by itself.
    #[test]
    fn requests_held_at_the_high_water_mark_are_served_once_the_replies_drain() {
        let (_server, mut s) = pings_held_one_by_one(50);
        for nonce in 0..50u32 {
            let mut got = [0u8; 4];
            s.read_exact(&mut got)
                .unwrap_or_else(|e| panic!("reply {nonce}: {e}"));
            assert_eq!(u32::from_le_bytes(got), nonce);
        }
    }

    /// The same with the client's sending side closed behind its requests: the held ones are
    /// still answered before the server closes the connection.
    #[test]
    fn a_half_closed_client_gets_the_replies_to_its_held_requests() {
        let (_server, mut s) = pings_held_one_by_one(50);
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut replies = Vec::new();
        s.read_to_end(&mut replies).unwrap();
        let nonces: Vec<u32> = replies
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(nonces, (0..50).collect::<Vec<u32>>());
    }

    fn k(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn wait_is_answered_when_the_last_key_arrives() {
        let mut db = Db::default();
        let mut out = Outbox::new();
        db.handle(
            1,
            Request::Wait {
                keys: vec![k("a"), k("b")],
            },
            &mut out,
        )
        .unwrap();
        assert!(out.is_empty());
        db.handle(
            2,
            Request::Set {
                key: k("a"),
                value: k("1"),
            },
            &mut out,
        )
        .unwrap();
        assert!(out.is_empty());
        db.handle(
            2,
            Request::Add {
                key: k("b"),
                delta: 2,
            },
            &mut out,
        )
        .unwrap();
        out.sort();
        assert_eq!(
            out,
            vec![
                (1, vec![WAIT_STOP_WAITING]),
                (2, 2i64.to_le_bytes().to_vec())
            ]
        );
        assert!(db.waiting.is_empty() && db.awaited.is_empty());
    }

    #[test]
    fn cancel_wait_forgets_the_waiter() {
        let mut db = Db::default();
        let mut out = Outbox::new();
        db.handle(1, Request::Wait { keys: vec![k("a")] }, &mut out)
            .unwrap();
        db.handle(1, Request::CancelWait, &mut out).unwrap();
        assert_eq!(out, vec![(1, vec![WAIT_CANCELED])]);
        out.clear();
        db.handle(
            2,
            Request::Set {
                key: k("a"),
                value: k("1"),
            },
            &mut out,
        )
        .unwrap();
        assert!(
            out.is_empty(),
            "a cancelled waiter must not get STOP_WAITING: {out:?}"
        );
    }

    #[test]
    fn queue_push_releases_one_blocked_pop() {
        let mut db = Db::default();
        let mut out = Outbox::new();
        db.handle(1, Request::Wait { keys: vec![k("q")] }, &mut out)
            .unwrap();
        db.handle(2, Request::Wait { keys: vec![k("q")] }, &mut out)
            .unwrap();
        db.handle(
            3,
            Request::QueuePush {
                key: k("q"),
                value: k("x"),
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out, vec![(1, vec![WAIT_STOP_WAITING])]);
        out.clear();
        db.handle(1, Request::QueuePop { key: k("q") }, &mut out)
            .unwrap();
        let mut expect = Encoder::default();
        expect.i64(1).bytes(b"x");
        assert_eq!(out, vec![(1, expect.0)]);
    }

    #[test]
    fn add_follows_stoll_and_rejects_garbage() {
        assert_eq!(parse_leading_i64(b" -12abc"), Some(-12));
        assert_eq!(parse_leading_i64(b"+7"), Some(7));
        assert_eq!(parse_leading_i64(b"abc"), None);
        assert_eq!(parse_leading_i64(b"-"), None);
        let mut db = Db::default();
        let mut out = Outbox::new();
        db.handle(
            1,
            Request::Set {
                key: k("x"),
                value: k("oops"),
            },
            &mut out,
        )
        .unwrap();
        assert!(db
            .handle(
                1,
                Request::Add {
                    key: k("x"),
                    delta: 1
                },
                &mut out
            )
            .is_err());
    }

    #[test]
    fn barrier_releases_everyone_at_world_size() {
        let mut db = Db::default();
        let mut out = Outbox::new();
        for conn in 0..2 {
            db.handle(
                conn,
                Request::Barrier {
                    key: k("b"),
                    world_size: 3,
                },
                &mut out,
            )
            .unwrap();
        }
        assert!(out.is_empty());
        db.handle(
            2,
            Request::Barrier {
                key: k("b"),
                world_size: 3,
            },
            &mut out,
        )
        .unwrap();
        let mut who: Vec<ConnId> = out.iter().map(|(c, _)| *c).collect();
        who.sort();
        assert_eq!(who, vec![0, 1, 2]);
    }
}
