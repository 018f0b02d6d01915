//! The TCP transport: a full mesh of connections, set up once at communicator creation and
//! driven by a non-blocking `poll` loop on the communicator's progress thread.
//!
//! Waiting first spins for a short, configurable time (small messages answer within
//! microseconds on one host) and then sleeps in `poll`, so oversubscribed ranks on a small
//! machine do not burn the core their peers need.

mod conn;
mod early;
pub mod frame;
pub(crate) mod handshake;
pub mod mesh;
mod protect;
mod waker;

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::span::Span;
use crate::transport::region::{RegionId, RegionTable, RemoteKey, SignalKind};
use crate::transport::requests::Requests;
use crate::transport::{Delivery, OpTag, ReqId, Transport, TransportError};
use conn::Conn;
pub use mesh::{MeshPlan, SocketConfig};
pub use protect::Protection;

pub use waker::Waker;

/// How long a failing rank keeps finishing a half-sent message so that its abort notice can
/// follow it.
const ABORT_FLUSH: Duration = Duration::from_millis(100);

/// TCP connections to every peer of one communicator.
#[derive(Debug)]
pub struct SocketTransport {
    rank: usize,
    conns: Vec<Option<Conn>>,
    requests: Requests,
    waker: Arc<Waker>,
    spin: Duration,
    aborted: bool,
    finished_scratch: Vec<u64>,
    /// The collective this rank runs (the latest tag posted with a sequence number): probes
    /// from peers are compared with it.
    current: OpTag,
    /// Since when nothing has moved, while requests wait.
    stalled_since: Option<Instant>,
    /// Regions registered for one-sided access, with their signal counters.
    regions: RegionTable,
}

impl SocketTransport {
    fn from_conns(
        rank: usize,
        conns: Vec<Option<Conn>>,
        waker: Arc<Waker>,
        spin: Duration,
    ) -> SocketTransport {
        SocketTransport {
            rank,
            requests: Requests::new(1),
            waker,
            spin,
            aborted: false,
            finished_scratch: Vec::new(),
            current: OpTag::default(),
            stalled_since: None,
            regions: RegionTable::new(conns.len()),
            conns,
        }
    }

