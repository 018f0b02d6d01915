//! Transports move bytes between two ranks. Every algorithm is written against [`Transport`]
//! alone, so one algorithm runs over TCP, shared memory or RDMA alike.
//!
//! The model is two-sided and ordered, like NCCL's network plugin (`isend`/`irecv`/`test`):
//! sends and receives posted to one peer are matched first-in first-out, and a message must be
//! received into a buffer of exactly its size (a difference means the ranks disagree about the
//! operation, and is reported as a mismatch). Because every rank runs operations in the same
//! order and each algorithm posts in a deterministic order, FIFO matching needs no tags.
//! Posting never blocks; [`Transport::progress`] moves bytes for every posted request at once,
//! so algorithms can keep sends and receives to many peers in flight.

pub mod ib;
pub mod mapper;
pub mod region;
pub(crate) mod requests;
pub mod shm;
pub mod socket;
pub mod tag;

use std::fmt;
use std::time::Instant;

use crate::span::Span;
pub use region::{RegionId, RegionSink, RemoteKey, SignalKind};
pub use tag::OpTag;

/// How long a rank waits with nothing moving before it checks that its peers run the same
/// operation. Ranks that disagree about a root (or the order of collectives) can wait for each
/// other forever without exchanging a byte; the check turns that into an error naming both
/// views. Later than any wait on a healthy job's critical path, far earlier than a timeout.
pub(crate) const AGREEMENT_CHECK_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

/// Names of the transports this build has (`socket` between hosts, `shm` within one, `nvl`
/// between GPUs of one host: see [`crate::nvl`]).
pub const AVAILABLE: &[&str] = &["socket", "shm", "nvl"];

/// Identifies a posted send or receive until [`Transport::test`] reports it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqId(pub u64);

/// Why a transport request failed. The layer above adds the op, its sequence number and rank.
#[derive(Debug, Clone, PartialEq)]
pub enum TransportError {
    /// The peer closed the connection or it broke.
    PeerLost {
        /// The peer.
        peer: usize,
        /// What the OS or the peer said.
        reason: String,
    },
    /// The peer sent a message of another size than the receive posted for it.
    SizeMismatch {
        /// The peer.
        peer: usize,
        /// Bytes this rank expected.
        expected: usize,
        /// Bytes the peer sent.
        got: usize,
    },
    /// The peer posted a receive of another size than this rank's send to it (found by the
    /// sender, where a transport matches receives before data moves).
    PostedMismatch {
        /// The peer.
        peer: usize,
        /// Bytes this rank sends.
        sending: usize,
        /// Bytes the peer's receive holds.
        posted: usize,
    },
    /// The peer runs another operation than this rank (a different collective, sequence
    /// number, element type, reduce op or root).
    Disagree {
        /// The peer.
        peer: usize,
        /// What this rank runs.
        expected: OpTag,
        /// What the peer runs.
        got: OpTag,
    },
    /// The transport was aborted locally.
    Aborted,
    /// The transport cannot do this (a one-sided read over TCP, say).
    Unsupported(String),
}

impl TransportError {
    /// The peer involved, if any.
    pub fn peer(&self) -> Option<usize> {
        match self {
            TransportError::PeerLost { peer, .. }
            | TransportError::SizeMismatch { peer, .. }
            | TransportError::PostedMismatch { peer, .. }
            | TransportError::Disagree { peer, .. } => Some(*peer),
            TransportError::Aborted | TransportError::Unsupported(_) => None,
        }
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::PeerLost { peer, reason } => write!(f, "peer {peer}: {reason}"),
            TransportError::SizeMismatch {
                peer,
                expected,
                got,
            } => write!(
                f,
                "peer {peer} sent {got} bytes where {expected} bytes were expected"
            ),
            TransportError::PostedMismatch {
                peer,
                sending,
                posted,
            } => write!(
                f,
                "peer {peer} posted a receive of {posted} bytes for this rank's send of \
                 {sending} bytes"
            ),
            TransportError::Disagree {
                peer,
                expected,
                got,
            } => write!(f, "peer {peer} runs {got} where this rank runs {expected}"),
            TransportError::Aborted => f.write_str("transport aborted"),
            TransportError::Unsupported(what) => write!(f, "not supported: {what}"),
        }
    }
}

