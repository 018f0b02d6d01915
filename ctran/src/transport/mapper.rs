//! Picks the transport for each peer: shared memory for ranks on this host (when enabled), ib
//! for the rest where both ranks opened it, TCP otherwise. Algorithms see one [`Transport`];
//! request ids tell the transports apart (each numbers its requests from its own base).
//!
//! TCP stays connected to every peer whatever carries the data: it detects a closed peer at
//! once (ib learns of one only when a write to it fails), carries abort notices, and carries
//! one-sided traffic (windows) to peers that neither shared memory nor ib reaches.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::engine::select::ShmReach;
use crate::span::Span;
use crate::transport::ib::{IbRoute, ID_BASE as IB_ID_BASE};
use crate::transport::shm::{ShmTransport, ID_BASE};
use crate::transport::socket::SocketTransport;
use crate::transport::{
    Delivery, OpTag, RegionId, RemoteKey, ReqId, SignalKind, Transport, TransportError,
};

/// How long a rank waiting on shared memory goes between checks of the TCP side (traffic to
/// remote peers, closed local peers).
const SHM_SLICE: Duration = Duration::from_millis(2);

/// How long a turn of the ib transport lasts while TCP or shared memory has work too.
const IB_SLICE: Duration = Duration::from_micros(200);
/// The shortest and longest pause between polls of ib while the communicator is idle.
const IB_IDLE_MIN: Duration = Duration::from_micros(20);
const IB_IDLE_MAX: Duration = Duration::from_millis(1);

/// Every transport of one communicator, and which one reaches each peer.
#[derive(Debug)]
pub struct Mapper {
    socket: SocketTransport,
    shm: Option<ShmTransport>,
    ib: Option<Box<dyn IbRoute>>,
    /// The ib registration of each region (by its id in the socket transport's table).
    ib_regions: HashMap<u32, RegionId>,
    /// The current pause between polls of an idle ib (see `progress_ib_idle`).
    ib_idle: Duration,
}

impl Mapper {
    /// Routes local peers through `shm` when given, and the peers `ib` reaches through it.
    pub fn new(
        socket: SocketTransport,
        shm: Option<ShmTransport>,
        ib: Option<Box<dyn IbRoute>>,
    ) -> Mapper {
        Mapper {
            socket,
            shm,
            ib,
            ib_regions: HashMap::new(),
            ib_idle: Duration::ZERO,
        }
    }

    /// The shared-memory transport, when every rank of the communicator is on this host and
    /// shared-memory collectives may run; with the liveness probe they need.
    pub fn whole_comm_shm(
        &mut self,
    ) -> Option<(
        &mut ShmTransport,
        impl FnMut() -> Result<(), TransportError> + '_,
    )> {
        let shm = self.shm.as_mut().filter(|s| s.is_whole_comm())?;
        let peers: Vec<usize> = shm.local_peers().collect();
        let socket = &mut self.socket;
        Some((shm, move || socket.probe_idle(peers.iter().copied())))
    }

    /// How far shared memory reaches: every rank of the communicator, or not.
    pub fn shm_reach(&self) -> ShmReach {
        match &self.shm {
            Some(s) if s.is_whole_comm() => ShmReach::WholeComm,
            _ => ShmReach::Partial,
        }
    }

