//! One-sided operations: regions registered as shadows peers RDMA-write into, puts, and
//! signals ordered after the puts before them.

use ibverbx::{Put, RemoteKey as IbKey};

use super::backend::{IbBackend, IbMemory};
use super::peer::{InFlight, OneSided};
use super::wire::Ctl;
use super::{lost, IbTransport};
use crate::span::Span;
use crate::transport::{RegionId, RemoteKey, ReqId, SignalKind, TransportError};

impl<B: IbBackend> IbTransport<B> {
    /// Registers a shadow of `span` for puts and signals ([`crate::transport::Transport::register_region`]).
    pub(super) fn register(
        &mut self,
        span: Span,
        comm: u64,
    ) -> Result<(RegionId, RemoteKey), TransportError> {
        let mem = self.backend.register(span.len()).map_err(|e| {
            TransportError::Unsupported(format!("registering a region of {} B: {e}", span.len()))
        })?;
        let (id, generation) = self.regions.register(span, None);
        let ib = mem.remote_key();
        self.region_mems.insert(id.0, mem);
        let key = RemoteKey {
            comm,
            rank: self.rank as u32,
            id: id.0,
            generation,
            pid: std::process::id(),
            base: ib.addr,
            len: span.len() as u64,
            rkey: ib.rkey,
            staged: false,
            ib: None,
        };
        Ok((id, key))
    }

    /// Forgets a region and its registration.
    pub(super) fn deregister(&mut self, id: RegionId) -> bool {
        // Dropping the registration invalidates its rkey: the fabric refuses later writes.
        self.region_mems.remove(&id.0);
        self.regions.remove(id)
    }

    /// An RDMA write of `src` into the peer's region ([`crate::transport::Transport::post_put`]).
    pub(super) fn put(
        &mut self,
        peer: usize,
        src: Span,
        dst: &RemoteKey,
        offset: u64,
    ) -> Result<Option<ReqId>, TransportError> {
        let len = src.len() as u64;
        dst.check_fits(offset, len)
            .map_err(|reason| TransportError::PeerLost { peer, reason })?;
        self.peer_mut(peer)?;
        if src.is_empty() {
            return Ok(None);
        }
        let staging = self.stage(peer, src)?;
        let wr = self.next_wr;
        self.next_wr += 1;
        let put = Put {
            wr_id: wr,
            local: staging.local_key(),
            local_offset: 0,
            remote: IbKey {
                addr: dst.base,
                len: dst.len,
                rkey: dst.rkey,
            },
            remote_offset: offset,
            len,
            notify: false,
        };
        self.peer_mut(peer)?
            .vqp
            .put(&put)
            .map_err(|e| lost(peer, e))?;
        let id = self.new_id(peer);
        let p = self.peer_mut(peer)?;
        p.writes.insert(wr, InFlight::OneSided { req: id, staging });
        p.onesided.push_back(OneSided::Put {
            wr,
            ctl: Ctl::Put {
                region: dst.region_word(),
                offset,
                len,
            },
            done: false,
        });
        Ok(Some(ReqId(id)))
    }

    /// A signal behind every earlier put to `peer` ([`crate::transport::Transport::post_signal`]).
    pub(super) fn signal(
        &mut self,
        peer: usize,
        dst: &RemoteKey,
        kind: SignalKind,
        add: u64,
    ) -> Result<ReqId, TransportError> {
        self.peer_mut(peer)?;
        let id = self.new_id(peer);
        let ctl = Ctl::Signal {
            region: dst.region_word(),
            fence: kind == SignalKind::Fence,
            add,
        };
        self.peer_mut(peer)?
            .onesided
            .push_back(OneSided::Signal { req: id, ctl });
        self.drain_onesided(peer);
        Ok(ReqId(id))
    }

    /// Sends the control messages of one-sided operations whose turn came.
    pub(super) fn drain_onesided(&mut self, peer: usize) {
        let Ok(p) = self.peer_mut(peer) else { return };
        loop {
            match p.onesided.front() {
                Some(OneSided::Put { done: true, .. }) => {
                    if let Some(OneSided::Put { ctl, .. }) = p.onesided.pop_front() {
                        p.queue(ctl, None);
                    }
                }
                Some(OneSided::Signal { .. }) => {
                    if let Some(OneSided::Signal { req, ctl }) = p.onesided.pop_front() {
                        p.queue(ctl, Some(req));
                    }
                }
                _ => return,
            }
        }
    }

    /// The peer wrote `len` bytes at `offset` of region `region`: checked against the table,
    /// then copied from the registration into the region.
    pub(super) fn on_put(&mut self, peer: usize, region: u64, offset: u64, len: u64) {
        match self.regions.check_put(region, offset, len) {
            // ib registers no staged regions (register_region refuses a sink).
            Ok(target) => {
                if let Some(m) = self.region_mems.get(&((region >> 32) as u32)) {
                    m.read_into(offset as usize, target.dst);
                }
            }
            Err(why) => self.refuse(peer, "put", region, why),
        }
    }

    /// The peer signals (or fences) region `region`.
    pub(super) fn on_signal(&mut self, peer: usize, region: u64, fence: bool, add: u64) {
        let kind = if fence {
            SignalKind::Fence
        } else {
            SignalKind::Signal
        };
        if let Err(why) = self.regions.apply_signal(region, peer, kind, add) {
            self.refuse(peer, "signal", region, why);
        }
    }

    /// Tells the peer why its one-sided operation was refused and breaks the way to it. The
    /// peer gets a short reason (an abort message holds 47 bytes); the full one is logged and
    /// fails this rank's requests to that peer.
    fn refuse(&mut self, peer: usize, what: &str, region: u64, why: String) {
        let short = if why.contains("stale") {
            "stale generation"
        } else if why.contains("not registered") {
            "not registered"
        } else if why.contains("exceeds") {
            "out of bounds"
        } else {
            "refused"
        };
        let reason = format!("refused {what} to region {}: {why}", region >> 32);
        self.fail_peer(peer, TransportError::PeerLost { peer, reason });
        if let Some(p) = self.peers[peer].as_mut() {
            let reason = format!("{what} to region {}: {short}", region >> 32);
            p.queue(Ctl::Abort { reason }, None);
        }
    }
}
