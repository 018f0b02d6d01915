//! The opaque handles C holds pointers to. Each owns what it needs: a communicator keeps the
//! store it was created from (so the store's server outlives the bootstrap), a work handle
//! keeps the operation's result. C sees only `typedef struct tc_comm_t tc_comm_t;`.

#![allow(non_camel_case_types)]

use std::ffi::CString;
use std::sync::{Arc, OnceLock};

use torchcomms::{AllGatherP, Reconfigurer, TorchComm, Window, Work};
use torchcomms_core::bootstrap::tcp_store::TcpStore;

/// A communicator (from `tc_comm_create`, `tc_comm_create_from_env` or `tc_comm_split`);
/// release it with `tc_comm_destroy`.
#[derive(Debug)]
pub struct tc_comm_t {
    pub(crate) comm: TorchComm,
    /// NUL-terminated copies for the accessors, valid as long as the handle.
    pub(crate) name: CString,
    pub(crate) backend: CString,
    pub(crate) backend_version: OnceLock<CString>,
    /// The store the communicator bootstrapped through, kept alive with it.
    pub(crate) _store: Option<Arc<TcpStore>>,
}

impl tc_comm_t {
    pub(crate) fn new(comm: TorchComm, store: Option<Arc<TcpStore>>) -> tc_comm_t {
        tc_comm_t {
            name: c_string(comm.get_name()),
            backend: c_string(comm.get_backend()),
            backend_version: OnceLock::new(),
            comm,
            _store: store,
        }
    }
}

/// Asynchronous work (from an operation given a non-NULL `work` pointer); release it with
/// `tc_work_free`.
#[derive(Debug)]
pub struct tc_work_t {
    pub(crate) work: Work,
}

/// A persistent all-gather (from `tc_all_gather_p_init`): the output every
/// `tc_all_gather_p_exec` fills; release it with `tc_all_gather_p_free`.
#[derive(Debug)]
pub struct tc_all_gather_p_t {
    pub(crate) handle: AllGatherP,
}

/// A one-sided window (from `tc_window_create`); release it with `tc_window_destroy`.
#[derive(Debug)]
pub struct tc_window_t {
    pub(crate) window: Window,
    /// Ranks of its communicator (for checking rank arguments).
    pub(crate) size: usize,
    /// Its communicator's device (whether operations take a stream).
    pub(crate) device: torchcomms::Device,
}

/// What a process needs to take part in reconfigurations (from `tc_reconfigurer_create`);
/// release it with `tc_reconfigurer_destroy`.
#[derive(Debug)]
pub struct tc_reconfigurer_t {
    pub(crate) reconfigurer: Reconfigurer,
    /// This process's init handle, NUL-terminated.
    pub(crate) handle: CString,
    /// The store members meet through, kept alive with the handle.
    pub(crate) store: Option<Arc<TcpStore>>,
}

impl tc_reconfigurer_t {
    pub(crate) fn new(reconfigurer: Reconfigurer, store: Option<Arc<TcpStore>>) -> Self {
        tc_reconfigurer_t {
            handle: c_string(reconfigurer.init_handle()),
            reconfigurer,
            store,
        }
    }
}

/// A TCP key-value store (torch.distributed.TCPStore wire protocol) ranks bootstrap through;
/// release it with `tc_store_destroy`.
#[derive(Debug)]
pub struct tc_store_t {
    pub(crate) store: Arc<TcpStore>,
}

/// A C string of `s`, with interior NULs shown as `\0` instead of cutting it short.
pub(crate) fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}