/// When a send's request finishes, and what becomes of the receiver's acceptance (its check of
/// the sender's tag and size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Finishes once the data left this rank; acceptance is not awaited.
    Eager,
    /// Finishes once the data left; acceptance is awaited through [`Transport::unconfirmed`]
    /// (a collective waits for all of its sends at its end).
    Confirmed,
    /// Finishes only once the receiver accepted it, so a point-to-point send whose receiver
    /// refuses it fails as the receive does (a synchronous send, as MPI_Ssend).
    Accepted,
}

/// Moves bytes between this rank and its peers. Single-threaded: the communicator's progress
/// thread owns it.
pub trait Transport: Send + fmt::Debug {
    /// Posts a send of `data` to `peer`, on behalf of the operation `tag` names. The memory must
    /// stay valid until the request finishes. `delivery` says when it finishes and whether the
    /// receiver's acceptance is awaited ([`Delivery`]).
    fn post_send(
        &mut self,
        peer: usize,
        data: Span,
        tag: OpTag,
        delivery: Delivery,
    ) -> Result<ReqId, TransportError>;

    /// Whether confirmed sends wait for their receivers to accept them (tag and size checked);
    /// the error of a receiver that refused one or failed. Lets a rank whose part of an
    /// operation is only sending fail with the receiver instead of succeeding alone.
    fn unconfirmed(&mut self) -> Result<bool, TransportError>;

    /// Whether bytes wait to be written although no request waits for them (acknowledgements
    /// a full socket held back): the owner keeps calling [`Transport::progress`] until they
    /// left, or a peer that waits for them would wait forever.
    fn owes_output(&self) -> bool {
        false
    }

    /// This rank starts the collective `tag` names: peers that wait on it long compare it with
    /// theirs.
    fn begin_collective(&mut self, tag: OpTag);

    /// Posts a receive of exactly `data.len()` bytes from `peer` into `data`, for the operation
    /// `tag` names: a message of another operation fails it with [`TransportError::Disagree`].
    fn post_recv(&mut self, peer: usize, data: Span, tag: OpTag) -> Result<ReqId, TransportError>;

    /// `Ok(true)` once the request finished (and forgets it), `Ok(false)` while in flight, or the
    /// error that failed it.
    fn test(&mut self, req: ReqId) -> Result<bool, TransportError>;

    /// The peer a pending request talks to (for error messages).
    fn peer_of(&self, req: ReqId) -> Option<usize>;

    /// Moves bytes for all posted requests. Returns when at least one request made progress or
    /// finished, when `wake` is signalled (if polling for it), or at `until`.
    fn progress(&mut self, until: Instant, watch_wake: bool) -> Result<(), TransportError>;

    /// Fails every pending request and closes connections so peers notice quickly; `reason` is
    /// passed on to peers where the transport can (so they can name the root cause).
    fn abort(&mut self, reason: &str);

    /// Registers `span`, memory of `device` that stays valid until
    /// [`Transport::deregister_buffer`], so that sends from it and receives into it move in
    /// place (no staging copy) where this transport can. `Ok(false)`: this transport copies as
    /// before. An error says why registering failed; transfers then stage as before.
    fn register_buffer(
        &mut self,
        span: Span,
        device: &crate::transport::ib::UserDevice,
    ) -> Result<bool, TransportError> {
        let _ = (span, device);
        Ok(false)
    }

    /// Forgets the registration of `span` (made by [`Transport::register_buffer`]); transfers
    /// posted before it still complete in place.
    fn deregister_buffer(&mut self, span: Span) {
        let _ = span;
    }

