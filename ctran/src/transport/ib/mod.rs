//! The ib transport: [`Transport`] over RDMA writes of ibverbx's virtual queue pairs, generic
//! over the RDMA stack ([`IbBackend`]; [`SoftBackend`] is ibverbx's in-process software fabric,
//! the only one this has run on).
//!
//! Per peer there is one [`ibverbx::VirtualQp`] (its physical QPs, mode and chunking from the
//! ibverbx settings; set up in `setup.rs`) and two control rings of 64 slots of 64 bytes, one
//! per direction, registered by their reader. A control message is an RDMA write with a
//! notification into the peer's ring; notifications come in posting order, so the peer reads
//! its ring in order ([`wire`]). Every message carries how many of the peer's messages were
//! consumed (credits); a writer never overruns the ring.
//!
//! **Two-sided (rendezvous).** A receive registers a staging buffer of its size and sends a
//! clear-to-send (`Cts`: receive id, [`OpTag`], length, address, rkey). The sender matches
//! clear-to-sends with its sends first in, first out and checks agreement: another tag fails
//! both sides with [`TransportError::Disagree`], another length the sender with
//! [`TransportError::PostedMismatch`] and the receiver, told in a `Nack`, with
//! [`TransportError::SizeMismatch`]. A rank that
//! gets a clear-to-send of another collective with the number of its own fails at once and
//! sends a `Nack` too, so ranks that disagree without a byte to send each other (different
//! roots) fail both. On agreement the sender copies the data into a staging buffer of its own
//! and RDMA-writes it into the receiver's. Once that write completed (so the data is placed), a
//! `Data` message tells the receiver, which copies the data out and finishes the receive.
//! Staging buffers are reused (`pool.rs`). Buffers registered with
//! [`Transport::register_buffer`] skip the copies: the write goes from the send's buffer, or
//! into the receive's (`in_place.rs`). [`Delivery::Eager`] sends finish when their write
//! completed; [`Delivery::Confirmed`] ones too, with the receiver's `Ack` awaited through
//! [`Transport::unconfirmed`]; [`Delivery::Accepted`] ones finish on the `Ack`.
//!
//! **One-sided** (`onesided.rs`). [`Transport::register_region`] registers a shadow registration of the
//! region's size; its key carries the registration's address and rkey. A put copies the source
//! into staging and RDMA-writes it into the target's registration (bounds checked against the
//! key here; the fabric checks the registration again). Once the write completed a `Put`
//! message tells the target, which checks it against its region table and copies the bytes
//! into the region. A signal is a `Signal` message sent only after every earlier put to that
//! peer completed, so a target that sees the signal has the data. Reads (get) are not offered:
//! ibverbx posts no RDMA reads.
//!
//! **Failures.** A failed write (retry exceeded, flush, remote access) breaks the peer: every
//! request to it fails with [`TransportError::PeerLost`], as [`Transport::peer_alive`] says. A
//! peer with work waiting that stays silent gets keep-alive writes, which fail once it is gone.
//! [`Transport::abort`] tells every peer (an `Abort` message) and fails everything pending.

pub mod backend;
mod in_place;
mod onesided;
mod peer;
mod pool;
mod route;
pub mod select;
mod setup;
pub mod user_memory;
pub mod verbs;
pub(crate) mod wire;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ibverbx::{Event, Put, RemoteKey as IbKey, VirtualCompletion, VirtualCq};

pub use backend::{IbBackend, IbMemory, SoftBackend};
use in_place::InPlace;
use peer::{Cts, InFlight, OneSided, Peer, RecvReq, SendReq, Through};
use pool::Pool;
pub(crate) use route::connect as connect_peers;
pub(crate) use route::{open_backend, WithBackend};
pub use route::{soft_fabric, IbProvider, IbRoute};
use setup::Half;
pub use setup::{IbError, IbSettings};
pub use user_memory::{gpu_dmabuf_supported, NicRegion, UserDevice};
pub use verbs::VerbsBackend;
use wire::Ctl;

use crate::span::Span;
use crate::transport::region::RegionTable;
use crate::transport::requests::Requests;
use crate::transport::{
    Delivery, OpTag, RegionId, RemoteKey, ReqId, SignalKind, Transport, TransportError,
};

