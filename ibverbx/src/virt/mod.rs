//! Virtual queue pairs: one logical connection over N physical RC queue pairs.
//!
//! A put (local region + offset → remote key + offset, length, optional notification) is cut
//! into chunks of [`VqpConfig::chunk_bytes`] spread round-robin over the physical QPs, at
//! most [`VqpConfig::max_msgs_per_qp`] outstanding on each (the rest wait in the virtual QP and
//! go out as completions free slots).
//!
//! - **DQPLB** ([`VcMode::Dqplb`]): every chunk is an RDMA write with immediate data carrying
//!   a sequence number ([`seq`]); the last chunk of a notified put sets the notify bit. The
//!   receiver's tracker delivers notifications in posting order even when chunks complete out
//!   of order across QPs.
//! - **Spray** ([`VcMode::Spray`]): chunks are plain RDMA writes; once all of a put's chunks
//!   completed at the sender (so the data is placed at the peer), one zero-byte write with
//!   immediate on QP 0 carries the notification. Notifications are posted in put order.
//!
//! [`VirtualCq`] polls the physical completion queue and turns completions into per-put
//! events: a put completes (in posting order, per connection) once all its chunks (and its
//! spray notification) completed, carrying the first error of any of them with context; the
//! receiving side gets one [`Event::Notify`] per notified put, in order.
//!
//! After the first failed completion the connection is broken: chunks not yet posted are not
//! posted, puts still outstanding complete with an error naming the first failure, and new
//! puts are refused.

mod conn;
pub mod seq;
mod vcq;

pub use vcq::{VirtualCq, VirtualQp};

use crate::error::{Error, Result};
use crate::provider::{LocalKey, RemoteKey, WcStatus};

/// How a virtual QP spreads a put and notifies the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VcMode {
    /// Every chunk an RDMA write with immediate (sequence number in the immediate).
    Dqplb,
    /// Plain writes, then one zero-byte write with immediate once all completed.
    Spray,
}

impl std::str::FromStr for VcMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<VcMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "dqplb" => Ok(VcMode::Dqplb),
            "spray" => Ok(VcMode::Spray),
            other => Err(Error::BadConfig(format!(
                "virtual QP mode {other:?} (expected dqplb or spray)"
            ))),
        }
    }
}

/// Settings of one virtual QP (both sides must agree on the mode and the limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VqpConfig {
    /// Bytes per chunk; 0 splits every put equally across the QPs.
    pub chunk_bytes: u64,
    /// DQPLB or spray.
    pub mode: VcMode,
    /// Chunks outstanding per physical QP (also the receives kept posted on each).
    pub max_msgs_per_qp: u32,
    /// Sequence bits of the immediate data (24; fewer only to test wraparound).
    pub seq_bits: u32,
}

impl Default for VqpConfig {
    fn default() -> VqpConfig {
        VqpConfig {
            chunk_bytes: 512 << 10,
            mode: VcMode::Dqplb,
            max_msgs_per_qp: 128,
            seq_bits: seq::SEQ_BITS,
        }
    }
}

impl VqpConfig {
    pub(crate) fn validate(&self, nqps: usize) -> Result<()> {
        if nqps == 0 {
            return Err(Error::BadConfig(
                "a virtual QP needs at least one QP".into(),
            ));
        }
        if self.max_msgs_per_qp == 0 {
            return Err(Error::BadConfig(
                "max_msgs_per_qp must be at least 1".into(),
            ));
        }
        if !(1..=seq::SEQ_BITS).contains(&self.seq_bits) {
            return Err(Error::BadConfig(format!(
                "seq_bits {} is not 1..=24",
                self.seq_bits
            )));
        }
        // The tracker refuses numbers half the space ahead: keep everything in flight below.
        let in_flight = nqps as u64 * u64::from(self.max_msgs_per_qp);
        if in_flight >= 1u64 << (self.seq_bits - 1) {
            return Err(Error::BadConfig(format!(
                "{nqps} QPs x {} outstanding chunks do not fit {} sequence bits",
                self.max_msgs_per_qp, self.seq_bits
            )));
        }
        Ok(())
    }
}

/// One put: `len` bytes from `local` at `local_offset` to `remote` at `remote_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Put {
    /// Returned in the put's completion.
    pub wr_id: u64,
    /// Registered source region.
    pub local: LocalKey,
    /// Offset in it.
    pub local_offset: u64,
    /// The peer's registered destination region.
    pub remote: RemoteKey,
    /// Offset in it.
    pub remote_offset: u64,
    /// Bytes (0 is allowed; with `notify` it still notifies).
    pub len: u64,
    /// Notify the peer once the data is in place.
    pub notify: bool,
}

/// Why a put, or the receiving side of a connection, failed: the physical status and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Status of the physical completion (for puts that were never posted or were flushed,
    /// [`WcStatus::WrFlush`]).
    pub status: WcStatus,
    /// Which put, chunk and QP, and the first failure of the connection when this one
    /// follows from it.
    pub detail: String,
}

impl Failure {
    /// As the crate's error, naming the connection.
    pub fn into_error(self, conn: u32) -> Error {
        Error::Completion {
            conn,
            context: self.detail,
            status: self.status,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.detail, self.status)
    }
}

/// One per-put event of a [`VirtualCq`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualCompletion {
    /// The connection ([`VirtualQp::id`]).
    pub conn: u32,
    /// What happened.
    pub event: Event,
}

/// What happened on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A put completed at the sender (in posting order).
    PutDone {
        /// The put's `wr_id`.
        wr_id: u64,
        /// The put's number on the connection (0, 1, ...), as [`VirtualQp::put`] returned it.
        msg: u64,
        /// Its length.
        len: u64,
        /// The first failure among its chunks, if any.
        result: std::result::Result<(), Failure>,
    },
    /// The peer's notified put number `seq` (counting only notified puts, from 0) is in place.
    Notify {
        /// Running count of notifications on this connection.
        seq: u64,
    },
    /// The receiving side failed (a flushed receive, a refused sequence number); reported
    /// once.
    RecvFailed(Failure),
}
