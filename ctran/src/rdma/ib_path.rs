//! The ib data path of [`RdmaTransport`](super::RdmaTransport) (`TORCHCOMMS_RDMA_PATH=ib`):
//! bytes move as RDMA writes of ibverbx virtual QPs; the TCP link carries the requests, as on
//! the other paths, and the target still checks every request against its registry before it
//! touches memory.
//!
//! Each side registers four staging regions of [`IB_CHUNK`] bytes and two virtual QPs (spray
//! mode, plain writes: no receive is consumed, so nobody has to poll to repost one):
//! - lane *writes*: this side's writes, from its send region into the peer's *write inbox*;
//! - lane *serves*: this side's answers to the peer's reads, into the peer's *read inbox*.
//!
//! A write of a chunk: the requester copies it into its send region, writes it into the
//! peer's write inbox and waits for the completion (the data is placed), then sends the
//! request over TCP; the target copies the inbox into the destination it validated. A read:
//! the target validates, copies the source into its serve region, writes it into the
//! requester's read inbox, waits for the completion and answers; the requester copies its
//! inbox out. ibverbx posts no RDMA reads, hence the second lane. Each inbox holds one chunk,
//! so this side's writes take turns, and so do its reads (the write turn and the read turn);
//! the target's service thread is the only user of its lane *serves* and of its write inbox.
//!
//! **In place (zero copy)**, the default once both sides can: each side registers the
//! memory of an [`RdmaMemory`](super::RdmaMemory) with its NIC on first use (host memory as it
//! is, CUDA memory through a dma-buf: GPUDirect RDMA), kept in the registry with the
//! registration. The requester sends its range's ib key with the request; the target, after
//! validating the request's access key like any other, moves the bytes itself on lane
//! *serves*: an RDMA read of the requester's range into its own (a write request), or an RDMA
//! write of its range into the requester's (a read request), then answers. No staging copy,
//! one request per transfer whatever its size. When either side cannot register (a driver
//! without dma-buf export, a NIC that refuses), the transfer and every later one of the
//! connection are staged as above.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ibverbx::verbs::QpEndpoint;
use ibverbx::{
    Event, LocalKey, Put, RemoteKey as IbKey, VcMode, VirtualCompletion, VirtualCq, VirtualQp,
};

use super::error::{RdmaError, Result};
use super::registry::{forget_nic_path, MemDevice, Pin};
use crate::cuda::Context;
use crate::transport::ib::{
    open_backend, IbBackend, IbMemory, IbProvider, NicRegion, UserDevice, WithBackend,
};

/// Bytes of each staging region: the largest piece of a transfer in one round trip.
pub(crate) const IB_CHUNK: usize = 4 << 20;

const MAGIC: &[u8; 4] = b"TCRI";

/// One side's ib resources before the peer's endpoint is known (made by `bind()`).
pub(crate) struct IbSetup {
    path: Box<dyn Pending>,
    endpoint: Vec<u8>,
}

impl std::fmt::Debug for IbSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbSetup").finish_non_exhaustive()
    }
}

impl IbSetup {
    /// Opens `provider` and creates both lanes' queue pairs and the staging regions.
    pub(crate) fn open(provider: IbProvider) -> Result<IbSetup> {
        let fail = |e: String| RdmaError::Config(format!("ib data path: {e}"));
        let cfg = ibverbx::IbConfig::from_env().map_err(|e| fail(e.to_string()))?;
        let mut vqp = cfg.vqp;
        vqp.mode = VcMode::Spray;
        let build = HalfOf {
            qps: cfg.qps_per_connection.max(1),
            vqp,
            provider,
        };
        let path = open_backend(provider, &cfg, "rdma-transport", 1, build).map_err(fail)?;
        let endpoint = path.endpoint().map_err(fail)?;
        Ok(IbSetup { path, endpoint })
    }