    /// Sets how long a waiting rank spins before sleeping in `poll`.
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// Sets the send and receive buffers of the connections to `peers` to `bytes`. Best effort:
    /// a connection that refuses keeps the kernel's sizes (logged).
    pub fn set_buffers(&mut self, peers: impl IntoIterator<Item = usize>, bytes: usize) {
        for p in peers {
            if let Some(conn) = self.conns.get(p).and_then(Option::as_ref) {
                if let Err(e) = conn.set_buffers(bytes) {
                    tracing::debug!(
                        rank = self.rank,
                        peer = p,
                        "socket buffers of {bytes} B: {e}"
                    );
                }
            }
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.conns.len()
    }

    fn conn_mut(&mut self, peer: usize) -> Result<&mut Conn, TransportError> {
        if self.aborted {
            return Err(TransportError::Aborted);
        }
        let conn = self
            .conns
            .get_mut(peer)
            .and_then(Option::as_mut)
            .ok_or_else(|| TransportError::PeerLost {
                peer,
                reason: "no connection to this peer".into(),
            })?;
        if let Some(e) = conn.broken() {
            return Err(e.clone());
        }
        Ok(conn)
    }

    fn new_id(&mut self, peer: usize) -> u64 {
        self.requests.open(peer)
    }

    /// One non-blocking pass over every connection with work. Returns whether anything moved.
    fn pass(&mut self) -> bool {
        let mut moved = false;
        let mut finished = std::mem::take(&mut self.finished_scratch);
        let mut failures = Vec::new();
        for (peer, conn) in self.conns.iter_mut().enumerate() {
            let Some(conn) = conn else { continue };
            if !conn.wants_read() && !conn.wants_write() {
                continue;
            }
            match conn.advance(&mut finished, self.current, &mut self.regions) {
                Ok(a) => moved |= a.moved,
                Err(e) => failures.push((peer, e)),
            }
        }
        for id in finished.drain(..) {
            self.requests.finish(id);
            moved = true;
        }
        self.finished_scratch = finished;
        for (peer, e) in failures {
            self.fail_conn(peer, e);
            moved = true;
        }
        moved
    }

    /// Fails the connection to `peer` and every request it held. A disagreement fails every
    /// request of every connection too: the operation cannot go on, and the request this rank
    /// waits for may be another peer's.
    fn fail_conn(&mut self, peer: usize, e: TransportError) {
        tracing::warn!(rank = self.rank, "socket transport: {e}");
        let Some(conn) = self.conns.get_mut(peer).and_then(Option::as_mut) else {
            return;
        };
        for id in conn.fail(e.clone()) {
            self.requests.fail(id, e.clone());
        }
        if matches!(e, TransportError::Disagree { .. }) {
            self.requests.fail_where(|_| true, &e);
        }
    }

    /// Tells every peer a receive has waited for since [`crate::transport::AGREEMENT_CHECK_AFTER`]
    /// which operation this rank runs (a probe): a peer that runs another one fails.
    fn probe_if_stalled(&mut self) {
        let now = Instant::now();
        let since = *self.stalled_since.get_or_insert(now);
        if now.duration_since(since) < crate::transport::AGREEMENT_CHECK_AFTER {
            return;
        }
        for conn in self.conns.iter_mut().flatten() {
            conn.probe_waiting_recv();
        }
    }

    /// Sleeps in `poll` until a socket with work is ready, the waker fires, or `timeout`.
    /// Connections without a posted receive are watched too, for probes and abort notices.
    /// Returns whether one of those took something or failed (the caller reports it at once:
    /// an acknowledgement may be what it waits for).
    fn sleep(&mut self, timeout: Duration, watch_wake: bool) -> bool {
        let ms = timeout.as_millis().clamp(1, 100) as u16;
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(self.conns.len() + 1);
        let mut idle = Vec::new();
        if watch_wake {
            fds.push(PollFd::new(self.waker.fd(), PollFlags::POLLIN));
        }
        for (peer, conn) in self.conns.iter().enumerate() {
            let Some(conn) = conn else { continue };
            let mut flags = PollFlags::empty();
            if conn.wants_read() || conn.wants_idle_read() {
                flags |= PollFlags::POLLIN;
            }
            if conn.wants_write() {
                flags |= PollFlags::POLLOUT;
            }
            if !flags.is_empty() {
                if conn.wants_idle_read() {
                    idle.push((fds.len(), peer));
                }
                // SAFETY: the fd belongs to a socket owned by `conn`, which outlives `fds`
                // (dropped below, before any connection can change).
                let fd = unsafe { BorrowedFd::borrow_raw(conn.fd()) };
                fds.push(PollFd::new(fd, flags));
            }
        }
        let polled = poll(&mut fds, PollTimeout::from(ms)).is_ok();
        let readable = |i: usize| fds[i].revents().is_some_and(|r| !r.is_empty());
        let woken = polled && watch_wake && readable(0);
        idle.retain(|&(i, _)| polled && readable(i));
        drop(fds);
        if woken {
            self.waker.drain();
        }
        let mut took = false;
        for (_, peer) in idle {
            let current = self.current;
            if let Some(conn) = self.conns.get_mut(peer).and_then(Option::as_mut) {
                match conn.read_idle(current, &mut self.regions) {
                    Ok(t) => took |= t,
                    Err(e) => {
                        self.fail_conn(peer, e);
                        took = true;
                    }
                }
            }
        }
        took
    }

    /// Checks the connections to `peers` (which carry no data) for a closed peer or an abort
    /// notice, and marks those broken. A failure found now is returned before one found by an
    /// earlier call: every connection is read, so a peer that failed first (and is reported
    /// again on every call) never hides another peer's notice or closed connection.
    pub fn probe_idle(
        &mut self,
        peers: impl IntoIterator<Item = usize>,
    ) -> Result<(), TransportError> {
        let mut known = None;
        for p in peers {
            let Some(conn) = self.conns.get_mut(p).and_then(Option::as_mut) else {
                continue;
            };
            let was_broken = conn.broken().is_some();
            match conn.probe_idle(&mut self.regions) {
                Some(e) if was_broken => {
                    known.get_or_insert(e);
                }
                Some(e) => {
                    self.fail_conn(p, e.clone());
                    return Err(e);
                }
                None => {}
            }
        }
        known.map_or(Ok(()), Err)
    }

    /// Closes every connection after saying goodbye (normal end of a communicator).
    pub fn close(&mut self) {
        for conn in self.conns.iter_mut().flatten() {
            conn.send_bye();
        }
        self.abort_quietly();
    }

    fn abort_quietly(&mut self) {
        self.aborted = true;
        for conn in self.conns.iter_mut().flatten() {
            for id in conn.fail(TransportError::Aborted) {
                self.requests.fail(id, TransportError::Aborted);
            }
        }
    }

    fn note_current(&mut self, tag: OpTag) {
        if tag.seq != 0 {
            self.current = tag;
        }
    }

    /// Whether any request is posted and unfinished, or a confirmed send awaits its
    /// acknowledgement.
    pub fn has_pending(&self) -> bool {
        self.requests.any_pending()
            || self
                .conns
                .iter()
                .flatten()
                .any(|c| c.awaits_acks().unwrap_or(false))
    }

    /// The waker that interrupts [`Transport::progress`] when called with `watch_wake`.
    pub fn waker(&self) -> &Arc<Waker> {
        &self.waker
    }
}

/// One-sided operations (windows): puts and signals are frames applied by the target's
/// progress thread whenever they arrive, in stream order.
impl SocketTransport {
    /// Registers `span` for puts and signals from peers; returns its id and the key peers
    /// need (`comm` names the communicator; the pid is filled by the caller where it matters).
    pub fn register_region(
        &mut self,
        span: Span,
        comm: u64,
        sink: Option<std::sync::Arc<dyn crate::transport::RegionSink>>,
    ) -> (RegionId, RemoteKey) {
        let staged = sink.is_some();
        let (id, generation) = self.regions.register(span, sink);
        let key = RemoteKey {
            comm,
            rank: self.rank as u32,
            id: id.0,
            generation,
            pid: std::process::id(),
            base: span.addr() as u64,
            len: span.len() as u64,
            rkey: 0,
            staged,
            ib: None,
        };
        (id, key)
    }

