//! [`RdmaTransport`]: point-to-point one-sided writes and reads between any two processes,
//! the API of upstream's RDMA transport, in software (TCP, cross-memory attach, CUDA IPC).
//!
//! Connecting: both sides `bind()` and exchange URLs out of band, then each calls
//! `connect(other)`. The side with the smaller URL dials; the other side's listener (running
//! since `bind()`) acknowledges a hello naming its token and keeps the connection once its
//! `connect()` named the dialer. So the two `connect()` calls may come in any order, from one
//! thread of one process too: the listening side's `connect()` returns at once, and its
//! transfers wait (within their deadline) until the dialer has arrived.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::copy;
use super::error::{RdmaError, Result};
use super::ib_path::{IbPath, IbSetup, IB_CHUNK};
use super::key::host_id;
use super::link::{Link, Payload};
use super::registry::{MemDevice, RdmaMemoryMutableView, RdmaMemoryView, RdmaRemoteBuffer};
use super::url::{hello, listen_ip, read_hello, send_ack, PeerUrl, ACK};
use super::wait::wait_for;
use super::wire::{Frame, Status, Via};

/// How data moves (`TORCHCOMMS_RDMA_PATH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPath {
    /// Cross-memory attach or CUDA IPC within a host, the stream otherwise.
    Auto,
    /// Always a payload over the stream.
    Tcp,
    /// RDMA writes over ib (`CTRAN_IB_PROVIDER`), when both sides chose it; the stream
    /// otherwise.
    Ib,
}

/// Transfers this side issued, by the path they took (tests and diagnostics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Moved by cross-memory attach.
    pub cma: u64,
    /// Moved device to device through CUDA IPC.
    pub ipc: u64,
    /// Moved as a payload over TCP.
    pub tcp: u64,
    /// Moved over ib (counted per transfer, whatever its chunks).
    pub ib: u64,
    /// Of those, moved in place between the two sides' registered memory (no staging copy;
    /// CUDA memory through dma-buf: GPUDirect RDMA).
    pub ib_in_place: u64,
    /// Times cross-memory attach was refused by the peer (then TCP was used).
    pub cma_denied: u64,
}

#[derive(Default)]
struct Counters {
    cma: AtomicU64,
    ipc: AtomicU64,
    tcp: AtomicU64,
    ib: AtomicU64,
    ib_in_place: AtomicU64,
    cma_denied: AtomicU64,
}

#[derive(Default)]
struct Conn {
    me: Option<(PeerUrl, String)>,
    peer: Option<(PeerUrl, String)>,
    deadline: Option<Instant>,
    /// Accepted hellos naming our token, before `connect()` said whom to expect.
    stash: Vec<([u8; 16], TcpStream)>,
    link: Option<Arc<Link>>,
    failed: Option<RdmaError>,
    /// The ib data path, once both URLs offered one.
    ib: Option<Arc<IbPath>>,
}

struct Inner {
    conn: Mutex<Conn>,
    changed: Condvar,
    closing: AtomicBool,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the link over `stream`; `ack`: its first bytes acknowledge the dialer's hello
    /// (sent after the link is installed, so `connected()` is true here by the time the
    /// dialer's `connect()` returns).
    fn establish(&self, c: &mut Conn, stream: TcpStream, ack: bool) {
        let peer = c.peer.as_ref().map_or_else(String::new, |p| p.1.clone());
        match Link::start(stream, peer, ack.then(|| vec![ACK]), c.ib.clone()) {
            Ok(l) => c.link = Some(Arc::new(l)),
            Err(e) => c.failed = Some(e),
        }
        self.changed.notify_all();
    }
}

/// One end of a point-to-point connection for one-sided transfers.
pub struct RdmaTransport {
    device: MemDevice,
    limit: Duration,
    path: DataPath,
    cma_ok: AtomicBool,
    counters: Counters,
    inner: Arc<Inner>,
    acceptor: Mutex<Option<JoinHandle<()>>>,
    /// This side's ib resources between `bind()` and `connect()`.
    ib_setup: Mutex<Option<IbSetup>>,
    provider: crate::transport::ib::IbProvider,
    /// Register memory with the NIC in place (`TORCHCOMMS_RDMA_IB_IN_PLACE`).
    ib_in_place: bool,
}

impl std::fmt::Debug for RdmaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaTransport")
            .field("device", &self.device)
            .field("path", &self.path)
            .finish()
    }
}

