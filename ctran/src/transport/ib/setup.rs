//! Setting a transport up: its settings, its errors, and the connection to each peer from
//! endpoint bytes (passed directly, or through the communicator's store).

use std::collections::HashMap;
use std::time::Duration;

use ibverbx::verbs::QpEndpoint;
use ibverbx::{RemoteKey as IbKey, VirtualCq, VirtualQp, VqpConfig};

use super::backend::{IbBackend, IbMemory};
use super::peer::Peer;
use super::pool::Pool;
use super::wire::{RING_SLOTS, SLOT};
use super::{IbTransport, POOL_BYTES};
use crate::transport::region::RegionTable;
use crate::transport::requests::Requests;
use crate::transport::OpTag;
use torchcomms_core::bootstrap::auth::{mac, verify_mac};

/// Bytes of the MAC that follows an endpoint in the store.
const ENDPOINT_MAC_BYTES: usize = 32;

/// Label of the MAC of an endpoint: `from`'s for `to`, over the prefix, both ranks and the bytes.
const ENDPOINT_LABEL: &[u8] = b"torchcomms-rs ib endpoint v1";

fn rank_pair(from: usize, to: usize) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&(from as u64).to_le_bytes());
    b[8..].copy_from_slice(&(to as u64).to_le_bytes());
    b
}

pub(super) fn endpoint_mac(
    key: &[u8],
    prefix: &str,
    from: usize,
    to: usize,
    ep: &[u8],
) -> [u8; 32] {
    mac(
        key,
        &[ENDPOINT_LABEL, prefix.as_bytes(), &rank_pair(from, to), ep],
    )
}

fn endpoint_mac_ok(
    key: &[u8],
    prefix: &str,
    from: usize,
    to: usize,
    ep: &[u8],
    tag: &[u8],
) -> bool {
    verify_mac(
        key,
        &[ENDPOINT_LABEL, prefix.as_bytes(), &rank_pair(from, to), ep],
        tag,
    )
}

/// Why setting the transport up failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IbError {
    /// A verbs (or software fabric) call failed.
    #[error("ib transport, rank {rank}: {op}: {source}")]
    Verbs {
        /// This rank.
        rank: usize,
        /// What was being done.
        op: String,
        /// The call's error.
        #[source]
        source: ibverbx::Error,
    },
    /// The store did not carry an endpoint.
    #[error("ib transport, rank {rank}: endpoint exchange with peer {peer}: {source}")]
    Store {
        /// This rank.
        rank: usize,
        /// The peer.
        peer: usize,
        /// The store's error.
        #[source]
        source: crate::error::Error,
    },
    /// The peer's endpoint bytes do not fit this rank's settings.
    #[error("ib transport, rank {rank}: endpoint of peer {peer}: {reason}")]
    BadEndpoint {
        /// This rank.
        rank: usize,
        /// The peer.
        peer: usize,
        /// What is wrong.
        reason: String,
    },
}

/// Settings of the ib transport (from [`ibverbx::IbConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbSettings {
    /// Physical QPs per peer.
    pub qps_per_connection: usize,
    /// Chunking, mode and outstanding limit of each virtual QP.
    pub vqp: VqpConfig,
}

impl IbSettings {
    /// The settings `cfg` (read from cvars) gives.
    pub fn from_config(cfg: &ibverbx::IbConfig) -> IbSettings {
        IbSettings {
            qps_per_connection: cfg.qps_per_connection.max(1),
            vqp: cfg.vqp,
        }
    }
}

const MAGIC: &[u8; 4] = b"CTIB";
const HEADER: usize = 8 + IbKey::BYTES;

/// This rank's side of a connection before the peer's endpoint arrived.
pub(super) struct Half<B: IbBackend> {
    pub(super) qps: Vec<B::Unconnected>,
    pub(super) send_ring: B::Mem,
    pub(super) recv_ring: B::Mem,
}

impl<B: IbBackend> IbTransport<B> {
    /// A transport for `rank` of `size` ranks on `backend`; connect each peer with
    /// [`IbTransport::endpoint`] and [`IbTransport::connect`].
    pub fn new(
        backend: B,
        rank: usize,
        size: usize,
        settings: IbSettings,
    ) -> Result<IbTransport<B>, IbError> {
        let cq = backend.create_cq().map_err(|source| IbError::Verbs {
            rank,
            op: "creating the completion queue".into(),
            source,
        })?;
        Ok(IbTransport {
            backend,
            rank,
            settings,
            vcq: VirtualCq::new(cq),
            halves: HashMap::new(),
            peers: (0..size).map(|_| None).collect(),
            conn_peer: HashMap::new(),
            next_wr: 1,
            requests: Requests::new(super::ID_BASE),
            aborted: false,
            current: OpTag::default(),
            regions: RegionTable::new(size),
            region_mems: HashMap::new(),
            pool: Pool::new(POOL_BYTES),
            in_place: super::in_place::InPlace::new(),
            events: Vec::new(),
        })
    }

