//! What a virtual queue pair needs from a transport: the provider traits, implemented by real
//! verbs ([`crate::verbs`]) and by the in-process software fabric ([`crate::soft`]), and the
//! plain data that crosses them (keys, write requests, completions).

use std::fmt;

use crate::error::{Error, Result};

/// Where a local work request reads: a registered region's address, length and lkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalKey {
    /// Start address (as the NIC sees it).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Local key.
    pub lkey: u32,
}

/// Where a peer may write: a registered region's address, length and rkey. Serialisable, to
/// travel through a key-value store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteKey {
    /// Start address (as the peer's NIC sees it).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

impl RemoteKey {
    /// Encoded length.
    pub const BYTES: usize = 20;

    /// Little-endian `addr, len, rkey`.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// Inverse of [`RemoteKey::to_bytes`].
    pub fn from_bytes(b: &[u8]) -> Result<RemoteKey> {
        let b: &[u8; Self::BYTES] = b.try_into().map_err(|_| Error::BadEndpoint {
            len: b.len(),
            reason: format!("a remote key is {} bytes", Self::BYTES),
        })?;
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        Ok(RemoteKey {
            addr: u64_at(0),
            len: u64_at(8),
            rkey: u32::from_le_bytes([b[16], b[17], b[18], b[19]]),
        })
    }
}

/// Which way the bytes of a work request move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RdmaOp {
    /// RDMA write: local to remote (with immediate data when the request has some).
    #[default]
    Write,
    /// RDMA read: remote to local (never with immediate data).
    Read,
}

/// One RDMA write (with immediate data when `imm` is set) or read, always signaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkRequest {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Write or read.
    pub op: RdmaOp,
    /// Local address: a write's source, a read's destination.
    pub local_addr: u64,
    /// Local key of that range.
    pub lkey: u32,
    /// Bytes (0 is allowed: a pure notification).
    pub len: u32,
    /// Remote address: a write's destination, a read's source.
    pub remote_addr: u64,
    /// Remote key of that range.
    pub rkey: u32,
    /// Immediate data: the write consumes a receive at the peer and completes it with this.
    pub imm: Option<u32>,
}

/// Status of a work completion (`enum ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WcStatus {
    /// Done.
    Success,
    /// Local length error.
    LocalLength,
    /// Local QP operation error.
    LocalQpOp,
    /// Local protection error (bad lkey or address).
    LocalProtection,
    /// Flushed: the QP went to the error state before this request ran.
    WrFlush,
    /// Local access error.
    LocalAccess,
    /// Remote invalid request.
    RemoteInvalidRequest,
    /// Remote access error (bad rkey or address at the peer).
    RemoteAccess,
    /// Remote operation error.
    RemoteOp,
    /// Transport retries exceeded (the peer did not answer).
    RetryExceeded,
    /// Receiver-not-ready retries exceeded.
    RnrRetryExceeded,
    /// Fatal error.
    Fatal,
    /// General error.
    General,
    /// Another status.
    Other {
        /// `ibv_wc_status` value.
        status: i32,
        /// Vendor syndrome.
        vendor_err: u32,
    },
}

impl WcStatus {
    /// From `ibv_wc.status` (and its vendor syndrome).
    pub fn from_raw(status: i32, vendor_err: u32) -> WcStatus {
        use crate::sys::*;
        match status {
            IBV_WC_SUCCESS => WcStatus::Success,
            IBV_WC_LOC_LEN_ERR => WcStatus::LocalLength,
            IBV_WC_LOC_QP_OP_ERR => WcStatus::LocalQpOp,
            IBV_WC_LOC_PROT_ERR => WcStatus::LocalProtection,
            IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlush,
            IBV_WC_LOC_ACCESS_ERR => WcStatus::LocalAccess,
            IBV_WC_REM_INV_REQ_ERR => WcStatus::RemoteInvalidRequest,
            IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccess,
            IBV_WC_REM_OP_ERR => WcStatus::RemoteOp,
            IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExceeded,
            IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExceeded,
            IBV_WC_FATAL_ERR => WcStatus::Fatal,
            IBV_WC_GENERAL_ERR => WcStatus::General,
            status => WcStatus::Other { status, vendor_err },
        }
    }

    /// Whether the request succeeded.
    pub fn is_ok(self) -> bool {
        self == WcStatus::Success
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            WcStatus::Success => "success",
            WcStatus::LocalLength => "local length error",
            WcStatus::LocalQpOp => "local QP operation error",
            WcStatus::LocalProtection => "local protection error",
            WcStatus::WrFlush => "work request flushed",
            WcStatus::LocalAccess => "local access error",
            WcStatus::RemoteInvalidRequest => "remote invalid request",
            WcStatus::RemoteAccess => "remote access error",
            WcStatus::RemoteOp => "remote operation error",
            WcStatus::RetryExceeded => "transport retry counter exceeded",
            WcStatus::RnrRetryExceeded => "RNR retry counter exceeded",
            WcStatus::Fatal => "fatal error",
            WcStatus::General => "general error",
            WcStatus::Other { status, vendor_err } => {
                return write!(f, "status {status} (vendor error {vendor_err:#x})")
            }
        };
        f.write_str(s)
    }
}

/// Opcode of a work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    /// An RDMA write (with or without immediate) finished at the sender.
    RdmaWrite,
    /// An RDMA read finished at the requester (the bytes are in its memory).
    RdmaRead,
    /// A receive consumed by an RDMA write with immediate.
    RecvRdmaWithImm,
    /// A receive consumed by a send (or a flushed receive).
    Recv,
    /// Anything else (`ibv_wc_opcode` value).
    Other(i32),
}

/// One work completion, provider-neutral.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The request's id.
    pub wr_id: u64,
    /// Number of the QP it ran on.
    pub qp_num: u32,
    /// Outcome.
    pub status: WcStatus,
    /// What finished (meaningful on success; flushed receives say [`WcOpcode::Recv`]).
    pub opcode: WcOpcode,
    /// Bytes received (receive completions).
    pub byte_len: u32,
    /// Immediate data, in host order.
    pub imm: Option<u32>,
}

/// The send and receive side of one connected (RC) physical queue pair.
pub trait QpOps: Send {
    /// The QP's number (unique per device; completions name it).
    fn qp_num(&self) -> u32;
    /// Posts one signaled RDMA write (with immediate data when `wr.imm` is set) or read.
    fn post_send(&mut self, wr: &WorkRequest) -> Result<()>;
    /// Posts several requests; the default posts them one by one (verbs chains them).
    fn post_sends(&mut self, wrs: &[WorkRequest]) -> Result<()> {
        wrs.iter().try_for_each(|w| self.post_send(w))
    }
    /// Posts a zero-length receive, consumed by the peer's next write with immediate.
    fn post_recv(&mut self, wr_id: u64) -> Result<()>;
}

/// A completion queue.
pub trait CqOps: Send {
    /// Appends at most `max` completions to `out`; returns how many. Never blocks.
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize>;
}

/// A family of queue pair and completion queue types that work together.
pub trait Provider: 'static {
    /// Connected queue pair.
    type Qp: QpOps;
    /// Completion queue its completions go to.
    type Cq: CqOps;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_key_round_trips() {
        let k = RemoteKey {
            addr: 0x7f00_1234_5678,
            len: 1 << 33,
            rkey: 0xdead_beef,
        };
        assert_eq!(RemoteKey::from_bytes(&k.to_bytes()).unwrap(), k);
        assert!(RemoteKey::from_bytes(&[0; 3]).is_err());
    }
}