    /// What the peer needs (carried in this side's URL).
    pub(crate) fn endpoint(&self) -> &[u8] {
        &self.endpoint
    }

    /// Connects to the peer's `endpoint` (from its URL); `in_place`: register memory with the
    /// NIC in place, else stage every transfer.
    pub(crate) fn connect(self, endpoint: &[u8], in_place: bool) -> Result<IbPath> {
        self.path
            .connect(endpoint, in_place)
            .map_err(|e| RdmaError::Config(format!("ib data path: the peer's endpoint: {e}")))
    }
}

/// Builds a [`Half`] on whichever backend [`open_backend`] opened.
struct HalfOf {
    qps: usize,
    vqp: ibverbx::VqpConfig,
    provider: IbProvider,
}

impl WithBackend for HalfOf {
    type Out = Box<dyn Pending>;
    fn with<B: IbBackend>(self, backend: B) -> std::result::Result<Box<dyn Pending>, String> {
        Ok(Box::new(Half::new(
            backend,
            self.qps,
            self.vqp,
            self.provider,
        )?))
    }
}

/// Object-safe face of [`Half`], whatever the backend.
trait Pending: Send {
    fn endpoint(&self) -> std::result::Result<Vec<u8>, String>;
    fn connect(self: Box<Self>, peer: &[u8], in_place: bool)
        -> std::result::Result<IbPath, String>;
}

/// Staging memory and unconnected queue pairs of both lanes.
struct Half<B: IbBackend> {
    backend: B,
    provider: IbProvider,
    qps: [Vec<B::Unconnected>; 2],
    cqs: [VirtualCq<B::P>; 2],
    send: [B::Mem; 2],
    inbox: [B::Mem; 2],
    cfg: ibverbx::VqpConfig,
}

impl<B: IbBackend> Half<B> {
    fn new(
        backend: B,
        qps: usize,
        cfg: ibverbx::VqpConfig,
        provider: IbProvider,
    ) -> std::result::Result<Half<B>, String> {
        let e = |x: ibverbx::Error| x.to_string();
        let mut cqs = [
            VirtualCq::new(backend.create_cq().map_err(e)?),
            VirtualCq::new(backend.create_cq().map_err(e)?),
        ];
        let mut lane_qps = [Vec::new(), Vec::new()];
        for (cq, list) in cqs.iter_mut().zip(lane_qps.iter_mut()) {
            for _ in 0..qps {
                list.push(backend.create_qp(cq.physical()).map_err(e)?);
            }
        }
        let reg = || backend.register(IB_CHUNK).map_err(e);
        let (send, inbox) = ([reg()?, reg()?], [reg()?, reg()?]);
        Ok(Half {
            provider,
            qps: lane_qps,
            cqs,
            send,
            inbox,
            cfg,
            backend,
        })
    }
}

impl<B: IbBackend> Pending for Half<B> {
    /// Provider, QPs per lane, both inboxes' keys, then each lane's QP endpoints.
    fn endpoint(&self) -> std::result::Result<Vec<u8>, String> {
        let mut b = MAGIC.to_vec();
        b.push(self.provider as u8);
        b.extend_from_slice(&(self.qps[0].len() as u16).to_le_bytes());
        for m in &self.inbox {
            b.extend_from_slice(&m.remote_key().to_bytes());
        }
        for lane in &self.qps {
            for qp in lane {
                let ep = self.backend.endpoint(qp).map_err(|e| e.to_string())?;
                b.extend_from_slice(&ep.to_bytes());
            }
        }
        Ok(b)
    }