    fn verbs(&self, op: String) -> impl FnOnce(ibverbx::Error) -> IbError + 'static {
        let rank = self.rank;
        move |source| IbError::Verbs { rank, op, source }
    }

    /// The bytes `peer` needs to connect to this rank (its queue pairs and control ring): to
    /// pass through the communicator's store or an existing connection. Creates this side of
    /// the connection on first call.
    pub fn endpoint(&mut self, peer: usize) -> Result<Vec<u8>, IbError> {
        if !self.halves.contains_key(&peer) {
            let n = self.settings.qps_per_connection;
            let mut qps = Vec::with_capacity(n);
            for _ in 0..n {
                let qp = self.backend.create_qp(self.vcq.physical());
                qps.push(qp.map_err(self.verbs(format!("creating a QP for peer {peer}")))?);
            }
            let ring = RING_SLOTS as usize * SLOT;
            let send_ring = self.backend.register(ring);
            let send_ring = send_ring.map_err(self.verbs("registering a ring".into()))?;
            let recv_ring = self.backend.register(ring);
            let recv_ring = recv_ring.map_err(self.verbs("registering a ring".into()))?;
            self.halves.insert(
                peer,
                Half {
                    qps,
                    send_ring,
                    recv_ring,
                },
            );
        }
        let h = &self.halves[&peer];
        let mut b = Vec::with_capacity(HEADER + h.qps.len() * QpEndpoint::BYTES);
        b.extend_from_slice(MAGIC);
        b.push(self.settings.vqp.mode as u8);
        b.push(0);
        b.extend_from_slice(&(h.qps.len() as u16).to_le_bytes());
        b.extend_from_slice(&h.recv_ring.remote_key().to_bytes());
        for qp in &h.qps {
            let ep = self.backend.endpoint(qp);
            b.extend_from_slice(
                &ep.map_err(self.verbs("querying an endpoint".into()))?
                    .to_bytes(),
            );
        }
        Ok(b)
    }

    /// Connects to `peer` from the bytes its [`IbTransport::endpoint`] gave for this rank.
    pub fn connect(&mut self, peer: usize, remote: &[u8]) -> Result<(), IbError> {
        let bad = |reason: String| IbError::BadEndpoint {
            rank: self.rank,
            peer,
            reason,
        };
        if peer >= self.peers.len() || peer == self.rank {
            return Err(bad(format!(
                "no peer {peer} among {} ranks",
                self.peers.len()
            )));
        }
        if remote.len() < HEADER || &remote[..4] != MAGIC {
            return Err(bad("not an ib transport endpoint".into()));
        }
        if remote[4] != self.settings.vqp.mode as u8 {
            return Err(bad("the peer uses another virtual QP mode".into()));
        }
        let n = usize::from(u16::from_le_bytes([remote[6], remote[7]]));
        if n != self.settings.qps_per_connection {
            return Err(bad(format!(
                "the peer uses {n} QPs per connection, this rank {}",
                self.settings.qps_per_connection
            )));
        }
        let ring = IbKey::from_bytes(&remote[8..HEADER]).map_err(|e| bad(e.to_string()))?;
        let eps = QpEndpoint::decode_many(&remote[HEADER..]).map_err(|e| bad(e.to_string()))?;
        if eps.len() != n || ring.len < RING_SLOTS * SLOT as u64 {
            return Err(bad("endpoint count or ring size".into()));
        }
        self.endpoint(peer)?;
        let half = self.halves.remove(&peer).expect("made above");
        let mut qps = Vec::with_capacity(n);
        for (qp, ep) in half.qps.into_iter().zip(&eps) {
            let qp = self.backend.connect(qp, ep);
            qps.push(qp.map_err(self.verbs(format!("connecting to peer {peer}")))?);
        }
        let vqp = VirtualQp::new(&mut self.vcq, qps, self.settings.vqp);
        let vqp = vqp.map_err(self.verbs(format!("virtual QP to peer {peer}")))?;
        self.conn_peer.insert(vqp.id(), peer);
        self.peers[peer] = Some(Peer::new(vqp, half.send_ring, half.recv_ring, ring));
        Ok(())
    }

    /// Connects every peer through `store`: publishes this rank's endpoint for each peer under
    /// `{prefix}/ib/{rank}/{peer}`, then reads each peer's for this rank, waiting up to
    /// `timeout` for it.
    ///
    /// Each endpoint travels with a MAC under `key` (the communicator's mesh key) over the
    /// prefix, both ranks and the bytes: the store is shared with anyone who can reach it, and
    /// an endpoint names QP numbers and a ring's rkey that a forger could point elsewhere. An
    /// endpoint that fails the check is refused before any QP is touched.
    pub fn connect_through_store(
        &mut self,
        store: &dyn crate::bootstrap::Store,
        prefix: &str,
        key: &[u8],
        timeout: Duration,
    ) -> Result<(), IbError> {
        let rank = self.rank;
        let others: Vec<usize> = (0..self.peers.len()).filter(|&p| p != rank).collect();
        for &peer in &others {
            let mut ep = self.endpoint(peer)?;
            ep.extend_from_slice(&endpoint_mac(key, prefix, rank, peer, &ep));
            store
                .set(&format!("{prefix}/ib/{rank}/{peer}"), &ep)
                .map_err(|source| IbError::Store { rank, peer, source })?;
        }
        for &peer in &others {
            let signed = store
                .get(&format!("{prefix}/ib/{peer}/{rank}"), timeout)
                .map_err(|source| IbError::Store { rank, peer, source })?;
            let ep = signed
                .len()
                .checked_sub(ENDPOINT_MAC_BYTES)
                .map(|at| signed.split_at(at))
                .filter(|(ep, tag)| endpoint_mac_ok(key, prefix, peer, rank, ep, tag))
                .map(|(ep, _)| ep)
                .ok_or_else(|| IbError::BadEndpoint {
                    rank,
                    peer,
                    reason: "its endpoint failed authentication (another job's, or forged)".into(),
                })?;
            self.connect(peer, ep)?;
        }
        Ok(())
    }
}