impl RdmaTransport {
    /// A transport for memory of `device` (its transfers may use memory of any device).
    /// Reads `TORCHCOMMS_RDMA_TIMEOUT_SECONDS` and `TORCHCOMMS_RDMA_PATH`.
    pub fn new(device: MemDevice) -> Result<RdmaTransport> {
        let cv = torchcomms_cvars::reload().map_err(|e| RdmaError::Config(e.to_string()))?;
        let path = match cv.torchcomms_rdma_path() {
            "tcp" => DataPath::Tcp,
            "ib" => DataPath::Ib,
            _ => DataPath::Auto,
        };
        let provider = crate::transport::ib::IbProvider::parse(cv.ctran_ib_provider())
            .ok_or_else(|| RdmaError::Config("CTRAN_IB_PROVIDER: verbs or soft".into()))?;
        Ok(RdmaTransport {
            device,
            limit: cv.torchcomms_rdma_timeout_seconds(),
            path,
            cma_ok: AtomicBool::new(true),
            counters: Counters::default(),
            inner: Arc::new(Inner {
                conn: Mutex::new(Conn::default()),
                changed: Condvar::new(),
                closing: AtomicBool::new(false),
            }),
            acceptor: Mutex::new(None),
            ib_setup: Mutex::new(None),
            provider,
            ib_in_place: cv.torchcomms_rdma_ib_in_place(),
        })
    }

    /// Always true: the software transport works wherever this library does.
    pub fn supported() -> bool {
        true
    }

    /// The device given at creation.
    pub fn device(&self) -> MemDevice {
        self.device
    }

    /// The data path in use.
    pub fn data_path(&self) -> DataPath {
        self.path
    }

    /// Overrides `CTRAN_IB_PROVIDER` for this transport's ib data path (before `bind()`).
    pub fn set_ib_provider(&mut self, provider: crate::transport::ib::IbProvider) {
        self.provider = provider;
    }

    /// Overrides `TORCHCOMMS_RDMA_IB_IN_PLACE` for this transport (before `connect()`).
    pub fn set_ib_in_place(&mut self, in_place: bool) {
        self.ib_in_place = in_place;
    }

    /// Overrides `TORCHCOMMS_RDMA_PATH` for this transport (the ib path: before `bind()`).
    pub fn set_data_path(&mut self, path: DataPath) {
        self.path = path;
    }

    /// Transfers issued so far, by path.
    pub fn stats(&self) -> PathStats {
        let c = &self.counters;
        PathStats {
            cma: c.cma.load(Ordering::Relaxed),
            ipc: c.ipc.load(Ordering::Relaxed),
            tcp: c.tcp.load(Ordering::Relaxed),
            ib: c.ib.load(Ordering::Relaxed),
            ib_in_place: c.ib_in_place.load(Ordering::Relaxed),
            cma_denied: c.cma_denied.load(Ordering::Relaxed),
        }
    }