    /// Forgets a region: frames naming it are refused from now on.
    pub fn deregister_region(&mut self, id: RegionId) -> bool {
        self.regions.remove(id)
    }

    /// Whether regions are registered (their frames may arrive at any time).
    pub fn has_regions(&self) -> bool {
        !self.regions.is_empty()
    }

    /// The (signal, fence) counts that region `id` keeps for `peer`.
    pub fn region_counters(&self, id: RegionId, peer: usize) -> Option<(u64, u64)> {
        self.regions.counters(id, peer)
    }

    /// Posts a put of `src` at byte `offset` of the peer's region `dst`. Finishes once written
    /// to the socket. The bounds are checked against the key here, and again by the target.
    pub fn post_put(
        &mut self,
        peer: usize,
        src: Span,
        dst: &RemoteKey,
        offset: u64,
    ) -> Result<ReqId, TransportError> {
        dst.check_fits(offset, src.len() as u64)
            .map_err(|reason| TransportError::PeerLost { peer, reason })?;
        self.conn_mut(peer)?;
        let id = self.new_id(peer);
        let frame = frame::Frame::Put {
            len: src.len() as u64,
            region: dst.region_word(),
            offset,
        };
        self.conn_mut(peer)?.push_one_sided(id, frame, src);
        Ok(ReqId(id))
    }

    /// Posts a signal (adds `add` to the counter the peer's region keeps for this rank) or a
    /// fence, behind every put posted to that peer before it.
    pub fn post_signal(
        &mut self,
        peer: usize,
        dst: &RemoteKey,
        kind: SignalKind,
        add: u64,
    ) -> Result<ReqId, TransportError> {
        self.conn_mut(peer)?;
        let id = self.new_id(peer);
        let region = dst.region_word();
        let frame = match kind {
            SignalKind::Signal => frame::Frame::Signal { region, add },
            SignalKind::Fence => frame::Frame::Fence { region },
        };
        self.conn_mut(peer)?.push_one_sided(id, frame, Span::EMPTY);
        Ok(ReqId(id))
    }

    /// The error that broke the connection to `peer`, if it broke (a dead peer).
    pub fn peer_alive(&mut self, peer: usize) -> Result<(), TransportError> {
        self.conn_mut(peer).map(|_| ())
    }
}

impl Transport for SocketTransport {
    fn post_send(
        &mut self,
        peer: usize,
        data: Span,
        tag: OpTag,
        delivery: Delivery,
    ) -> Result<ReqId, TransportError> {
        self.conn_mut(peer)?;
        self.note_current(tag);
        let id = self.new_id(peer);
        self.conn_mut(peer)?.push_send(id, data, tag, delivery);
        Ok(ReqId(id))
    }