/// The first request id (a mapper tells its transports' requests apart by their ranges).
pub(crate) const ID_BASE: u64 = 1 << 61;
/// How long a peer that work waits on may stay silent before it gets a keep-alive write.
const KEEPALIVE: Duration = Duration::from_millis(50);
/// How long [`IbTransport::close`] waits for its goodbyes to be written.
const CLOSE_LINGER: Duration = Duration::from_millis(200);
/// Free staging buffers kept for reuse, in bytes.
const POOL_BYTES: usize = 64 << 20;

/// [`Transport`] over RDMA (see the module documentation for the protocol).
pub struct IbTransport<B: IbBackend> {
    backend: B,
    rank: usize,
    settings: IbSettings,
    vcq: VirtualCq<B::P>,
    halves: HashMap<usize, Half<B>>,
    peers: Vec<Option<Peer<B>>>,
    conn_peer: HashMap<u32, usize>,
    next_wr: u64,
    requests: Requests,
    aborted: bool,
    /// The collective this rank runs (compared with the peers' clear-to-sends).
    current: OpTag,
    regions: RegionTable,
    region_mems: HashMap<u32, B::Mem>,
    pool: Pool<B::Mem>,
    /// Buffers registered for transfers in place ([`Transport::register_buffer`]).
    in_place: InPlace<B::UserMem>,
    events: Vec<VirtualCompletion>,
}

impl<B: IbBackend> std::fmt::Debug for IbTransport<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbTransport")
            .field("rank", &self.rank)
            .field("backend", &self.backend)
            .field("pending", &self.requests.pending_count())
            .field("aborted", &self.aborted)
            .finish_non_exhaustive()
    }
}

impl<B: IbBackend> IbTransport<B> {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The physical QP numbers of the connection to `peer` (tests inject faults into them).
    pub fn qp_nums(&self, peer: usize) -> Vec<u32> {
        self.peers
            .get(peer)
            .and_then(Option::as_ref)
            .map(|p| p.vqp.qp_nums())
            .unwrap_or_default()
    }

    fn peer_mut(&mut self, peer: usize) -> Result<&mut Peer<B>, TransportError> {
        if self.aborted {
            return Err(TransportError::Aborted);
        }
        let p = self
            .peers
            .get_mut(peer)
            .and_then(Option::as_mut)
            .ok_or_else(|| TransportError::PeerLost {
                peer,
                reason: "no ib connection to this peer".into(),
            })?;
        match &p.broken {
            Some(e) => Err(e.clone()),
            None => Ok(p),
        }
    }

    fn new_id(&mut self, peer: usize) -> u64 {
        self.requests.open(peer)
    }

    fn finish(&mut self, id: u64) {
        self.requests.finish(id);
    }

    fn fail(&mut self, id: u64, e: TransportError) {
        self.requests.fail(id, e);
    }

