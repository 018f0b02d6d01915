//! Errors of the `nccl` backend, each mapped once to the API's [`torchcomms::Error`].

use std::time::Duration;

use torchcomms::ErrorKind;
use torchcomms_cuda::CudaError;

pub use crate::gpu::GpuError;
use torchcomms_hip::HipError;

/// What can go wrong in the `nccl` backend.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NcclError {
    /// The NCCL library could not be found or loaded.
    #[error("NCCL is not available: {0} (set NCCL_LIB_PATH to libnccl.so.2 or its folder)")]
    Load(#[source] Box<CudaError>),
    /// The RCCL library (ROCm) could not be found or loaded (the `rccl` backend).
    #[error("RCCL is not available: {0} (install ROCm's RCCL, or set RCCL_LIB_PATH to librccl.so.1 or its folder)")]
    RcclLoad(#[source] Box<torchcomms_hip::HipError>),
    /// A required symbol is missing from the library.
    #[error("{path} lacks {name}: {reason}")]
    Symbol {
        /// The symbol.
        name: &'static str,
        /// The library.
        path: String,
        /// The loader's message.
        reason: String,
    },
    /// An NCCL call failed.
    #[error("{call} failed on rank {rank} of communicator `{comm}`: {message}")]
    Call {
        /// The call (`ncclAllReduce`).
        call: &'static str,
        /// This rank.
        rank: usize,
        /// Communicator name.
        comm: String,
        /// NCCL's text and last error.
        message: String,
    },
    /// A CUDA or HIP call failed.
    #[error("{op} on rank {rank} of communicator `{comm}`: {source}")]
    Gpu {
        /// The operation.
        op: String,
        /// This rank.
        rank: usize,
        /// Communicator name.
        comm: String,
        /// The runtime's error.
        #[source]
        source: Box<GpuError>,
    },
    /// An operation did not complete before its deadline; the communicator was aborted.
    #[error("{op} (seq {seq}) on rank {rank} of communicator `{comm}` did not complete within {timeout:?}; the communicator was aborted (ncclCommAbort)")]
    Timeout {
        /// The operation.
        op: String,
        /// Sequence number on the communicator.
        seq: u64,
        /// This rank.
        rank: usize,
        /// Communicator name.
        comm: String,
        /// The operation's timeout.
        timeout: Duration,
    },
    /// The communicator was aborted (by its owner, a failure, or another rank).
    #[error("communicator `{comm}` was aborted on rank {rank}: {reason}")]
    Aborted {
        /// Communicator name.
        comm: String,
        /// This rank.
        rank: usize,
        /// Why.
        reason: String,
    },
    /// Bootstrap through the store failed.
    #[error("bootstrap of communicator `{comm}` (rank {rank}): {source}")]
    Bootstrap {
        /// Communicator name.
        comm: String,
        /// This rank.
        rank: usize,
        /// The store's error.
        #[source]
        source: Box<torchcomms_core::Error>,
    },
    /// Something this backend does not do.
    #[error("nccl backend: {0}")]
    NotSupported(String),
    /// A bad argument.
    #[error("nccl backend: invalid argument `{arg}`: expected {expected}, got {got}")]
    InvalidArgument {
        /// The argument.
        arg: String,
        /// What was expected.
        expected: String,
        /// What came.
        got: String,
    },
}

impl NcclError {
    /// How API callers should treat it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            NcclError::Timeout { .. } => ErrorKind::Timeout,
            NcclError::Load(_)
            | NcclError::RcclLoad(_)
            | NcclError::Symbol { .. }
            | NcclError::NotSupported(_) => ErrorKind::NotSupported,
            // No ROCm, or no AMD GPU (the rccl backend cannot run here), or the other runtime.
            NcclError::Gpu { source, .. }
                if matches!(
                    **source,
                    GpuError::Hip(HipError::LibraryNotFound { .. } | HipError::NoDevice { .. })
                        | GpuError::Platform { .. }
                ) =>
            {
                ErrorKind::NotSupported
            }
            NcclError::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            NcclError::Bootstrap { source, .. } if source.is_timeout() => ErrorKind::Timeout,
            _ => ErrorKind::Communication,
        }
    }
}

impl From<NcclError> for torchcomms::Error {
    fn from(e: NcclError) -> Self {
        let backend = match &e {
            NcclError::RcclLoad(_) => "rccl",
            NcclError::Gpu { source, .. }
                if matches!(
                    **source,
                    GpuError::Hip(_) | GpuError::Platform { vendor: "rccl", .. }
                ) =>
            {
                "rccl"
            }
            _ => "nccl",
        };
        torchcomms::Error::Backend {
            backend: backend.into(),
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}