    /// Whether transfers with `peer` go through a transport that moves registered buffers in
    /// place, without touching them from this process (ib): only then may a registered
    /// buffer be memory this process cannot read (GPU memory).
    fn moves_in_place(&self, peer: usize) -> bool {
        let _ = peer;
        false
    }

    /// How many transfers moved in place through buffers of [`Transport::register_buffer`]
    /// (diagnostics).
    fn moved_in_place(&self) -> u64 {
        0
    }

    // One-sided operations (windows). A region is registered locally; its [`RemoteKey`]
    // travels to the peers (as bytes, through an all_gather); puts and signals name it. The
    // target's progress thread applies them whenever they arrive, in order per peer, and
    // checks every one against its own table before touching memory.

    /// Registers `span` (which must stay valid until deregistered) for puts and signals from
    /// peers of the communicator `comm` ([`region::comm_id`]). With a `sink`, `span` is
    /// staging: the sink learns of every put and signal as they apply.
    fn register_region(
        &mut self,
        span: Span,
        comm: u64,
        sink: Option<std::sync::Arc<dyn RegionSink>>,
    ) -> Result<(RegionId, RemoteKey), TransportError> {
        let _ = (span, comm, sink);
        Err(TransportError::Unsupported(
            "registering memory regions".into(),
        ))
    }

    /// Forgets a region; frames naming it are refused afterwards. Whether it was registered.
    fn deregister_region(&mut self, id: RegionId) -> bool {
        let _ = id;
        false
    }

    /// Writes `src` at byte `offset` of `peer`'s region `dst`. `Ok(None)` when it completed
    /// already (written), else the request that finishes once the data left this rank. `src`
    /// must stay valid until then. Out of bounds of `dst` is an error here, and the target
    /// refuses it again.
    fn post_put(
        &mut self,
        peer: usize,
        src: Span,
        dst: &RemoteKey,
        offset: u64,
    ) -> Result<Option<ReqId>, TransportError> {
        let _ = (peer, src, dst, offset);
        Err(TransportError::Unsupported("one-sided puts".into()))
    }

    /// Adds `add` to the counter `peer`'s region `dst` keeps for this rank (or, for
    /// [`SignalKind::Fence`], its fence counter), ordered after every put posted to `peer`
    /// before it: once the peer sees the signal, those puts' data is there.
    fn post_signal(
        &mut self,
        peer: usize,
        dst: &RemoteKey,
        kind: SignalKind,
        add: u64,
    ) -> Result<ReqId, TransportError> {
        let _ = (peer, dst, kind, add);
        Err(TransportError::Unsupported("one-sided signals".into()))
    }

    /// Reads `dst.len()` bytes at byte `offset` of `peer`'s region `src` into `dst`, where
    /// the transport can read remotely. `Ok(None)` when it completed already.
    fn post_get(
        &mut self,
        peer: usize,
        dst: Span,
        src: &RemoteKey,
        offset: u64,
    ) -> Result<Option<ReqId>, TransportError> {
        let _ = (peer, dst, src, offset);
        Err(TransportError::Unsupported(
            "one-sided reads (get) over this transport".into(),
        ))
    }

    /// The (signal, fence) counts that local region `id` keeps for `peer`; `None` for an
    /// unknown region.
    fn region_counters(&self, id: RegionId, peer: usize) -> Option<(u64, u64)> {
        let _ = (id, peer);
        None
    }

    /// Whether regions are registered (their frames may arrive at any time, so the owner
    /// keeps the transport progressing while idle).
    fn has_regions(&self) -> bool {
        false
    }

    /// The error that broke the way to `peer`, if any (a waiter on a signal gives up).
    fn peer_alive(&mut self, peer: usize) -> Result<(), TransportError> {
        let _ = peer;
        Ok(())
    }
}
