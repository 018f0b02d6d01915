//! Status codes, the thread's last error message, and the guard every entry point runs in: it
//! clears the last error, catches panics, and turns errors into a status code plus a message.
//! Each error source maps to a status once, here ([`From`] impls), never at call sites.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use torchcomms::ErrorKind;

/// What a call of the C API returned. `TC_OK` (0) is success; every other value is an error
/// whose message `tc_last_error()` gives on the same thread.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tc_status_t {
    /// Success.
    TC_OK = 0,
    /// A bad argument: a NULL handle or pointer, an unknown dtype, reduce op or device, a rank
    /// out of range, mismatched sizes. The communicator is still usable.
    TC_ERR_INVALID_ARGUMENT = 1,
    /// A deadline passed (the operation's timeout, or the timeout given to `tc_work_wait`).
    TC_ERR_TIMEOUT = 2,
    /// A peer was lost, or the communicator failed, was aborted or was finalized.
    TC_ERR_COMMUNICATION = 3,
    /// Not available in this build or backend (CUDA buffers and streams today).
    TC_ERR_NOT_SUPPORTED = 4,
    /// A bug in the library (a caught panic); the message says where.
    TC_ERR_INTERNAL = 5,
}

impl tc_status_t {
    /// A short, static, NUL-terminated description.
    pub(crate) fn describe(self) -> &'static std::ffi::CStr {
        match self {
            tc_status_t::TC_OK => c"success",
            tc_status_t::TC_ERR_INVALID_ARGUMENT => c"invalid argument",
            tc_status_t::TC_ERR_TIMEOUT => c"timeout",
            tc_status_t::TC_ERR_COMMUNICATION => c"communication error",
            tc_status_t::TC_ERR_NOT_SUPPORTED => c"not supported",
            tc_status_t::TC_ERR_INTERNAL => c"internal error",
        }
    }
}

impl From<ErrorKind> for tc_status_t {
    fn from(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::InvalidArgument => tc_status_t::TC_ERR_INVALID_ARGUMENT,
            ErrorKind::Timeout => tc_status_t::TC_ERR_TIMEOUT,
            ErrorKind::Communication => tc_status_t::TC_ERR_COMMUNICATION,
            ErrorKind::NotSupported => tc_status_t::TC_ERR_NOT_SUPPORTED,
        }
    }
}

/// An error on its way to C: the status to return and the message for `tc_last_error()`.
#[derive(Debug, Clone)]
pub(crate) struct CError {
    pub(crate) status: tc_status_t,
    pub(crate) message: String,
}

impl fmt::Display for CError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl CError {
    /// A bad argument of C function `func`, worded like the API's own argument errors.
    pub(crate) fn invalid(
        func: &str,
        arg: &str,
        expected: impl fmt::Display,
        got: impl fmt::Display,
    ) -> CError {
        CError {
            status: tc_status_t::TC_ERR_INVALID_ARGUMENT,
            message: format!("{func}: invalid argument `{arg}`: expected {expected}, got {got}"),
        }
    }

    /// A NULL pointer where `func` needs one.
    pub(crate) fn null(func: &str, arg: &str, expected: &str) -> CError {
        CError::invalid(func, arg, expected, "NULL")
    }
}

impl From<torchcomms::Error> for CError {
    fn from(e: torchcomms::Error) -> Self {
        CError {
            status: e.kind().into(),
            message: e.to_string(),
        }
    }
}

impl From<torchcomms_core::Error> for CError {
    fn from(e: torchcomms_core::Error) -> Self {
        torchcomms::Error::Engine(e).into()
    }
}

/// Result of the bodies of entry points.
pub(crate) type CResult<T = ()> = Result<T, CError>;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // Interior NULs would cut the message short in C; show them instead.
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // During thread teardown the slot may be gone; the status code still tells the caller.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = text);
}

fn clear_last_error() {
    let _ = LAST_ERROR.try_with(|slot| {
        let mut slot = slot.borrow_mut();
        if !slot.as_bytes().is_empty() {
            *slot = CString::default();
        }
    });
}

/// The calling thread's last error message: valid until this thread's next call into the
/// library. An empty string when the last call succeeded.
pub(crate) fn last_error_ptr() -> *const c_char {
    static EMPTY: &std::ffi::CStr = c"";
    LAST_ERROR
        .try_with(|slot| slot.borrow().as_ptr())
        .unwrap_or(EMPTY.as_ptr())
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Runs the body of entry point `func`: clears the last error, catches any panic (nothing
/// unwinds into C), and turns an error into its status and message.
pub(crate) fn guard(func: &str, body: impl FnOnce() -> CResult) -> tc_status_t {
    clear_last_error();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => tc_status_t::TC_OK,
        Ok(Err(e)) => {
            set_last_error(&e.message);
            e.status
        }
        Err(payload) => {
            let msg = panic_message(payload.as_ref());
            // Dropping the payload could itself panic; forget it rather than risk unwinding.
            std::mem::forget(payload);
            set_last_error(&format!(
                "{func}: internal error (a bug in torchcomms, please report it): {msg}"
            ));
            tc_status_t::TC_ERR_INTERNAL
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        LAST_ERROR.with(|s| s.borrow().to_string_lossy().into_owned())
    }

    #[test]
    fn guard_maps_errors_and_clears_them_on_success() {
        let s = guard("tc_x", || {
            Err(CError::null("tc_x", "comm", "a communicator"))
        });
        assert_eq!(s, tc_status_t::TC_ERR_INVALID_ARGUMENT);
        assert_eq!(
            last(),
            "tc_x: invalid argument `comm`: expected a communicator, got NULL"
        );
        assert_eq!(guard("tc_x", || Ok(())), tc_status_t::TC_OK);
        assert_eq!(last(), "");
    }

    #[test]
    fn guard_catches_panics() {
        let s = guard("tc_boom", || panic!("kaboom"));
        assert_eq!(s, tc_status_t::TC_ERR_INTERNAL);
        let msg = last();
        assert!(msg.starts_with("tc_boom: internal error"), "{msg}");
        assert!(msg.contains("kaboom"), "{msg}");
    }

    #[test]
    fn api_error_kinds_map_to_distinct_statuses() {
        let cases = [
            (
                ErrorKind::InvalidArgument,
                tc_status_t::TC_ERR_INVALID_ARGUMENT,
            ),
            (ErrorKind::Timeout, tc_status_t::TC_ERR_TIMEOUT),
            (ErrorKind::Communication, tc_status_t::TC_ERR_COMMUNICATION),
            (ErrorKind::NotSupported, tc_status_t::TC_ERR_NOT_SUPPORTED),
        ];
        for (kind, status) in cases {
            assert_eq!(tc_status_t::from(kind), status);
        }
        let e: CError = torchcomms::Error::invalid("all_reduce", "root", "a rank", 9).into();
        assert_eq!(e.status, tc_status_t::TC_ERR_INVALID_ARGUMENT);
        assert!(e.message.contains("root"), "{}", e.message);
    }

    #[test]
    fn messages_with_nul_bytes_survive() {
        let s = guard("tc_x", || {
            Err(CError::invalid("tc_x", "name", "text", "a\0b"))
        });
        assert_eq!(s, tc_status_t::TC_ERR_INVALID_ARGUMENT);
        assert!(last().ends_with("got a\\0b"), "{}", last());
    }
}