    /// The transport names in use (for traces and `--print` output).
    pub fn describe(&self) -> &'static str {
        let size = self.socket.size();
        let rank = self.socket.rank();
        let others = || (0..size).filter(move |&p| p != rank);
        let ib_all = self.ib.is_some() && others().all(|p| self.via_shm(p) || self.via_ib(p));
        match (&self.shm, &self.ib) {
            (Some(s), _) if s.is_whole_comm() => "shm",
            (Some(_), Some(_)) if ib_all => "shm+ib",
            (Some(_), Some(_)) => "shm+ib+socket",
            (Some(_), None) => "shm+socket",
            (None, Some(_)) if ib_all => "ib",
            (None, Some(_)) => "ib+socket",
            (None, None) => "socket",
        }
    }

    fn via_shm(&self, peer: usize) -> bool {
        self.shm.as_ref().is_some_and(|s| s.reaches(peer))
    }

    fn via_ib(&self, peer: usize) -> bool {
        self.ib.as_ref().is_some_and(|t| t.reaches(peer))
    }

    /// The ib transport and the ib key of `dst`, when one-sided traffic to `peer` goes by ib.
    fn ib_route(
        &mut self,
        peer: usize,
        dst: &RemoteKey,
    ) -> Option<(&mut Box<dyn IbRoute>, RemoteKey)> {
        let key = dst.ib_key()?;
        self.ib
            .as_mut()
            .filter(|t| t.reaches(peer))
            .map(|t| (t, key))
    }

    /// The ib transport's turn while it has work: it has no descriptor to sleep on, so it is
    /// polled, and TCP and shared memory get short non-blocking turns in between. A peer that
    /// TCP finds closed fails its ib requests too.
    fn progress_with_ib(&mut self, until: Instant) -> Result<(), TransportError> {
        let ib = self.ib.as_mut().expect("called with ib");
        ib.progress(until.min(Instant::now() + IB_SLICE), false)?;
        let size = self.socket.size();
        let probed = self.socket.probe_idle((0..size).filter(|&p| ib.reaches(p)));
        if let Err(e @ TransportError::PeerLost { peer, .. }) = probed {
            ib.peer_lost(peer, e);
        }
        self.progress_host(Instant::now(), false)
    }

    /// An idle communicator whose ib has regions: one ib pass, then TCP and shared memory
    /// (and a new command) for a pause that doubles from [`IB_IDLE_MIN`] to [`IB_IDLE_MAX`]
    /// while nothing arrives over ib.
    fn progress_ib_idle(&mut self, until: Instant) -> Result<(), TransportError> {
        let ib = self.ib.as_mut().expect("called with ib");
        if ib.poll_once() {
            self.ib_idle = Duration::ZERO;
            return Ok(());
        }
        self.ib_idle = (self.ib_idle * 2).clamp(IB_IDLE_MIN, IB_IDLE_MAX);
        self.progress_host(until.min(Instant::now() + self.ib_idle), true)
    }

    /// Progress of TCP and shared memory.
    fn progress_host(&mut self, until: Instant, watch_wake: bool) -> Result<(), TransportError> {
        let Some(shm) = self.shm.as_mut() else {
            return self.socket.progress(until, watch_wake);
        };
        if !shm.has_pending() {
            return self.socket.progress(until, watch_wake);
        }
        let local: Vec<usize> = shm.local_peers().collect();
        let socket = &mut self.socket;
        if socket.has_pending() {
            // Both sides busy: alternate short, non-sleeping turns.
            socket.progress(Instant::now(), false)?;
            let mut alive = || socket.probe_idle(local.iter().copied());
            return shm.progress(
                until.min(Instant::now() + Duration::from_micros(200)),
                &mut alive,
            );
        }
        let slice = if watch_wake {
            Duration::from_millis(1)
        } else {
            SHM_SLICE
        };
        let mut alive = || socket.probe_idle(local.iter().copied());
        shm.progress(until.min(Instant::now() + slice), &mut alive)
    }
}

impl Transport for Mapper {
    fn post_send(
        &mut self,
        peer: usize,
        data: Span,
        tag: OpTag,
        delivery: Delivery,
    ) -> Result<ReqId, TransportError> {
        match (&mut self.shm, &mut self.ib) {
            (Some(shm), _) if shm.reaches(peer) => shm.post_send(peer, data, tag, delivery),
            (_, Some(ib)) if ib.reaches(peer) => ib.post_send(peer, data, tag, delivery),
            _ => self.socket.post_send(peer, data, tag, delivery),
        }
    }

    fn begin_collective(&mut self, tag: OpTag) {
        self.socket.begin_collective(tag);
        if let Some(ib) = &mut self.ib {
            ib.begin_collective(tag);
        }
        if let Some(shm) = &mut self.shm {
            shm.node.publish_op(tag);
        }
    }

    fn owes_output(&self) -> bool {
        self.socket.owes_output() || self.ib.as_ref().is_some_and(|t| t.owes_output())
    }

