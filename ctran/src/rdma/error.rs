//! The one error type of the RDMA transfer API: a variant per thing that can go wrong, with
//! the context (sizes, peer, registration) a person needs to act on it.

use std::time::Duration;

/// What failed in [`super`]: registering, parsing a key or URL, connecting, a transfer.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RdmaError {
    /// A caller passed something unusable (a view beyond its memory, an empty range...).
    #[error("invalid argument `{arg}`: {detail}")]
    InvalidArgument {
        /// The argument's name.
        arg: &'static str,
        /// What was wrong and what was expected.
        detail: String,
    },
    /// An access key that does not parse.
    #[error("malformed access key: {0}")]
    MalformedKey(String),
    /// A peer URL that does not parse.
    #[error("malformed peer URL: {0}")]
    MalformedUrl(String),
    /// The key names a registration of another process (or of an earlier run of this pid).
    #[error("access key belongs to another process (key: pid {key_pid}, this process: pid {pid}, or a restarted process with the same pid)")]
    ForeignKey {
        /// The pid the key names.
        key_pid: u32,
        /// This process.
        pid: u32,
    },
    /// No live registration with the key's id (never existed, or deregistered).
    #[error("registration {id} is unknown or was deregistered")]
    UnknownRegistration {
        /// The key's registration id.
        id: u64,
    },
    /// The key's generation is not the registration's (its memory was deregistered and the id
    /// reused, or the key was forged).
    #[error("stale access key for registration {id}: generation {key} != {current}")]
    StaleKey {
        /// Registration id.
        id: u64,
        /// The key's generation.
        key: u64,
        /// The live registration's.
        current: u64,
    },
    /// The requested range is not inside the registration.
    #[error("out of bounds: {len} bytes at {addr:#x} are not inside registration {id} ({reg_len} bytes at {reg_addr:#x})")]
    OutOfBounds {
        /// Registration id.
        id: u64,
        /// Requested start.
        addr: u64,
        /// Requested length.
        len: u64,
        /// Registered start.
        reg_addr: u64,
        /// Registered length.
        reg_len: u64,
    },
    /// The two ends' lengths differ.
    #[error("length mismatch: local view has {local} bytes, remote buffer {remote}")]
    LengthMismatch {
        /// The local view's length.
        local: u64,
        /// The remote buffer's length.
        remote: u64,
    },
    /// `connect`/`write`/`read` before the step they need (bind, connect).
    #[error("{op}: {detail}")]
    State {
        /// The call.
        op: &'static str,
        /// What is missing.
        detail: String,
    },
    /// Setting up or using the TCP connection failed.
    #[error("{op} with peer {peer}: {detail}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The peer's URL (or address).
        peer: String,
        /// The OS error or protocol problem.
        detail: String,
    },
    /// The connection is gone (EOF, reset, closed by drop).
    #[error("connection to peer {peer} is closed: {detail}")]
    Disconnected {
        /// The peer's URL.
        peer: String,
        /// Why.
        detail: String,
    },
    /// A deadline passed.
    #[error("{op} timed out after {after:?} (peer {peer})")]
    Timeout {
        /// The call.
        op: &'static str,
        /// The limit.
        after: Duration,
        /// The peer's URL.
        peer: String,
    },
    /// The peer refused the request (its validation failed); the text is the peer's error.
    #[error("peer {peer} rejected {op}: {detail}")]
    Remote {
        /// The call.
        op: &'static str,
        /// The peer's URL.
        peer: String,
        /// The peer's error message.
        detail: String,
    },
    /// A CUDA call failed.
    #[error("CUDA: {0}")]
    Cuda(String),
    /// Cross-memory attach failed for another reason than permissions.
    #[error("cross-memory attach with pid {pid}: {detail}")]
    Cma {
        /// The other process.
        pid: u32,
        /// The OS error.
        detail: String,
    },
    /// The configuration (cvars) is invalid.
    #[error("configuration: {0}")]
    Config(String),
}

impl RdmaError {
    /// Whether the caller passed bad input (Python raises ValueError for these).
    pub fn is_invalid_argument(&self) -> bool {
        matches!(
            self,
            RdmaError::InvalidArgument { .. }
                | RdmaError::MalformedKey(_)
                | RdmaError::MalformedUrl(_)
                | RdmaError::LengthMismatch { .. }
        )
    }

    /// Whether this is a missed deadline.
    pub fn is_timeout(&self) -> bool {
        matches!(self, RdmaError::Timeout { .. })
    }
}

impl From<torchcomms_cuda::CudaError> for RdmaError {
    fn from(e: torchcomms_cuda::CudaError) -> Self {
        RdmaError::Cuda(e.to_string())
    }
}

/// Results of this module.
pub type Result<T> = std::result::Result<T, RdmaError>;