    /// Breaks the way to `peer`: every request to it fails with `e`. A disagreement fails every
    /// pending request of every peer too (the operation cannot go on, and the request this rank
    /// waits for may be another peer's), as the socket transport does.
    fn fail_peer(&mut self, peer: usize, e: TransportError) {
        let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
            return;
        };
        if p.broken.is_none() {
            tracing::warn!(rank = self.rank, peer, "ib transport: {e}");
            p.broken = Some(e.clone());
        }
        p.clear_requests();
        let everyone = matches!(
            e,
            TransportError::Disagree { .. }
                | TransportError::SizeMismatch { .. }
                | TransportError::PostedMismatch { .. }
        );
        self.requests.fail_where(|q| everyone || q == peer, &e);
    }

    /// Pairs the peer's clear-to-sends with this rank's sends, first in, first out.
    fn match_sends(&mut self, peer: usize) {
        loop {
            let Ok(p) = self.peer_mut(peer) else { return };
            if p.sends.is_empty() || p.ctss.is_empty() {
                return;
            }
            let s = p.sends.pop_front().expect("non-empty");
            let c = p.ctss.pop_front().expect("non-empty");
            if !self.requests.is_pending(s.id) {
                // Failed by a disagreement with another peer: its memory may be gone, never
                // read it. The communicator aborts next, which tells this peer.
                continue;
            }
            let len = s.data.len() as u64;
            if s.tag != c.tag || len != c.len {
                let e = if s.tag != c.tag {
                    TransportError::Disagree {
                        peer,
                        expected: s.tag,
                        got: c.tag,
                    }
                } else {
                    TransportError::PostedMismatch {
                        peer,
                        sending: s.data.len(),
                        posted: usize::try_from(c.len).unwrap_or(usize::MAX),
                    }
                };
                self.fail(s.id, e.clone());
                self.fail_peer(peer, e);
                let nack = Ctl::Nack {
                    rid: c.rid,
                    tag: s.tag,
                    len,
                };
                if let Some(p) = self.peers[peer].as_mut() {
                    p.queue(nack, None);
                }
                return;
            }
            if let Err(e) = self.write_send(peer, s, c) {
                self.fail_peer(peer, e);
                return;
            }
        }
    }

    /// Writes the data of send `s` into the receive `c` names.
    fn write_send(&mut self, peer: usize, s: SendReq, c: Cts) -> Result<(), TransportError> {
        if s.data.is_empty() {
            self.send_written(peer, s.id, c.rid, s.delivery);
            return Ok(());
        }
        let source = match self.in_place.slice(s.data) {
            Some(slice) => Through::InPlace(slice),
            None => Through::Staging(self.stage(peer, s.data)?),
        };
        let (local, local_offset) = match &source {
            Through::Staging(m) => (m.local_key(), 0),
            Through::InPlace(slice) => (slice.local_key(), slice.offset()),
        };
        let wr = self.next_wr;
        self.next_wr += 1;
        let put = Put {
            wr_id: wr,
            local,
            local_offset,
            remote: c.key,
            remote_offset: 0,
            len: c.len,
            notify: false,
        };
        let p = self.peer_mut(peer)?;
        p.vqp.put(&put).map_err(|e| lost(peer, e))?;
        p.writes.insert(
            wr,
            InFlight::SendData {
                req: s.id,
                rid: c.rid,
                delivery: s.delivery,
                source,
            },
        );
        Ok(())
    }

    /// A registered copy of `data`.
    fn stage(&mut self, peer: usize, data: Span) -> Result<B::Mem, TransportError> {
        let backend = &self.backend;
        let m = self.pool.take(data.len(), |n| backend.register(n));
        let mut m = m.map_err(|e| lost(peer, e))?;
        m.write_from(0, data);
        Ok(m)
    }

    /// The data of send `id` is in place at receive `rid`: tell the receiver, and finish the
    /// send as its delivery says.
    fn send_written(&mut self, peer: usize, id: u64, rid: u64, delivery: Delivery) {
        let Ok(p) = self.peer_mut(peer) else { return };
        p.queue(
            Ctl::Data {
                rid,
                ack: delivery != Delivery::Eager,
            },
            None,
        );
        if delivery != Delivery::Eager {
            p.acks.insert(rid, (id, delivery));
        }
        if delivery != Delivery::Accepted {
            self.finish(id);
        }
    }

    /// Acts on one event of the completion queue. Returns whether a request may have moved.
    fn on_event(&mut self, ev: VirtualCompletion) {
        let Some(&peer) = self.conn_peer.get(&ev.conn) else {
            return;
        };
        match ev.event {
            Event::PutDone { wr_id, result, .. } => {
                let w = self.peers[peer]
                    .as_mut()
                    .and_then(|p| p.writes.remove(&wr_id));
                if let Err(f) = result {
                    let reason = format!("RDMA write failed: {f}");
                    self.fail_peer(peer, TransportError::PeerLost { peer, reason });
                    return;
                }
                match w {
                    Some(InFlight::Control { req: Some(req) }) => self.finish(req),
                    Some(InFlight::SendData {
                        req,
                        rid,
                        delivery,
                        source,
                    }) => {
                        if let Through::Staging(m) = source {
                            self.pool.give(m);
                        }
                        self.send_written(peer, req, rid, delivery);
                    }
                    Some(InFlight::OneSided { req, staging }) => {
                        self.pool.give(staging);
                        self.finish(req);
                        if let Ok(p) = self.peer_mut(peer) {
                            for o in &mut p.onesided {
                                if let OneSided::Put { wr, done, .. } = o {
                                    if *wr == wr_id {
                                        *done = true;
                                    }
                                }
                            }
                        }
                        self.drain_onesided(peer);
                    }
                    _ => {}
                }
            }
            Event::Notify { seq } => {
                let Some(p) = self.peers[peer].as_mut() else {
                    return;
                };
                match p.take(seq) {
                    Ok(ctl) => self.on_ctl(peer, ctl),
                    Err(reason) => self.fail_peer(peer, TransportError::PeerLost { peer, reason }),
                }
            }
            Event::RecvFailed(f) => {
                let reason = format!("receiving failed: {f}");
                self.fail_peer(peer, TransportError::PeerLost { peer, reason });
            }
        }
    }

    /// Acts on a control message of `peer`.
    fn on_ctl(&mut self, peer: usize, ctl: Ctl) {
        let protocol = |what: String| TransportError::PeerLost {
            peer,
            reason: format!("protocol error: {what}"),
        };
        match ctl {
            Ctl::Credit => {}
            Ctl::Cts {
                rid,
                tag,
                len,
                addr,
                rkey,
            } => {
                // A peer waiting in another collective of the same number disagrees, even if
                // this rank never sends to it (different roots, a barrier against a reduce).
                let cur = self.current;
                if tag.seq != 0 && tag.seq == cur.seq && tag.word != cur.word {
                    let e = TransportError::Disagree {
                        peer,
                        expected: cur,
                        got: tag,
                    };
                    self.fail_peer(peer, e);
                    if let Some(p) = self.peers[peer].as_mut() {
                        p.queue(Ctl::Nack { rid, tag: cur, len }, None);
                    }
                    return;
                }
                if let Ok(p) = self.peer_mut(peer) {
                    let key = IbKey { addr, len, rkey };
                    p.ctss.push_back(Cts { rid, tag, len, key });
                    self.match_sends(peer);
                }
            }
            Ctl::Data { rid, ack } => {
                // A receive failed meanwhile (a disagreement with another peer) may have lost
                // its memory: its data is dropped, not copied.
                let live = self.requests.is_pending(rid);
                let Ok(p) = self.peer_mut(peer) else { return };
                let Some(r) = p.recvs.remove(&rid) else {
                    self.fail_peer(peer, protocol(format!("data for unknown receive {rid}")));
                    return;
                };
                if ack && live {
                    p.queue(Ctl::Ack { rid }, None);
                }
                if let Some(Through::Staging(m)) = r.landing {
                    if live {
                        m.read_into(0, r.data);
                    }
                    self.pool.give(m);
                }
                self.finish(rid);
            }
            Ctl::Nack { rid, tag, len } => {
                let Ok(p) = self.peer_mut(peer) else { return };
                let Some(r) = p.recvs.remove(&rid) else {
                    return;
                };
                let e = if tag != r.tag {
                    TransportError::Disagree {
                        peer,
                        expected: r.tag,
                        got: tag,
                    }
                } else {
                    TransportError::SizeMismatch {
                        peer,
                        expected: r.data.len(),
                        got: usize::try_from(len).unwrap_or(usize::MAX),
                    }
                };
                self.fail(rid, e.clone());
                self.fail_peer(peer, e);
            }
            Ctl::Ack { rid } => {
                let Ok(p) = self.peer_mut(peer) else { return };
                if let Some((id, Delivery::Accepted)) = p.acks.remove(&rid) {
                    self.finish(id);
                }
            }
            Ctl::Put {
                region,
                offset,
                len,
            } => self.on_put(peer, region, offset, len),
            Ctl::Signal { region, fence, add } => self.on_signal(peer, region, fence, add),
            Ctl::Abort { reason } => {
                let reason = format!("the peer gave up: {reason}");
                self.fail_peer(peer, TransportError::PeerLost { peer, reason });
            }
            Ctl::Bye => {
                // Whatever it sent before is handled; nothing more will come.
                let reason = "the peer finished: it closed its connection".to_string();
                self.fail_peer(peer, TransportError::PeerLost { peer, reason });
            }
        }
    }

    /// Ends the transport normally: tells every peer (`Bye`) and waits, up to
    /// [`CLOSE_LINGER`], until those writes completed, so that the queue pairs they go through
    /// outlive them and peers can tell a finished rank from a failed one.
    pub fn close(&mut self) {
        if self.aborted {
            return;
        }
        for p in self.peers.iter_mut().flatten() {
            if p.broken.is_none() {
                p.queue(Ctl::Bye, None);
            }
        }
        let deadline = Instant::now() + CLOSE_LINGER;
        while Instant::now() < deadline {
            self.pass();
            let busy = self
                .peers
                .iter()
                .flatten()
                .any(|p| p.broken.is_none() && p.owes_output());
            if !busy {
                break;
            }
            std::thread::yield_now();
        }
        self.aborted = true;
    }

    /// One non-blocking pass: completions, keep-alives, control messages. Whether anything
    /// moved.
    fn pass(&mut self) -> bool {
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        let mut moved = false;
        loop {
            match self.vcq.poll(&mut events) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    let reason = format!("polling the completion queue failed: {e}");
                    for peer in 0..self.peers.len() {
                        let reason = reason.clone();
                        self.fail_peer(peer, TransportError::PeerLost { peer, reason });
                    }
                    break;
                }
            }
            moved = true;
            for ev in events.drain(..) {
                self.on_event(ev);
            }
        }
        self.events = events;
        let now = Instant::now();
        let mut failures = Vec::new();
        for (peer, p) in self.peers.iter_mut().enumerate() {
            let Some(p) = p else { continue };
            if p.vqp.broken().is_some() {
                continue;
            }
            if p.broken.is_none() && p.busy() {
                p.ping_if_silent(now, KEEPALIVE);
            }
            match p.flush(&mut self.next_wr) {
                Ok(w) => moved |= w,
                Err(e) => failures.push((peer, lost(peer, e))),
            }
        }
        for (peer, e) in failures {
            self.fail_peer(peer, e);
        }
        moved
    }

    fn note_current(&mut self, tag: OpTag) {
        if tag.seq != 0 {
            self.current = tag;
        }
    }

    /// Whether any request is posted and unfinished.
    pub fn has_pending(&self) -> bool {
        self.requests.any_pending()
    }

    /// Whether a finished send still waits for its receiver's `Ack` (confirmed delivery).
    pub fn awaits_acks(&self) -> bool {
        self.peers
            .iter()
            .flatten()
            .any(|p| p.broken.is_none() && !p.acks.is_empty())
    }
}