    fn unconfirmed(&mut self) -> Result<bool, TransportError> {
        let shm = match &mut self.shm {
            Some(shm) => shm.unconfirmed()?,
            None => false,
        };
        let ib = match &mut self.ib {
            Some(ib) => ib.unconfirmed()?,
            None => false,
        };
        Ok(self.socket.unconfirmed()? || shm || ib)
    }

    fn post_recv(&mut self, peer: usize, data: Span, tag: OpTag) -> Result<ReqId, TransportError> {
        match (&mut self.shm, &mut self.ib) {
            (Some(shm), _) if shm.reaches(peer) => shm.post_recv(peer, data, tag),
            (_, Some(ib)) if ib.reaches(peer) => ib.post_recv(peer, data, tag),
            _ => self.socket.post_recv(peer, data, tag),
        }
    }

    fn test(&mut self, req: ReqId) -> Result<bool, TransportError> {
        match (&mut self.shm, &mut self.ib) {
            (Some(shm), _) if req.0 >= ID_BASE => shm.test(req),
            (_, Some(ib)) if req.0 >= IB_ID_BASE => ib.test(req),
            _ => self.socket.test(req),
        }
    }

    fn peer_of(&self, req: ReqId) -> Option<usize> {
        match (&self.shm, &self.ib) {
            (Some(shm), _) if req.0 >= ID_BASE => shm.peer_of(req),
            (_, Some(ib)) if req.0 >= IB_ID_BASE => ib.peer_of(req),
            _ => self.socket.peer_of(req),
        }
    }

    fn progress(&mut self, until: Instant, watch_wake: bool) -> Result<(), TransportError> {
        // A region takes peers' puts and signals at any time, so ib is polled while it has
        // one: at full rate while an operation waits (`watch_wake` false), with a growing
        // pause while the communicator is idle, so that a registered window does not keep a
        // core busy.
        let ib = self
            .ib
            .as_ref()
            .map(|t| (t.has_pending() || t.owes_output(), t.has_regions()));
        match ib {
            Some((busy, regions)) if busy || (regions && !watch_wake) => {
                self.ib_idle = Duration::ZERO;
                self.progress_with_ib(until)
            }
            Some((_, true)) => self.progress_ib_idle(until),
            _ => self.progress_host(until, watch_wake),
        }
    }

    fn abort(&mut self, reason: &str) {
        self.socket.abort(reason);
        if let Some(shm) = &mut self.shm {
            shm.abort();
        }
        if let Some(ib) = &mut self.ib {
            ib.abort(reason);
        }
    }

    // One-sided operations: the socket transport keeps the region table and carries signals
    // to every peer it reaches (local peers too: a signal then follows the cross-memory puts
    // it covers, which completed before it was posted). Puts to local peers go by cross-memory
    // attach when it works between the local ranks, else over TCP like the rest. Host regions
    // are registered with ib too, when it is in use: puts and signals to peers that ib reaches
    // go through it (a signal after the puts before it), and a region's counters are the sum
    // of both transports'.

    fn register_region(
        &mut self,
        span: Span,
        comm: u64,
        sink: Option<std::sync::Arc<dyn crate::transport::RegionSink>>,
    ) -> Result<(RegionId, RemoteKey), TransportError> {
        let staged = sink.is_some();
        let (id, mut key) = Transport::register_region(&mut self.socket, span, comm, sink)?;
        if let Some(ib) = self.ib.as_mut().filter(|_| !staged) {
            match ib.register_region(span, comm, None) {
                Ok((ib_id, k)) => {
                    key.ib = Some(RemoteKey::ib_region_of(&k));
                    self.ib_regions.insert(id.0, ib_id);
                }
                Err(e) => {
                    tracing::warn!("ib: a region of {} B stays on TCP: {e}", span.len());
                }
            }
        }
        Ok((id, key))
    }

    // Buffers registered for transfers in place: only ib moves data by the NIC, so only ib
    // takes them; TCP and shared memory copy as always.