    fn begin_collective(&mut self, tag: OpTag) {
        self.note_current(tag);
    }

    fn owes_output(&self) -> bool {
        !self.aborted && self.conns.iter().flatten().any(|c| c.wants_write())
    }

    fn unconfirmed(&mut self) -> Result<bool, TransportError> {
        let mut waiting = false;
        for conn in self.conns.iter().flatten() {
            waiting |= conn.awaits_acks()?;
        }
        Ok(waiting)
    }

    fn post_recv(&mut self, peer: usize, data: Span, tag: OpTag) -> Result<ReqId, TransportError> {
        self.conn_mut(peer)?;
        self.note_current(tag);
        let id = self.new_id(peer);
        self.conn_mut(peer)?.push_recv(id, data, tag);
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
        let spin_until = Instant::now() + self.spin;
        loop {
            if self.pass() {
                self.stalled_since = None;
                return Ok(());
            }
            let now = Instant::now();
            if now >= until {
                return Ok(());
            }
            if now < spin_until {
                std::hint::spin_loop();
                continue;
            }
            if self.has_pending() {
                self.probe_if_stalled();
            }
            if self.sleep(until - now, watch_wake) {
                return Ok(());
            }
            if watch_wake {
                // The caller re-checks its queue; it set the waker's sleeping flag beforehand.
                return Ok(());
            }
        }
    }

    fn abort(&mut self, reason: &str) {
        for conn in self.conns.iter_mut().flatten() {
            conn.send_abort_notice(reason, ABORT_FLUSH);
        }
        self.abort_quietly();
    }

    fn register_region(
        &mut self,
        span: Span,
        comm: u64,
        sink: Option<std::sync::Arc<dyn crate::transport::RegionSink>>,
    ) -> Result<(RegionId, RemoteKey), TransportError> {
        Ok(SocketTransport::register_region(self, span, comm, sink))
    }

    fn deregister_region(&mut self, id: RegionId) -> bool {
        SocketTransport::deregister_region(self, id)
    }

    fn post_put(
        &mut self,
        peer: usize,
        src: Span,
        dst: &RemoteKey,
        offset: u64,
    ) -> Result<Option<ReqId>, TransportError> {
        SocketTransport::post_put(self, peer, src, dst, offset).map(Some)
    }

    fn post_signal(
        &mut self,
        peer: usize,
        dst: &RemoteKey,
        kind: SignalKind,
        add: u64,
    ) -> Result<ReqId, TransportError> {
        SocketTransport::post_signal(self, peer, dst, kind, add)
    }

    fn region_counters(&self, id: RegionId, peer: usize) -> Option<(u64, u64)> {
        SocketTransport::region_counters(self, id, peer)
    }

    fn has_regions(&self) -> bool {
        SocketTransport::has_regions(self)
    }

    fn peer_alive(&mut self, peer: usize) -> Result<(), TransportError> {
        SocketTransport::peer_alive(self, peer)
    }
}

impl AsFd for Waker {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::mesh::{connect_mesh, Listener, MeshPlan, SocketConfig};
    use super::*;

    /// `n` ranks of one process, connected over loopback.
    fn mesh(n: usize) -> Vec<SocketTransport> {
        let listeners: Vec<_> = (0..n)
            .map(|_| Listener::bind(Ipv4Addr::LOCALHOST.into()).unwrap())
            .collect();
        let addrs: Vec<_> = listeners.iter().map(Listener::addr).collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        std::thread::scope(|s| {
            let joins: Vec<_> = listeners
                .into_iter()
                .enumerate()
                .map(|(rank, l)| {
                    let plan = MeshPlan {
                        comm: "buffers".into(),
                        rank,
                        addrs: addrs.clone(),
                        key: [7; 32],
                        handshake_timeout: Duration::from_secs(10),
                        protection: Protection::None,
                        local_pids: Vec::new(),
                    };
                    s.spawn(move || connect_mesh(l, &plan, &SocketConfig::default(), deadline))
                })
                .collect();
            joins
                .into_iter()
                .map(|j| j.join().unwrap().unwrap())
                .collect()
        })
    }

    /// Two ranks of one process, connected over loopback.
    fn pair() -> [SocketTransport; 2] {
        let mut ends = mesh(2);
        let b = ends.pop().unwrap();
        [ends.pop().unwrap(), b]
    }