/// A verbs error as the way to `peer` breaking.
fn lost(peer: usize, e: ibverbx::Error) -> TransportError {
    TransportError::PeerLost {
        peer,
        reason: e.to_string(),
    }
}

impl<B: IbBackend> Transport for IbTransport<B> {
    fn post_send(
        &mut self,
        peer: usize,
        data: Span,
        tag: OpTag,
        delivery: Delivery,
    ) -> Result<ReqId, TransportError> {
        self.peer_mut(peer)?;
        self.note_current(tag);
        let id = self.new_id(peer);
        self.peer_mut(peer)?.sends.push_back(SendReq {
            id,
            data,
            tag,
            delivery,
        });
        self.match_sends(peer);
        Ok(ReqId(id))
    }

    fn owes_output(&self) -> bool {
        // Control messages wait for ring credits, and writes in the virtual QPs for slots that
        // completions free: both need the owner to keep progressing.
        !self.aborted
            && self
                .peers
                .iter()
                .flatten()
                .any(|p| p.broken.is_none() && p.owes_output())
    }

    fn unconfirmed(&mut self) -> Result<bool, TransportError> {
        let mut waiting = false;
        for p in self.peers.iter().flatten() {
            if p.acks.values().any(|&(_, d)| d == Delivery::Confirmed) {
                if let Some(e) = &p.broken {
                    return Err(e.clone());
                }
                waiting = true;
            }
        }
        Ok(waiting)
    }