    fn register_buffer(
        &mut self,
        span: Span,
        device: &crate::transport::ib::UserDevice,
    ) -> Result<bool, TransportError> {
        match self.ib.as_mut() {
            Some(ib) => ib.register_buffer(span, device),
            None => Ok(false),
        }
    }

    fn deregister_buffer(&mut self, span: Span) {
        if let Some(ib) = self.ib.as_mut() {
            ib.deregister_buffer(span);
        }
    }

    fn moves_in_place(&self, peer: usize) -> bool {
        !self.via_shm(peer) && self.via_ib(peer)
    }

    fn moved_in_place(&self) -> u64 {
        self.ib.as_ref().map_or(0, |ib| ib.moved_in_place())
    }

    fn deregister_region(&mut self, id: RegionId) -> bool {
        if let (Some(ib_id), Some(ib)) = (self.ib_regions.remove(&id.0), self.ib.as_mut()) {
            ib.deregister_region(ib_id);
        }
        Transport::deregister_region(&mut self.socket, id)
    }

    fn post_put(
        &mut self,
        peer: usize,
        src: Span,
        dst: &RemoteKey,
        offset: u64,
    ) -> Result<Option<ReqId>, TransportError> {
        if let Some((ib, key)) = self.ib_route(peer, dst) {
            return ib.post_put(peer, src, &key, offset);
        }
        match &mut self.shm {
            // A staged region is written only by its owner, as each put frame lands.
            Some(shm) if shm.reaches(peer) && shm.uses_cma() && !dst.staged => {
                shm.put_cma(peer, src, dst, offset).map(|()| None)
            }
            _ => Transport::post_put(&mut self.socket, peer, src, dst, offset),
        }
    }

    fn post_signal(
        &mut self,
        peer: usize,
        dst: &RemoteKey,
        kind: SignalKind,
        add: u64,
    ) -> Result<ReqId, TransportError> {
        if let Some((ib, key)) = self.ib_route(peer, dst) {
            return ib.post_signal(peer, &key, kind, add);
        }
        Transport::post_signal(&mut self.socket, peer, dst, kind, add)
    }

    fn post_get(
        &mut self,
        peer: usize,
        dst: Span,
        src: &RemoteKey,
        offset: u64,
    ) -> Result<Option<ReqId>, TransportError> {
        if src.staged {
            return Err(TransportError::Unsupported(
                "reading a staged (device memory) region".into(),
            ));
        }
        // ib posts no RDMA reads: gets go by cross-memory attach or TCP.
        match &mut self.shm {
            Some(shm) if shm.reaches(peer) && shm.uses_cma() => {
                shm.get_cma(peer, dst, src, offset).map(|()| None)
            }
            _ => Transport::post_get(&mut self.socket, peer, dst, src, offset),
        }
    }

    fn region_counters(&self, id: RegionId, peer: usize) -> Option<(u64, u64)> {
        let (s, f) = Transport::region_counters(&self.socket, id, peer)?;
        let ib = self
            .ib_regions
            .get(&id.0)
            .zip(self.ib.as_ref())
            .and_then(|(&ib_id, ib)| ib.region_counters(ib_id, peer));
        let (is, ifence) = ib.unwrap_or((0, 0));
        Some((s + is, f + ifence))
    }

    fn has_regions(&self) -> bool {
        Transport::has_regions(&self.socket)
    }

    fn peer_alive(&mut self, peer: usize) -> Result<(), TransportError> {
        if let Some(ib) = self.ib.as_mut().filter(|t| t.reaches(peer)) {
            ib.peer_alive(peer)?;
        }
        Transport::peer_alive(&mut self.socket, peer)
    }
}

impl Mapper {
    /// Ends the communicator normally: peers learn this rank finished, not failed.
    pub fn close(&mut self) {
        self.socket.close();
        // Peers learn that this rank finished (not failed) before its queue pairs go.
        if let Some(mut ib) = self.ib.take() {
            ib.close();
        }
        if let Some(shm) = &mut self.shm {
            shm.abort();
        }
    }

    /// Whether `peer` is reached through shared memory.
    pub fn is_local(&self, peer: usize) -> bool {
        self.via_shm(peer)
    }
}