    fn connect(
        self: Box<Self>,
        peer: &[u8],
        in_place: bool,
    ) -> std::result::Result<IbPath, String> {
        let me = *self;
        let n = me.qps[0].len();
        let head = 4 + 1 + 2 + 2 * IbKey::BYTES;
        if peer.len() < head || &peer[..4] != MAGIC {
            return Err("not an ib data path endpoint".into());
        }
        if peer[4] != me.provider as u8 {
            return Err("the peer opened another ib provider".into());
        }
        if usize::from(u16::from_le_bytes([peer[5], peer[6]])) != n {
            return Err("the peer uses another number of QPs per lane (CTRAN_IB_MAX_QPS)".into());
        }
        let key = |i: usize| {
            let at = 7 + i * IbKey::BYTES;
            IbKey::from_bytes(&peer[at..at + IbKey::BYTES]).map_err(|e| e.to_string())
        };
        // The peer's write inbox receives this side's writes; its read inbox, the answers
        // this side's service thread gives to the peer's reads.
        let inboxes = [key(0)?, key(1)?];
        if inboxes.iter().any(|k| k.len < IB_CHUNK as u64) {
            return Err("the peer's inboxes are smaller than a chunk".into());
        }
        let eps = QpEndpoint::decode_many(&peer[head..]).map_err(|e| e.to_string())?;
        if eps.len() != 2 * n {
            return Err("wrong number of QP endpoints".into());
        }
        let Half {
            backend,
            qps,
            cqs,
            send,
            inbox,
            cfg,
            ..
        } = me;
        let mut lanes: Vec<Lane<B>> = Vec::with_capacity(2);
        let mut eps = eps.chunks(n);
        for (((lane_qps, mut cq), send), peer_inbox) in
            qps.into_iter().zip(cqs).zip(send).zip(inboxes)
        {
            let mut connected = Vec::with_capacity(n);
            for (qp, ep) in lane_qps.into_iter().zip(eps.next().expect("2 lanes")) {
                connected.push(backend.connect(qp, ep).map_err(|e| e.to_string())?);
            }
            let vqp = VirtualQp::new(&mut cq, connected, cfg).map_err(|e| e.to_string())?;
            lanes.push(Lane {
                cq,
                vqp,
                send,
                peer_inbox,
                next_wr: 1,
                events: Vec::new(),
            });
        }
        let serves = lanes.pop().expect("2 lanes");
        let writes = lanes.pop().expect("2 lanes");
        let [write_inbox, read_inbox] = inbox;
        static NEXT_PATH: AtomicU64 = AtomicU64::new(1);
        Ok(IbPath {
            id: NEXT_PATH.fetch_add(1, Ordering::Relaxed),
            registrar: Mutex::new(Box::new(backend)),
            staged_only: AtomicBool::new(!in_place),
            writes: Mutex::new(Box::new(writes)),
            serves: Mutex::new(Box::new(serves)),
            write_inbox: Mutex::new(Box::new(write_inbox)),
            read_inbox: Mutex::new(Box::new(read_inbox)),
            write_turn: Mutex::new(()),
            read_turn: Mutex::new(()),
        })
    }
}

/// A connected virtual QP, its send region and the peer's inbox it writes into.
struct Lane<B: IbBackend> {
    cq: VirtualCq<B::P>,
    vqp: VirtualQp<B::P>,
    send: B::Mem,
    peer_inbox: IbKey,
    next_wr: u64,
    events: Vec<VirtualCompletion>,
}

trait Push: Send {
    /// Writes `data` (at most a chunk) into the peer's inbox and waits until it is placed.
    fn push(&mut self, data: &[u8], deadline: Instant) -> Result<()>;
    /// Moves `remote.len` bytes between `local` at `local_offset` and the peer's `remote`:
    /// an RDMA read into `local` (`get`) or a write from it; waits until done.
    fn direct(
        &mut self,
        local: LocalKey,
        local_offset: u64,
        remote: IbKey,
        get: bool,
        deadline: Instant,
    ) -> Result<()>;
}

impl<B: IbBackend> Push for Lane<B> {
    fn push(&mut self, data: &[u8], deadline: Instant) -> Result<()> {
        self.send.write(0, data);
        let inbox = IbKey {
            len: data.len() as u64,
            ..self.peer_inbox
        };
        self.direct(self.send.local_key(), 0, inbox, false, deadline)
    }