    fn begin_collective(&mut self, tag: OpTag) {
        self.note_current(tag);
    }

    fn post_recv(&mut self, peer: usize, data: Span, tag: OpTag) -> Result<ReqId, TransportError> {
        self.peer_mut(peer)?;
        self.note_current(tag);
        let landing = if data.is_empty() {
            None
        } else if let Some(slice) = self.in_place.slice(data) {
            Some(Through::InPlace(slice))
        } else {
            let backend = &self.backend;
            let m = self.pool.take(data.len(), |n| backend.register(n));
            Some(Through::Staging(m.map_err(|e| lost(peer, e))?))
        };
        let key = match &landing {
            None => IbKey {
                addr: 0,
                len: 0,
                rkey: 0,
            },
            Some(Through::Staging(m)) => m.remote_key(),
            Some(Through::InPlace(slice)) => slice.remote_key(data.len() as u64),
        };
        let id = self.new_id(peer);
        let p = self.peer_mut(peer)?;
        p.recvs.insert(id, RecvReq { data, tag, landing });
        p.queue(
            Ctl::Cts {
                rid: id,
                tag,
                len: data.len() as u64,
                addr: key.addr,
                rkey: key.rkey,
            },
            None,
        );
        Ok(ReqId(id))
    }

    fn test(&mut self, req: ReqId) -> Result<bool, TransportError> {
        self.requests.test(req, self.aborted)
    }

