//! The `extern "C"` entry points: the only module with `unsafe` code. Each entry point runs its
//! body in [`guard`] (no panic crosses into C; errors become a status code and the thread's
//! last error), turns raw pointers into references or values through the checked helpers at
//! the top of this file, and calls the safe TorchComm API.
//!
//! Conventions of every function: handles and out-pointers must not be NULL (else
//! `TC_ERR_INVALID_ARGUMENT`); strings are NUL-terminated UTF-8; `options` may be NULL for the
//! defaults; `stream` must be NULL for CPU buffers; `work` NULL means "synchronous: return once
//! the operation completed", non-NULL means "asynchronous: return once it is queued and store a
//! work handle in `*work`" (set to NULL first, so it is NULL on every error).
//!
//! | file | entry points |
//! |---|---|
//! | `library.rs` | errors, versions, features, value constructors and option defaults |
//! | `store.rs` | `tc_store_*` |
//! | `comm.rs` | `tc_comm_*`, `tc_work_*` |
//! | `ops.rs` | the operations: one per row of the table of operations, and `tc_batch_p2p` |
//! | `window.rs` | `tc_window_*`: one-sided windows |
//! | `reconfigure.rs` | `tc_reconfigurer_*`: new communicators from members' init handles |
//! | `args.rs` | the checked conversions of raw pointers every entry point uses |

// In the order of the header (cbindgen writes items in the order it reads them).
mod args;
mod comm;
mod library;
mod ops;
mod reconfigure;
mod store;
mod window;

pub use comm::*;
pub use library::*;
pub use ops::*;
pub use reconfigure::*;
pub use store::*;
pub use window::*;
