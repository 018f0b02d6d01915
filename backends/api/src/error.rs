//! Errors of the TorchComm API. Engine errors pass through unchanged; [`Error::kind`] gives the
//! one classification bindings map to their own exception types.

use std::time::Duration;

/// Result alias of the API.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How callers should treat an error; bindings map each kind once (Python: `ValueError`,
/// `TimeoutError`, `RuntimeError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller passed something wrong; the communicator is still usable.
    InvalidArgument,
    /// A deadline passed.
    Timeout,
    /// A peer was lost, the communicator failed or was aborted or finalized.
    Communication,
    /// Not available in this backend or build.
    NotSupported,
}

/// Errors of the TorchComm API.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A bad argument to an operation.
    #[error("{op}: invalid argument `{arg}`: expected {expected}, got {got}")]
    InvalidArgument {
        /// The operation.
        op: String,
        /// The argument.
        arg: String,
        /// What was expected.
        expected: String,
        /// What was passed.
        got: String,
    },
    /// An operation on a finalized communicator.
    #[error("{op} on communicator `{comm}` after finalize()")]
    Finalized {
        /// The operation.
        op: String,
        /// Communicator name.
        comm: String,
    },
    /// Waiting for work took longer than allowed.
    #[error("{op} on rank {rank} did not complete within {timeout:?}")]
    WaitTimeout {
        /// The operation.
        op: String,
        /// This rank.
        rank: usize,
        /// How long the caller waited.
        timeout: Duration,
    },
    /// No backend of this name is registered.
    #[error("unknown backend `{name}`; registered backends: {known}")]
    UnknownBackend {
        /// The name asked for.
        name: String,
        /// The names available.
        known: String,
    },
    /// The backend does not implement this.
    #[error("[TorchCommBackend]: {what} not implemented for communicator:{comm}")]
    NotImplemented {
        /// What was asked for.
        what: String,
        /// Communicator name.
        comm: String,
    },
    /// An error of the communication layer (the kinds engines share: timeout, lost peer...).
    #[error(transparent)]
    Engine(#[from] torchcomms_core::Error),
    /// An error from another backend.
    #[error("{backend}: {message}")]
    Backend {
        /// Backend name.
        backend: String,
        /// What it said.
        message: String,
        /// How to treat it.
        kind: ErrorKind,
    },
}

impl Error {
    /// An [`Error::InvalidArgument`].
    pub fn invalid(op: &str, arg: &str, expected: impl Into<String>, got: impl ToString) -> Error {
        Error::InvalidArgument {
            op: op.into(),
            arg: arg.into(),
            expected: expected.into(),
            got: got.to_string(),
        }
    }

    /// How callers should treat this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument { .. } | Error::UnknownBackend { .. } => {
                ErrorKind::InvalidArgument
            }
            Error::WaitTimeout { .. } => ErrorKind::Timeout,
            Error::Finalized { .. } => ErrorKind::Communication,
            Error::NotImplemented { .. } => ErrorKind::NotSupported,
            Error::Backend { kind, .. } => *kind,
            Error::Engine(e) => match e {
                torchcomms_core::Error::InvalidArgument { .. } => ErrorKind::InvalidArgument,
                torchcomms_core::Error::NotSupported(_) => ErrorKind::NotSupported,
                e if e.is_timeout() => ErrorKind::Timeout,
                _ => ErrorKind::Communication,
            },
        }
    }
}