    fn direct(
        &mut self,
        local: LocalKey,
        local_offset: u64,
        remote: IbKey,
        get: bool,
        deadline: Instant,
    ) -> Result<()> {
        let op = if get { "RDMA read" } else { "RDMA write" };
        let lost = |detail: String| RdmaError::Disconnected {
            peer: "the ib peer".into(),
            detail,
        };
        let wr_id = self.next_wr;
        self.next_wr += 1;
        let put = Put {
            wr_id,
            local,
            local_offset,
            remote,
            remote_offset: 0,
            len: remote.len,
            notify: false,
        };
        let posted = if get {
            self.vqp.get(&put)
        } else {
            self.vqp.put(&put)
        };
        posted.map_err(|e| lost(format!("posting an {op}: {e}")))?;
        let start = Instant::now();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RdmaError::Timeout {
                    op,
                    after: start.elapsed(),
                    peer: "the ib peer".into(),
                });
            }
            match self
                .cq
                .wait(&mut self.events, left.min(Duration::from_millis(100)))
            {
                Ok(_) | Err(ibverbx::Error::Timeout { .. }) => {}
                Err(e) => return Err(lost(format!("polling: {e}"))),
            }
            for ev in self.events.drain(..) {
                if let Event::PutDone {
                    wr_id: w, result, ..
                } = ev.event
                {
                    if w == wr_id {
                        return result.map_err(|f| lost(format!("{op} failed: {f}")));
                    }
                }
            }
        }
    }
}

/// Registers the caller's memory in place on the backend a path was built on.
trait Registrar: Send {
    /// # Safety
    /// As [`IbBackend::register_user`].
    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        device: MemDevice,
    ) -> std::result::Result<Arc<dyn NicRegion>, String>;
}

impl<B: IbBackend> Registrar for B {
    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        device: MemDevice,
    ) -> std::result::Result<Arc<dyn NicRegion>, String> {
        let device = match device {
            MemDevice::Cpu => UserDevice::Host,
            MemDevice::Cuda(i) => UserDevice::Cuda(Context::get(i).map_err(|e| e.to_string())?),
        };
        let len = usize::try_from(len.max(1)).map_err(|_| "too large".to_string())?;
        // SAFETY: forwarded to the caller.
        let region = unsafe { self.register_user(addr, len, &device) }?;
        Ok(Arc::new(region))
    }
}

/// Why the target did not move a transfer in place.
pub(crate) enum NotDirect {
    /// This side cannot register the memory in place: stage it (the text says why).
    Unavailable(String),
    /// The transfer failed.
    Failed(RdmaError),
}

trait Inbox: Send {
    fn read(&self, out: &mut [u8]);
}

impl<M: IbMemory> Inbox for M {
    fn read(&self, out: &mut [u8]) {
        IbMemory::read(self, 0, out)
    }
}

/// A connected ib data path (see the module documentation).
pub(crate) struct IbPath {
    /// Names this path's regions in the registry.
    id: u64,
    registrar: Mutex<Box<dyn Registrar>>,
    /// Set once either side could not register memory in place: staged from then on.
    staged_only: AtomicBool,
    writes: Mutex<Box<dyn Push>>,
    serves: Mutex<Box<dyn Push>>,
    write_inbox: Mutex<Box<dyn Inbox>>,
    read_inbox: Mutex<Box<dyn Inbox>>,
    write_turn: Mutex<()>,
    read_turn: Mutex<()>,
}

impl std::fmt::Debug for IbPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbPath").finish_non_exhaustive()
    }
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for IbPath {
    fn drop(&mut self) {
        forget_nic_path(self.id);
    }
}

