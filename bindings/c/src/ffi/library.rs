//! Errors, versions, features, value constructors and option defaults.

use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

use super::args::*;
use crate::handles::c_string;
use crate::status::{guard, last_error_ptr, tc_status_t};
use crate::types::*;

// ---------------------------------------------------------------------------------------------
// Errors, versions and features.
// ---------------------------------------------------------------------------------------------

/// Major version of the headers; compare with `tc_version_numbers()` at run time.
pub const TC_VERSION_MAJOR: i32 = 0;
/// Minor version of the headers.
pub const TC_VERSION_MINOR: i32 = 1;
/// Patch version of the headers.
pub const TC_VERSION_PATCH: i32 = 0;

const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("the package version has no interior NUL"),
    };

/// The calling thread's message for the last call that failed, or "" when its last call
/// succeeded. The string stays valid until this thread calls the library again; copy it to
/// keep it. Never NULL.
#[no_mangle]
pub extern "C" fn tc_last_error() -> *const c_char {
    last_error_ptr()
}

/// A short static description of a status code ("invalid argument"); "unknown status" for
/// values that are not a `tc_status_t`. Never NULL.
#[no_mangle]
pub extern "C" fn tc_status_string(status: i32) -> *const c_char {
    let all = [
        tc_status_t::TC_OK,
        tc_status_t::TC_ERR_INVALID_ARGUMENT,
        tc_status_t::TC_ERR_TIMEOUT,
        tc_status_t::TC_ERR_COMMUNICATION,
        tc_status_t::TC_ERR_NOT_SUPPORTED,
        tc_status_t::TC_ERR_INTERNAL,
    ];
    all.iter()
        .find(|s| **s as i32 == status)
        .map_or(c"unknown status", |s| s.describe())
        .as_ptr()
}

/// Stores the library's version ("0.1.0", static) in `*version`.
///
/// # Safety
/// `version` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn tc_version(version: *mut *const c_char) -> tc_status_t {
    guard("tc_version", || {
        let version = out("tc_version", "version", version)?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(version, VERSION.as_ptr()) };
        Ok(())
    })
}

/// Stores the library's version numbers (compare with `TC_VERSION_MAJOR`... of the header).
///
/// # Safety
/// Each pointer is NULL or valid for writing an `int32_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_version_numbers(
    major: *mut i32,
    minor: *mut i32,
    patch: *mut i32,
) -> tc_status_t {
    const F: &str = "tc_version_numbers";
    guard(F, || {
        let (ma, mi, pa) = (
            out(F, "major", major)?,
            out(F, "minor", minor)?,
            out(F, "patch", patch)?,
        );
        let num = |s: &str| s.parse::<i32>().unwrap_or(-1);
        // SAFETY: all three checked non-NULL; the caller promises they are writable.
        unsafe {
            put(ma, num(env!("CARGO_PKG_VERSION_MAJOR")));
            put(mi, num(env!("CARGO_PKG_VERSION_MINOR")));
            put(pa, num(env!("CARGO_PKG_VERSION_PATCH")));
        }
        Ok(())
    })
}

/// Stores the names of the backends this build has, comma-separated and sorted ("ctran"), in
/// `*names` (a static string).
///
/// # Safety
/// `names` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn tc_backends(names: *mut *const c_char) -> tc_status_t {
    guard("tc_backends", || {
        let names = out("tc_backends", "names", names)?;
        static NAMES: OnceLock<std::ffi::CString> = OnceLock::new();
        let list = NAMES.get_or_init(|| {
            crate::ensure_backends();
            c_string(&torchcomms::backend_names().join(","))
        });
        // SAFETY: checked non-NULL; the caller promises it is writable. The string is static.
        unsafe { put(names, list.as_ptr()) };
        Ok(())
    })
}

/// Stores the names of the transports this build has, comma-separated ("socket,shm,nvl"), in `*names`
/// (a static string).
///
/// # Safety
/// `names` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn tc_transports(names: *mut *const c_char) -> tc_status_t {
    guard("tc_transports", || {
        let names = out("tc_transports", "names", names)?;
        static NAMES: OnceLock<std::ffi::CString> = OnceLock::new();
        let list = NAMES.get_or_init(|| c_string(&crate::TRANSPORTS.join(",")));
        // SAFETY: checked non-NULL; the caller promises it is writable. The string is static.
        unsafe { put(names, list.as_ptr()) };
        Ok(())
    })
}

/// Stores in `*available` whether backend `name` is in this build.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `available` NULL or valid for writing a bool.
#[no_mangle]
pub unsafe extern "C" fn tc_has_backend(name: *const c_char, available: *mut bool) -> tc_status_t {
    const F: &str = "tc_has_backend";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let name = unsafe { c_str(F, "name", name) }?;
        let available = out(F, "available", available)?;
        crate::ensure_backends();
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(available, torchcomms::is_backend_registered(name)) };
        Ok(())
    })
}

/// Stores in `*available` whether transport `name` ("socket", "shm") is in this build.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `available` NULL or valid for writing a bool.
#[no_mangle]
pub unsafe extern "C" fn tc_has_transport(
    name: *const c_char,
    available: *mut bool,
) -> tc_status_t {
    const F: &str = "tc_has_transport";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let name = unsafe { c_str(F, "name", name) }?;
        let available = out(F, "available", available)?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(available, crate::TRANSPORTS.contains(&name)) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Values.
// ---------------------------------------------------------------------------------------------

/// A host buffer descriptor: `count` elements of `dtype` at `data` on the CPU.
#[no_mangle]
pub extern "C" fn tc_cpu_tensor(data: *mut c_void, count: usize, dtype: tc_dtype_t) -> tc_tensor_t {
    tc_tensor_t {
        data,
        count,
        dtype,
        device: tc_device_t {
            device_type: TC_DEVICE_CPU,
            index: 0,
        },
    }
}

/// Fills `*options` with the defaults: the communicator's timeout, no hints, premul factor 1.
///
/// # Safety
/// `options` is NULL or valid for writing a `tc_op_options_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_op_options_init(options: *mut tc_op_options_t) -> tc_status_t {
    guard("tc_op_options_init", || {
        let o = out("tc_op_options_init", "options", options)?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(o, tc_op_options_t::default()) };
        Ok(())
    })
}

/// Fills `*options` with the defaults: timeout and abort behaviour from the environment
/// (`TORCHCOMM_TIMEOUT_SECONDS`, `TORCHCOMM_ABORT_ON_ERROR`), no hints.
///
/// # Safety
/// `options` is NULL or valid for writing a `tc_comm_options_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_comm_options_init(options: *mut tc_comm_options_t) -> tc_status_t {
    guard("tc_comm_options_init", || {
        let o = out("tc_comm_options_init", "options", options)?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(o, tc_comm_options_t::default()) };
        Ok(())
    })
}