    /// Probes `peers` from `t` until a failure of `peer` is reported (or 10 s pass).
    fn probe_until(t: &mut SocketTransport, peers: &[usize], peer: usize) -> TransportError {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match t.probe_idle(peers.iter().copied()) {
                Err(e) if e.peer() == Some(peer) => return e,
                other => assert!(
                    Instant::now() < deadline,
                    "no failure of peer {peer} reported; last {other:?}"
                ),
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A peer that failed first is reported again on every probe; a second peer's notice must
    /// still come through (a rank waiting for that peer would otherwise wait for the timeout).
    #[test]
    fn a_failed_peer_does_not_hide_the_next_one() {
        let mut ranks = mesh(3);
        ranks[1].abort("the first failure");
        probe_until(&mut ranks[0], &[1, 2], 1);
        ranks[2].abort("the second failure");
        let e = probe_until(&mut ranks[0], &[1, 2], 2);
        assert!(e.to_string().contains("the second failure"), "{e}");
    }

    /// Rank 1 sends to rank 0 and receives from it at once; rank 0, busy with other work
    /// (idle here), sees that data before it sends to rank 1 and waits for the acknowledgement.
    /// The acknowledgement is queued behind the data, so rank 0 must read it early then, though
    /// it left it in the socket when it first saw it (no acknowledgement was awaited yet).
    #[test]
    fn data_seen_before_a_synchronous_send_is_read_early_for_its_acknowledgement() {
        let [mut a, mut b] = pair();
        a.set_spin(Duration::ZERO);
        let (mut to_a, mut to_b) = (vec![1u8; 32], vec![2u8; 32]);
        let (mut got_a, mut got_b) = (vec![0u8; 32], vec![0u8; 32]);
        // SAFETY: the buffers outlive the requests (waited for below, or the test fails).
        let span = |v: &mut Vec<u8>| unsafe { Span::from_slice(v) };
        let b_reqs = [
            b.post_send(0, span(&mut to_a), OpTag::P2P, Delivery::Accepted)
                .unwrap(),
            b.post_recv(0, span(&mut got_b), OpTag::P2P).unwrap(),
        ];
        let soon = || Instant::now() + Duration::from_millis(5);
        b.progress(soon(), false).unwrap();
        // Rank 0 sleeps with nothing posted: it looks at the data and leaves it in the socket.
        a.progress(Instant::now() + Duration::from_millis(500), false)
            .unwrap();
        let a_send = a
            .post_send(1, span(&mut to_b), OpTag::P2P, Delivery::Accepted)
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !a.test(a_send).unwrap() {
            assert!(
                Instant::now() < deadline,
                "the send never saw its acknowledgement"
            );
            a.progress(soon(), false).unwrap();
            b.progress(soon(), false).unwrap();
        }
        let a_recv = a.post_recv(1, span(&mut got_a), OpTag::P2P).unwrap();
        let (mut a_left, mut b_left) = (vec![a_recv], b_reqs.to_vec());
        while !a_left.is_empty() || !b_left.is_empty() {
            assert!(
                Instant::now() < deadline,
                "rank 1's requests never finished"
            );
            a.progress(soon(), false).unwrap();
            b.progress(soon(), false).unwrap();
            a_left.retain(|&r| !a.test(r).unwrap());
            b_left.retain(|&r| !b.test(r).unwrap());
        }
        assert_eq!((got_a, got_b), (to_a, to_b));
    }

    fn limit(path: &str) -> usize {
        std::fs::read_to_string(path)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    #[test]
    fn set_buffers_resizes_the_connections_to_the_peers_named() {
        let [mut a, b] = pair();
        let bytes = 1 << 20;
        a.set_buffers([1], bytes);
        let conn = |t: &SocketTransport| {
            let c = t.conns[1 - t.rank].as_ref().unwrap();
            c.buffer_sizes().unwrap()
        };
        // Linux doubles the request (bookkeeping) after capping it at the system's limit.
        let expected = (
            2 * bytes.min(limit("/proc/sys/net/core/wmem_max")),
            2 * bytes.min(limit("/proc/sys/net/core/rmem_max")),
        );
        assert_eq!(conn(&a), expected);
        assert_ne!(conn(&b), expected, "the other end keeps the kernel's sizes");
    }
}