    fn peer_of(&self, req: ReqId) -> Option<usize> {
        self.requests.peer_of(req.0)
    }

    fn progress(&mut self, until: Instant, watch_wake: bool) -> Result<(), TransportError> {
        if self.aborted {
            return Err(TransportError::Aborted);
        }
        // No wake-up descriptor: a caller watching for one gets control back within a
        // millisecond to look at its queue.
        let slice = if watch_wake {
            until.min(Instant::now() + Duration::from_millis(1))
        } else {
            until
        };
        let mut spins = 0u32;
        loop {
            if self.pass() {
                return Ok(());
            }
            if Instant::now() >= slice {
                return Ok(());
            }
            spins += 1;
            if spins % 16 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    fn abort(&mut self, reason: &str) {
        if self.aborted {
            return;
        }
        for peer in 0..self.peers.len() {
            if let Some(p) = self.peers[peer].as_mut() {
                p.clear_requests();
                p.queue(
                    Ctl::Abort {
                        reason: reason.to_string(),
                    },
                    None,
                );
                // Best effort: the peer learns of it if its ring has room now.
                let _ = p.flush(&mut self.next_wr);
            }
        }
        self.pass();
        self.aborted = true;
        self.requests.fail_where(|_| true, &TransportError::Aborted);
    }

    fn register_buffer(&mut self, span: Span, device: &UserDevice) -> Result<bool, TransportError> {
        if span.is_empty() {
            return Ok(false);
        }
        if self.in_place.overlaps(span) {
            return Err(TransportError::Unsupported(format!(
                "registering {span:?} with ib: it overlaps a buffer registered already"
            )));
        }
        // SAFETY: the caller of register_buffer keeps the memory valid until it deregisters
        // it; transfers in flight then hold the registration, not the memory's owner.
        let region = unsafe {
            self.backend
                .register_user(span.addr() as u64, span.len(), device)
        };
        let region = region.map_err(|why| {
            TransportError::Unsupported(format!("registering {span:?} with ib: {why}"))
        })?;
        self.in_place.insert(span, region);
        Ok(true)
    }

    fn deregister_buffer(&mut self, span: Span) {
        self.in_place.remove(span);
    }

    fn moved_in_place(&self) -> u64 {
        self.in_place.moved
    }

    fn register_region(
        &mut self,
        span: Span,
        comm: u64,
        sink: Option<std::sync::Arc<dyn crate::transport::RegionSink>>,
    ) -> Result<(RegionId, RemoteKey), TransportError> {
        if sink.is_some() {
            return Err(TransportError::Unsupported(
                "staged (device memory) regions over ib: register the device memory itself".into(),
            ));
        }
        self.register(span, comm)
    }

    fn deregister_region(&mut self, id: RegionId) -> bool {
        self.deregister(id)
    }

    fn post_put(
        &mut self,
        peer: usize,
        src: Span,
        dst: &RemoteKey,
        offset: u64,
    ) -> Result<Option<ReqId>, TransportError> {
        self.put(peer, src, dst, offset)
    }

    fn post_signal(
        &mut self,
        peer: usize,
        dst: &RemoteKey,
        kind: SignalKind,
        add: u64,
    ) -> Result<ReqId, TransportError> {
        self.signal(peer, dst, kind, add)
    }

    fn region_counters(&self, id: RegionId, peer: usize) -> Option<(u64, u64)> {
        self.regions.counters(id, peer)
    }

    fn has_regions(&self) -> bool {
        !self.regions.is_empty()
    }

    fn peer_alive(&mut self, peer: usize) -> Result<(), TransportError> {
        let p = self.peer_mut(peer)?;
        // A waiter on a signal has nothing in flight to this peer: check it is still there.
        p.ping_if_silent(Instant::now(), KEEPALIVE);
        Ok(())
    }
}
