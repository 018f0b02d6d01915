//! The crate's one error type: a variant per failed operation, with the context a person needs.

use std::time::Duration;

use crate::provider::WcStatus;

/// Result of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why libibverbs could not be used (kept in the process-wide loader, so it is `Clone`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// No candidate library could be opened.
    #[error("libibverbs not found: {tried}")]
    NotFound {
        /// Each path tried, with the loader's message.
        tried: String,
    },
    /// The library opened but lacks a symbol this crate needs.
    #[error("libibverbs at {path} lacks the required symbol {symbol}: {message}")]
    MissingSymbol {
        /// The library's path.
        path: String,
        /// The missing symbol.
        symbol: &'static str,
        /// The loader's message.
        message: String,
    },
}

/// One error of this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// libibverbs could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The library has no such function (an optional symbol, e.g. `ibv_reg_dmabuf_mr` before
    /// rdma-core 34).
    #[error("{symbol} is not provided by this libibverbs (too old?)")]
    Unsupported {
        /// The missing function.
        symbol: &'static str,
    },
    /// `ibv_get_device_list` failed.
    #[error("ibv_get_device_list failed: {source}")]
    GetDeviceList {
        /// errno.
        #[source]
        source: std::io::Error,
    },
    /// `ibv_open_device` failed.
    #[error("ibv_open_device({device}) failed: {source}")]
    OpenDevice {
        /// Device name.
        device: String,
        /// errno.
        #[source]
        source: std::io::Error,
    },
    /// `ibv_query_device` failed.
    #[error("ibv_query_device({device}) failed: {source}")]
    QueryDevice {
        /// Device name.
        device: String,
        /// errno.
        #[source]
        source: std::io::Error,
    },
    /// `ibv_query_port` failed.
    #[error("ibv_query_port({device}, port {port}) failed: {source}")]
    QueryPort {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// errno.
        #[source]
        source: std::io::Error,
    },
    /// `ibv_query_gid` failed.
    #[error("ibv_query_gid({device}, port {port}, index {index}) failed: {source}")]
    QueryGid {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// GID table index.
        index: u32,
        /// errno.
        #[source]
        source: std::io::Error,
    },
    /// `ibv_alloc_pd` failed.
    #[error("ibv_alloc_pd({device}) failed: {source}")]
    AllocPd {
        /// Device name.
        device: String,
        /// errno.
        #[source]
        source: std::io::Error,
    },
    /// `ibv_reg_mr` or `ibv_reg_dmabuf_mr` failed.
    #[error("{call}({device}, {len} bytes) failed: {source}")]
    RegMr {
        /// Which call.
        call: &'static str,
        /// Device name.
        device: String,
        /// Length of the region.
        len: usize,
        /// errno.
        #[source]
        source: std::io::Error,
    },
    /// `ibv_create_cq` failed.
    #[error("ibv_create_cq({device}, {cqe} entries) failed: {source}")]
    CreateCq {
        /// Device name.
        device: String,
        /// Entries asked for.
        cqe: u32,
        /// errno.
        #[source]
        source: std::io::Error,
    },
    /// `ibv_create_qp` failed.
    #[error("ibv_create_qp({device}) failed: {source}")]
    CreateQp {
        /// Device name.
        device: String,
        /// errno.
        #[source]
        source: std::io::Error,
    },
    /// `ibv_modify_qp` failed.
    #[error("ibv_modify_qp(qp {qp_num:#x}, to {to}) failed: {source}")]
    ModifyQp {
        /// The QP's number.
        qp_num: u32,
        /// Target state.
        to: &'static str,
        /// errno.
        #[source]
        source: std::io::Error,
    },
    /// Posting a send work request failed.
    #[error("post_send(qp {qp_num:#x}) failed: {source}")]
    PostSend {
        /// The QP's number.
        qp_num: u32,
        /// errno.
        #[source]
        source: std::io::Error,
    },
    /// Posting a receive work request failed.
    #[error("post_recv(qp {qp_num:#x}) failed: {source}")]
    PostRecv {
        /// The QP's number.
        qp_num: u32,
        /// errno.
        #[source]
        source: std::io::Error,
    },
    /// Polling a completion queue failed.
    #[error("poll_cq failed: {source}")]
    PollCq {
        /// errno.
        #[source]
        source: std::io::Error,
    },
    /// A byte string is not a serialised endpoint.
    #[error("bad queue pair endpoint ({len} bytes): {reason}")]
    BadEndpoint {
        /// Length of the input.
        len: usize,
        /// What is wrong.
        reason: String,
    },
    /// An HCA list (`CTRAN_IB_HCA`) does not parse.
    #[error("bad HCA list {spec:?}: {reason}")]
    BadHcaSpec {
        /// The text.
        spec: String,
        /// What is wrong.
        reason: String,
    },
    /// A configuration value is out of range.
    #[error("bad ibverbx configuration: {0}")]
    BadConfig(String),
    /// A put names bytes outside its local or remote region.
    #[error("put of {len} bytes at local offset {local_offset} (region {local_len} bytes) to remote offset {remote_offset} (region {remote_len} bytes) is out of bounds")]
    OutOfBounds {
        /// Length of the put.
        len: u64,
        /// Offset in the local region.
        local_offset: u64,
        /// Length of the local region.
        local_len: u64,
        /// Offset in the remote region.
        remote_offset: u64,
        /// Length of the remote region.
        remote_len: u64,
    },
    /// A physical work request failed, or the connection is unusable since one did.
    #[error("connection {conn}: {context}: {status}")]
    Completion {
        /// The virtual connection.
        conn: u32,
        /// Which message, chunk and queue pair.
        context: String,
        /// The physical completion's status.
        status: WcStatus,
    },
    /// The software provider's peer is gone (its queue pair was destroyed).
    #[error("{0}")]
    Soft(String),
    /// A wait ran past its deadline.
    #[error("{what} timed out after {waited:?}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        waited: Duration,
    },
    /// The configuration (cvars) could not be read.
    #[error(transparent)]
    Cvars(#[from] torchcomms_cvars::Error),
}

/// The calling thread's `errno` as an I/O error (rdma-core sets it on failure).
pub(crate) fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// A positive return code of a verbs call as an I/O error (verbs calls return the errno).
pub(crate) fn rc_error(rc: i32) -> std::io::Error {
    if rc > 0 {
        std::io::Error::from_raw_os_error(rc)
    } else {
        std::io::Error::last_os_error()
    }
}
