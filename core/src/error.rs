//! The error type every layer shares: one variant per way an operation can fail, each carrying what a
//! person needs to find the cause (op, sequence number, rank, peer).

use std::io;
use std::sync::Arc;
use std::time::Duration;

/// Result alias used throughout the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of communication, shared by every layer (the engine, the backends, the bindings). Cheap to clone, so a failed communicator can hand the error that
/// broke it to every later caller.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A caller passed a value the operation cannot accept.
    #[error("invalid argument `{arg}`: expected {expected}, got {got}")]
    InvalidArgument {
        /// Name of the argument.
        arg: String,
        /// What was expected.
        expected: String,
        /// What was passed.
        got: String,
    },
    /// An operation did not complete before its deadline.
    #[error("{op} (seq {seq}) timed out after {timeout:?} on rank {rank}{}", peer_suffix(*.peer))]
    Timeout {
        /// Operation name.
        op: String,
        /// Sequence number of the operation on its communicator.
        seq: u64,
        /// Rank that timed out.
        rank: usize,
        /// The peer this rank was waiting for, if known.
        peer: Option<usize>,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// A peer closed its connection or failed while this rank depended on it.
    #[error("{op} (seq {seq}) on rank {rank}: lost peer {peer}: {reason}")]
    PeerLost {
        /// Operation name.
        op: String,
        /// Sequence number of the operation on its communicator.
        seq: u64,
        /// Rank that saw the loss.
        rank: usize,
        /// The peer that was lost.
        peer: usize,
        /// What happened (closed, reset, protocol error).
        reason: String,
    },
    /// The communicator failed earlier or was aborted; it refuses new work.
    #[error("communicator `{comm}` is unusable: {cause}")]
    CommFailed {
        /// Communicator name.
        comm: String,
        /// The error that broke it.
        cause: Box<Error>,
    },
    /// The communicator was aborted by its owner.
    #[error("communicator `{comm}` was aborted: {reason}")]
    Aborted {
        /// Communicator name.
        comm: String,
        /// Why.
        reason: String,
    },
    /// The communicator was finalized.
    #[error("{op} on communicator `{comm}` after finalize()")]
    Finalized {
        /// The operation attempted.
        op: String,
        /// Communicator name.
        comm: String,
    },
    /// The peers disagree about an operation (size, type), seen on the wire.
    #[error("{op} (seq {seq}) on rank {rank}: mismatch with peer {peer}: {detail}")]
    Mismatch {
        /// Operation name.
        op: String,
        /// Sequence number.
        seq: u64,
        /// This rank.
        rank: usize,
        /// The peer that disagrees.
        peer: usize,
        /// What differs.
        detail: String,
    },
    /// A store operation failed.
    #[error("store {op} `{key}` failed: {reason}")]
    Store {
        /// Store operation (get, set, wait, ...).
        op: &'static str,
        /// Key involved.
        key: String,
        /// Why.
        reason: String,
    },
    /// Setting up the communicator failed.
    #[error("bootstrap of communicator `{comm}` failed: {reason}")]
    Bootstrap {
        /// Communicator name.
        comm: String,
        /// Why.
        reason: String,
    },
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The requested feature is not available in this build or on this machine.
    #[error("{0} is not supported")]
    NotSupported(String),
    /// A CUDA call of the GPU path failed.
    #[error("{op} on rank {rank}: CUDA: {detail}")]
    Cuda {
        /// The operation.
        op: String,
        /// This rank.
        rank: usize,
        /// The failed call and the driver's message.
        detail: String,
    },
}

fn peer_suffix(peer: Option<usize>) -> String {
    match peer {
        Some(p) => format!(" waiting for peer {p}"),
        None => String::new(),
    }
}

impl Error {
    /// An [`Error::InvalidArgument`] naming the argument, what was expected and what was given.
    pub fn invalid(
        arg: impl Into<String>,
        expected: impl Into<String>,
        got: impl ToString,
    ) -> Self {
        Error::InvalidArgument {
            arg: arg.into(),
            expected: expected.into(),
            got: got.to_string(),
        }
    }

    /// An [`Error::Io`] with context.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source: Arc::new(source),
        }
    }

    /// True for errors caused by the caller's arguments (they leave the communicator usable).
    pub fn is_invalid_argument(&self) -> bool {
        matches!(self, Error::InvalidArgument { .. })
    }

    /// True for timeouts, also when wrapped in [`Error::CommFailed`].
    pub fn is_timeout(&self) -> bool {
        match self {
            Error::Timeout { .. } => true,
            Error::CommFailed { cause, .. } => cause.is_timeout(),
            _ => false,
        }
    }
}