impl IbPath {
    /// This side's region over `pin`'s registration (registered on first use) and the
    /// registration's start.
    fn region(&self, pin: &Pin) -> std::result::Result<(u64, Arc<dyn NicRegion>), String> {
        pin.nic_region(self.id, |addr, len, device| {
            let registrar = lock(&self.registrar);
            // SAFETY: RdmaMemory::register's contract keeps the range valid memory of
            // `device` while registered, and the registry drops the region with it.
            unsafe { registrar.register(addr, len, device) }
        })
    }

    /// Requester: the key through which the target reaches `pin`'s range in place, or `None`
    /// when transfers of this connection are staged.
    pub(crate) fn direct_key(&self, pin: &Pin) -> Option<IbKey> {
        if pin.len == 0 || self.staged_only.load(Ordering::Relaxed) {
            return None;
        }
        match self.region(pin) {
            Ok((base, region)) => {
                let k = region.remote_key();
                Some(IbKey {
                    addr: k.addr + (pin.addr - base),
                    len: pin.len,
                    rkey: k.rkey,
                })
            }
            Err(why) => {
                self.stage_from_now(&format!("this side cannot register {}: {why}", pin.device));
                None
            }
        }
    }

    /// Stages every later transfer of this connection, saying why once.
    pub(crate) fn stage_from_now(&self, why: &str) {
        if !self.staged_only.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "RdmaTransport over ib: transfers are staged through host memory: {why}"
            );
        }
    }

    /// Target (service thread): moves `pin`'s range in place from the requester's `remote`
    /// (`into_pin`: an RDMA read, for a write request) or into it (an RDMA write, for a read
    /// request).
    pub(crate) fn serve_direct(
        &self,
        pin: &Pin,
        remote: IbKey,
        into_pin: bool,
        deadline: Instant,
    ) -> std::result::Result<(), NotDirect> {
        if remote.len != pin.len {
            return Err(NotDirect::Failed(RdmaError::InvalidArgument {
                arg: "via",
                detail: format!(
                    "the requester's ib range is {} bytes, the transfer {}",
                    remote.len, pin.len
                ),
            }));
        }
        if self.staged_only.load(Ordering::Relaxed) {
            return Err(NotDirect::Unavailable(
                "this side stages its transfers (TORCHCOMMS_RDMA_IB_IN_PLACE=false or memory it \
                 could not register)"
                    .into(),
            ));
        }
        let (base, region) = self.region(pin).map_err(|why| {
            let why = format!("the target cannot register {}: {why}", pin.device);
            self.stage_from_now(&why);
            NotDirect::Unavailable(why)
        })?;
        let local = region.local_key();
        lock(&self.serves)
            .direct(local, pin.addr - base, remote, into_pin, deadline)
            .map_err(NotDirect::Failed)
    }

    /// This side's turn to write a chunk (held until the target answered).
    pub(crate) fn write_turn(&self) -> MutexGuard<'_, ()> {
        lock(&self.write_turn)
    }

    /// This side's turn to read a chunk (held until it copied the answer out).
    pub(crate) fn read_turn(&self) -> MutexGuard<'_, ()> {
        lock(&self.read_turn)
    }

    /// Requester, in its write turn: places `data` in the peer's write inbox.
    pub(crate) fn push_write(&self, data: &[u8], deadline: Instant) -> Result<()> {
        lock(&self.writes).push(data, deadline)
    }

    /// Target (service thread): the chunk the peer's write placed in this side's inbox.
    pub(crate) fn take_write(&self, out: &mut [u8]) {
        lock(&self.write_inbox).read(out)
    }

    /// Target (service thread): places `data` in the peer's read inbox.
    pub(crate) fn push_read(&self, data: &[u8], deadline: Instant) -> Result<()> {
        lock(&self.serves).push(data, deadline)
    }

    /// Requester, in its read turn: the chunk the target's answer placed.
    pub(crate) fn take_read(&self, out: &mut [u8]) {
        lock(&self.read_inbox).read(out)
    }
}