    /// Starts listening and returns the URL to give the peer.
    pub fn bind(&self) -> Result<String> {
        let mut acceptor = self.acceptor.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, text)) = &self.inner.lock().me {
            return Ok(text.clone());
        }
        let ip = listen_ip()?;
        let io = |op, e: std::io::Error| RdmaError::Io {
            op,
            peer: ip.to_string(),
            detail: e.to_string(),
        };
        let ib = match self.path {
            DataPath::Ib => Some(IbSetup::open(self.provider)?),
            _ => None,
        };
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| io("bind", e))?;
        listener.set_nonblocking(true).map_err(|e| io("bind", e))?;
        let url = PeerUrl {
            addr: listener.local_addr().map_err(|e| io("bind", e))?,
            token: rand::random(),
            host: host_id(),
            pid: std::process::id(),
            ib: ib.as_ref().map(|s| s.endpoint().to_vec()),
        };
        *self.ib_setup.lock().unwrap_or_else(|p| p.into_inner()) = ib;
        let text = url.to_string();
        self.inner.lock().me = Some((url.clone(), text.clone()));
        let inner = Arc::clone(&self.inner);
        *acceptor = Some(
            std::thread::Builder::new()
                .name("tc-rdma-accept".into())
                .spawn(move || accept_loop(listener, url.token, inner))
                .map_err(|e| io("starting the listener thread", e))?,
        );
        Ok(text)
    }

    /// Connects to the peer whose `bind()` returned `peer_url`, within the connect deadline.
    pub fn connect(&self, peer_url: &str) -> Result<()> {
        let peer = PeerUrl::parse(peer_url)?;
        let deadline = Instant::now() + self.limit;
        let (me, me_text) = {
            let mut c = self.inner.lock();
            let Some(me) = c.me.clone() else {
                return Err(RdmaError::State {
                    op: "connect",
                    detail: "call bind() first".into(),
                });
            };
            if c.peer.is_some() {
                return Err(RdmaError::State {
                    op: "connect",
                    detail: "already connected (a transport connects to one peer)".into(),
                });
            }
            if me.1 == peer_url {
                return Err(RdmaError::InvalidArgument {
                    arg: "peer_url",
                    detail: "this transport's own URL; expected the peer's".into(),
                });
            }
            // Both sides' QPs are connected before either has a link (the listener's exists
            // only once this side dialed, after connecting here), so no write meets a QP that
            // is not ready.
            let setup = self
                .ib_setup
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            match (setup, &peer.ib) {
                (Some(setup), Some(ep)) => {
                    c.ib = Some(Arc::new(setup.connect(ep, self.ib_in_place)?))
                }
                (Some(_), None) => tracing::info!(
                    "RdmaTransport: the peer offers no ib data path; transfers use the stream"
                ),
                (None, _) => {}
            }
            c.peer = Some((peer.clone(), peer_url.to_string()));
            c.deadline = Some(deadline);
            me
        };
        if me_text.as_str() > peer_url {
            // The listening side: the dialer may be here already.
            let mut c = self.inner.lock();
            let stash = std::mem::take(&mut c.stash);
            for (from, stream) in stash {
                if from == peer.token && c.link.is_none() {
                    self.inner.establish(&mut c, stream, false);
                }
            }
            if let Some(e) = &c.failed {
                return Err(e.clone());
            }
            return Ok(());
        }
        let stream = dial(&peer, peer_url, &me.token, deadline, self.limit)?;
        let mut c = self.inner.lock();
        self.inner.establish(&mut c, stream, false);
        match &c.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Whether the connection is up.
    pub fn connected(&self) -> bool {
        self.inner
            .lock()
            .link
            .as_ref()
            .is_some_and(|l| l.is_alive())
    }

    fn link(&self, op: &'static str, deadline: Instant, limit: Duration) -> Result<Arc<Link>> {
        let c = self.inner.lock();
        let (c, outcome) = wait_for(&self.inner.changed, c, deadline, |c| {
            if let Some(l) = &c.link {
                return Some(Ok(Arc::clone(l)));
            }
            if let Some(e) = &c.failed {
                return Some(Err(e.clone()));
            }
            c.peer.is_none().then(|| {
                Err(RdmaError::State {
                    op,
                    detail: "not connected: call bind() and connect() first".into(),
                })
            })
        });
        outcome.unwrap_or_else(|| {
            let peer = c.peer.as_ref().map_or("", |p| p.1.as_str());
            Err(RdmaError::Timeout {
                op,
                after: limit,
                peer: format!("{peer} (which never dialed in)"),
            })
        })
    }

    fn deadline(&self, timeout: Option<Duration>) -> (Instant, Duration) {
        let limit = timeout.unwrap_or(self.limit);
        (Instant::now() + limit, limit)
    }

    /// Which path a transfer between `local` and the remote memory takes.
    fn via_for(&self, local: MemDevice, remote: &RdmaRemoteBuffer) -> Option<MemDevice> {
        if self.path == DataPath::Tcp || remote.key.host != host_id() {
            return None;
        }
        match (local, remote.key.device) {
            (MemDevice::Cpu, MemDevice::Cpu) if self.cma_ok.load(Ordering::Relaxed) => {
                Some(MemDevice::Cpu)
            }
            (MemDevice::Cuda(i), MemDevice::Cuda(_)) => Some(MemDevice::Cuda(i)),
            _ => None,
        }
    }

    /// Writes `local` into the peer's `remote` and waits until it landed there. With `notify`,
    /// the peer's next `wait_for_write()` returns once it has.
    pub fn write(
        &self,
        local: &RdmaMemoryView,
        remote: &RdmaRemoteBuffer,
        notify: bool,
        timeout: Option<Duration>,
    ) -> Result<()> {
        self.transfer(&local.0, remote, notify, timeout, true)
    }

    /// Reads the peer's `remote` into `local` and waits until it is here.
    pub fn read(
        &self,
        local: &RdmaMemoryMutableView,
        remote: &RdmaRemoteBuffer,
        timeout: Option<Duration>,
    ) -> Result<()> {
        self.transfer(&local.0, remote, false, timeout, false)
    }

    fn transfer(
        &self,
        local: &super::registry::View,
        remote: &RdmaRemoteBuffer,
        notify: bool,
        timeout: Option<Duration>,
        write: bool,
    ) -> Result<()> {
        let op = if write { "write" } else { "read" };
        if local.len != remote.len {
            return Err(RdmaError::LengthMismatch {
                local: local.len,
                remote: remote.len,
            });
        }
        let (deadline, limit) = self.deadline(timeout);
        let link = self.link(op, deadline, limit)?;
        let pin = Arc::new(local.pin()?);
        let key = remote.key.encode();
        let ib = self.inner.lock().ib.clone();
        if let Some(ib) = ib.filter(|_| self.path == DataPath::Ib) {
            let at = (deadline, limit);
            let in_place = match ib.direct_key(&pin) {
                Some(ib_key) => {
                    transfer_in_place(&ib, &link, &pin, remote, &key, ib_key, notify, write, at)?
                }
                None => false,
            };
            if in_place {
                self.counters.ib_in_place.fetch_add(1, Ordering::Relaxed);
            } else {
                transfer_ib(&ib, &link, &pin, remote, key, notify, write, at)?;
            }
            self.counters.ib.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let mut via = match self.via_for(pin.device, remote) {
            Some(MemDevice::Cpu) => Via::Cma {
                pid: std::process::id(),
                addr: pin.addr,
            },
            Some(MemDevice::Cuda(_)) if remote.key.is_mine() => Via::Local { addr: pin.addr },
            Some(MemDevice::Cuda(_)) => {
                let (handle, buffer_id, offset) = copy::export(&pin)?;
                Via::Ipc {
                    handle,
                    buffer_id,
                    offset,
                }
            }
            None => Via::Payload,
        };
        loop {
            let payload = via == Via::Payload;
            let v = via.clone();
            let frame =
                |req| Frame::request(write, req, key.clone(), remote.ptr, remote.len, notify, v);
            let carry = match (payload, write) {
                (false, _) => Payload::None,
                (true, true) => Payload::Send,
                (true, false) => Payload::Fill,
            };
            let status = link.request(op, frame, Arc::clone(&pin), carry, (deadline, limit))?;
            match status {
                Status::CmaDenied if !payload => {
                    tracing::info!(
                        "cross-memory attach is not permitted between these processes \
                         (ptrace rules); RdmaTransport uses the TCP payload path from now on"
                    );
                    self.cma_ok.store(false, Ordering::Relaxed);
                    self.counters.cma_denied.fetch_add(1, Ordering::Relaxed);
                    via = Via::Payload;
                }
                _ => {
                    let c = match via {
                        Via::Payload => &self.counters.tcp,
                        Via::Ib | Via::IbDirect { .. } => &self.counters.ib,
                        Via::Cma { .. } => &self.counters.cma,
                        Via::Ipc { .. } | Via::Local { .. } => &self.counters.ipc,
                    };
                    c.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
            }
        }
    }

    /// Waits until a write of the peer with `notify` has landed here (consumes one).
    pub fn wait_for_write(&self, timeout: Option<Duration>) -> Result<()> {
        let (deadline, limit) = self.deadline(timeout);
        self.link("wait_for_write", deadline, limit)?
            .wait_notify(deadline, limit)
    }
}

/// A transfer over ib in place: one request naming this side's registered range; the target
/// moves the bytes. `false` when the target cannot register its memory (stage instead).
#[allow(clippy::too_many_arguments)]
fn transfer_in_place(
    ib: &IbPath,
    link: &Link,
    pin: &Arc<super::registry::Pin>,
    remote: &RdmaRemoteBuffer,
    key: &str,
    ib_key: ibverbx::RemoteKey,
    notify: bool,
    write: bool,
    at: (Instant, Duration),
) -> Result<bool> {
    let op = if write { "write" } else { "read" };
    let via = Via::IbDirect { key: ib_key };
    let frame = |req| {
        Frame::request(
            write,
            req,
            key.to_string(),
            remote.ptr,
            remote.len,
            notify,
            via,
        )
    };
    match link.request(op, frame, Arc::clone(pin), Payload::None, at)? {
        Status::NoDirect => {
            ib.stage_from_now("the peer cannot register its memory in place");
            Ok(false)
        }
        _ => Ok(true),
    }
}

/// A transfer over the ib data path, chunk by chunk (each a round trip over the stream).
#[allow(clippy::too_many_arguments)]
fn transfer_ib(
    ib: &IbPath,
    link: &Link,
    local: &super::registry::Pin,
    remote: &RdmaRemoteBuffer,
    key: String,
    notify: bool,
    write: bool,
    (deadline, limit): (Instant, Duration),
) -> Result<()> {
    let op = if write { "write" } else { "read" };
    let claim = local.claim();
    let mut buf = vec![0u8; (remote.len as usize).min(IB_CHUNK)];
    let mut off = 0u64;
    loop {
        let n = (remote.len - off).min(IB_CHUNK as u64);
        let last = off + n >= remote.len;
        let part = Arc::new(claim.pin_part(off, n)?);
        let data = &mut buf[..n as usize];
        let key = key.clone();
        if write {
            let _turn = ib.write_turn();
            copy::read_pin(&part, data)?;
            ib.push_write(data, deadline)?;
            let at = remote.ptr + off;
            let frame = |req| Frame::request(true, req, key, at, n, notify && last, Via::Ib);
            link.request(op, frame, part, Payload::None, (deadline, limit))?;
        } else {
            let _turn = ib.read_turn();
            let at = remote.ptr + off;
            let frame = |req| Frame::request(false, req, key, at, n, false, Via::Ib);
            link.request(
                op,
                frame,
                Arc::clone(&part),
                Payload::None,
                (deadline, limit),
            )?;
            ib.take_read(data);
            copy::write_pin(&part, data)?;
        }
        off += n;
        if last {
            return Ok(());
        }
    }
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        self.inner.closing.store(true, Ordering::Relaxed);
        let link = {
            let mut c = self.inner.lock();
            c.stash.clear();
            c.link.take()
        };
        drop(link);
        let acceptor = self
            .acceptor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(t) = acceptor {
            if t.join().is_err() {
                tracing::error!("the RdmaTransport listener thread panicked");
            }
        }
    }
}

/// Dials the peer's listener and waits for its acknowledgement.
fn dial(
    peer: &PeerUrl,
    peer_text: &str,
    me: &[u8; 16],
    deadline: Instant,
    limit: Duration,
) -> Result<TcpStream> {
    use std::io::{Read, Write};
    let io = |e: std::io::Error| RdmaError::Io {
        op: "connect",
        peer: peer_text.to_string(),
        detail: e.to_string(),
    };
    let timeout = || RdmaError::Timeout {
        op: "connect",
        after: limit,
        peer: peer_text.to_string(),
    };
    let mut s = loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(timeout());
        }
        match TcpStream::connect_timeout(&peer.addr, (deadline - now).min(Duration::from_secs(5))) {
            Ok(s) => break s,
            Err(e) => {
                tracing::debug!("dialing {peer_text}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    s.write_all(&hello(me, &peer.token)).map_err(io)?;
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(timeout());
    }
    s.set_read_timeout(Some(left)).map_err(io)?;
    let mut ack = [0u8; 1];
    match s.read_exact(&mut ack) {
        Ok(()) if ack[0] == ACK => Ok(s),
        Ok(()) => Err(RdmaError::Io {
            op: "connect",
            peer: peer_text.to_string(),
            detail: "the peer answered the hello with something else".into(),
        }),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Err(timeout())
        }
        Err(e) => Err(RdmaError::Io {
            op: "connect",
            peer: peer_text.to_string(),
            detail: format!("the peer refused the hello (a wrong URL?): {e}"),
        }),
    }
}

/// The listener: acknowledges hellos naming `token`, keeps the one from the expected peer,
/// and gives up at the connect deadline.
fn accept_loop(listener: TcpListener, token: [u8; 16], inner: Arc<Inner>) {
    loop {
        if inner.closing.load(Ordering::Relaxed) {
            return;
        }
        {
            let mut c = inner.lock();
            if c.link.is_some() || c.failed.is_some() {
                return;
            }
            if let (Some(d), Some((_, peer))) = (c.deadline, &c.peer) {
                if Instant::now() >= d {
                    c.failed = Some(RdmaError::Timeout {
                        op: "connect",
                        after: d.saturating_duration_since(Instant::now()),
                        peer: format!("{peer} (which never dialed in)"),
                    });
                    inner.changed.notify_all();
                    return;
                }
            }
        }
        let mut s = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => {
                tracing::warn!("RdmaTransport listener: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let (from, to) = match read_hello(&mut s) {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!("RdmaTransport listener: dropped a connection: {e}");
                continue;
            }
        };
        if to != token {
            tracing::warn!("RdmaTransport listener: rejected a hello for another token");
            continue;
        }
        let mut c = inner.lock();
        match &c.peer {
            Some((p, _)) if p.token != from => {
                tracing::warn!("RdmaTransport listener: rejected a hello from an unexpected peer");
            }
            Some(_) => {
                inner.establish(&mut c, s, true);
                return;
            }
            None => {
                if send_ack(&mut s).is_ok() {
                    c.stash.push((from, s));
                }
            }
        }
    }
}
