//! # torchcomms-c
//!
//! The C API of torchcomms-rs: `libtorchcomms_c.so` / `libtorchcomms_c.a` and the header
//! `include/torchcomms.h` (generated from [`ffi`] by cbindgen; a test fails when it drifts).
//!
//! ```c
//! #include <torchcomms.h>
//! tc_comm_t *comm = NULL;
//! // Rank and size from torchrun/SLURM/MPI variables, the store from MASTER_ADDR/MASTER_PORT.
//! if (tc_comm_create_from_env("ctran", (tc_device_t){TC_DEVICE_CPU, 0}, "world", NULL, &comm))
//!     fprintf(stderr, "%s\n", tc_last_error());
//! float x[4] = {1, 2, 3, 4};
//! tc_all_reduce(comm, tc_cpu_tensor(x, 4, TC_FLOAT32), TC_SUM, NULL, NULL, NULL);
//! tc_comm_finalize(comm);
//! tc_comm_destroy(comm);
//! ```
//!
//! The same entry points are callable from Rust (that is how this crate tests itself):
//!
//! ```
//! use std::ffi::{c_char, CStr};
//! use torchcomms_c::ffi::{tc_backends, tc_version};
//! use torchcomms_c::tc_status_t;
//!
//! let mut v: *const c_char = std::ptr::null();
//! // SAFETY: `v` is a valid place for the result.
//! assert_eq!(unsafe { tc_version(&mut v) }, tc_status_t::TC_OK);
//! // SAFETY: tc_version stored a static NUL-terminated string.
//! assert_eq!(unsafe { CStr::from_ptr(v) }.to_str(), Ok(env!("CARGO_PKG_VERSION")));
//! let mut names: *const c_char = std::ptr::null();
//! // SAFETY: as above.
//! assert_eq!(unsafe { tc_backends(&mut names) }, tc_status_t::TC_OK);
//! // SAFETY: tc_backends stored a static NUL-terminated string.
//! assert!(unsafe { CStr::from_ptr(names) }.to_str().unwrap().contains("ctran"));
//! ```
//!
//! ## Contract
//! - Every function returns a `tc_status_t` (except `tc_last_error`, `tc_status_string` and the
//!   `tc_cpu_tensor` value constructor); on an error, `tc_last_error()` gives the calling
//!   thread's message until its next call. No panic crosses the boundary.
//! - Buffers belong to the caller, who keeps them valid until the operation completes (for
//!   asynchronous work: until `tc_work_wait` returns or `tc_work_test` reports completion).
//! - Handles may be used from several threads at once, except that `*_destroy`/`*_free` must
//!   not race with other uses of the same handle.
//! - CUDA communicators take device buffers and the `cudaStream_t` each operation follows
//!   (NULL: the legacy default stream); a synchronous call and `tc_work_wait` order that stream
//!   after the operation. A CPU communicator rejects a non-NULL stream.
//!
//! All `unsafe` code (raw pointers from C) lives in [`ffi`]; the rest is safe.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod ffi;
pub mod handles;
pub mod status;
pub mod types;

pub use handles::{tc_all_gather_p_t, tc_comm_t, tc_store_t, tc_work_t};
pub use status::tc_status_t;
pub use types::*;

/// Transports the engine of this build can use (the socket transport today).
pub const TRANSPORTS: &[&str] = torchcomms_ctran::TRANSPORTS;

/// Registers the backends this library links, by reference rather than only through link-time
/// registration: a program linking the static library keeps only the objects it references,
/// which can leave out the `inventory` constructor of the ctran backend.
pub(crate) fn ensure_backends() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if !torchcomms::is_backend_registered("ctran") {
            torchcomms::register_backend(
                "ctran",
                std::sync::Arc::new(torchcomms_ctran::CtranBackend::create),
            );
        }
    });
}
