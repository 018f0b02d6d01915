//! The TCP store (`tc_store_*`).

use std::ffi::{c_char, c_void};
use std::ptr;
use std::sync::Arc;

use torchcomms::CommOptions;
use torchcomms_core::bootstrap::tcp_store::TcpStore;
use torchcomms_core::bootstrap::Store;

use super::args::*;
use crate::handles::tc_store_t;
use crate::status::{guard, tc_status_t, CError};
use crate::types::{self};

// ---------------------------------------------------------------------------------------------
// Stores.
// ---------------------------------------------------------------------------------------------

/// Connects to the TCP store at `host:port` (the torch.distributed.TCPStore protocol, so a
/// store served by torchrun or PyTorch works too). With `is_server`, first serves one on
/// `port` on every interface (`port` 0 picks a free port: read it with `tc_store_port`).
/// Connecting retries until `timeout_seconds` (0: `TORCHCOMM_TIMEOUT_SECONDS`, default 600).
///
/// A communicator created from the store keeps it (and its server) alive until the
/// communicator is destroyed, so `tc_store_destroy` may follow `tc_comm_create` at once.
///
/// # Safety
/// `host` is NULL or a NUL-terminated string; `store` NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn tc_store_create(
    host: *const c_char,
    port: u16,
    is_server: bool,
    timeout_seconds: f64,
    store: *mut *mut tc_store_t,
) -> tc_status_t {
    const F: &str = "tc_store_create";
    guard(F, || {
        let store = out(F, "store", store)?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(store, ptr::null_mut()) };
        // SAFETY: forwarded to the caller.
        let host = unsafe { c_str(F, "host", host) }?;
        if port == 0 && !is_server {
            return Err(CError::invalid(
                F,
                "port",
                "a port in 1..=65535 to connect to",
                0,
            ));
        }
        let timeout = types::timeout(F, "timeout_seconds", timeout_seconds)?
            .unwrap_or(CommOptions::from_env()?.timeout);
        let tcp = TcpStore::serve_or_connect(host, port, is_server, timeout)?;
        let handle = Box::into_raw(Box::new(tc_store_t {
            store: Arc::new(tcp),
        }));
        // SAFETY: as above.
        unsafe { put(store, handle) };
        Ok(())
    })
}

/// Stores the store's TCP port in `*port` (the bound one when it was served on port 0).
///
/// # Safety
/// `store` is NULL or a live store handle; `port` NULL or valid for writing a `uint16_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_store_port(store: *mut tc_store_t, port: *mut u16) -> tc_status_t {
    const F: &str = "tc_store_port";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let s = unsafe { handle(F, "store", store, "a store from tc_store_create") }?;
        let port = out(F, "port", port)?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(port, s.store.port()) };
        Ok(())
    })
}

/// Sets `key` to the `len` bytes at `value`.
///
/// # Safety
/// `store` NULL or a live store handle; `key` NULL or a NUL-terminated string; `value` NULL or
/// valid for reading `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn tc_store_set(
    store: *mut tc_store_t,
    key: *const c_char,
    value: *const c_void,
    len: usize,
) -> tc_status_t {
    const F: &str = "tc_store_set";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let s = unsafe { handle(F, "store", store, "a store from tc_store_create") }?;
        // SAFETY: forwarded to the caller.
        let key = unsafe { c_str(F, "key", key) }?;
        // SAFETY: forwarded to the caller (bytes have no alignment requirement).
        let value = unsafe { slice(F, "value", value.cast::<u8>(), len) }?;
        Ok(s.store.set(key, value)?)
    })
}

/// Gets the value of `key`, waiting up to `timeout_seconds` (0: the store's timeout) for
/// another rank to set it. Stores its length in `*len` and, when it fits in `capacity` bytes,
/// copies it to `buffer`; else returns `TC_ERR_INVALID_ARGUMENT` (call again with a buffer of
/// `*len` bytes).
///
/// # Safety
/// `store` NULL or a live store handle; `key` NULL or a NUL-terminated string; `buffer` NULL
/// or valid for writing `capacity` bytes; `len` NULL or valid for writing a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_store_get(
    store: *mut tc_store_t,
    key: *const c_char,
    timeout_seconds: f64,
    buffer: *mut c_void,
    capacity: usize,
    len: *mut usize,
) -> tc_status_t {
    const F: &str = "tc_store_get";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let s = unsafe { handle(F, "store", store, "a store from tc_store_create") }?;
        // SAFETY: forwarded to the caller.
        let key = unsafe { c_str(F, "key", key) }?;
        let len = out(F, "len", len)?;
        if buffer.is_null() && capacity > 0 {
            return Err(CError::null(F, "buffer", "a buffer of `capacity` bytes"));
        }
        let timeout = types::timeout(F, "timeout_seconds", timeout_seconds)?
            .unwrap_or_else(|| s.store.client().timeout());
        let value = s.store.get(key, timeout)?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(len, value.len()) };
        if value.len() > capacity {
            return Err(CError::invalid(
                F,
                "capacity",
                format!(
                    "at least {} bytes (the value's length, now in *len)",
                    value.len()
                ),
                capacity,
            ));
        }
        if !value.is_empty() {
            // SAFETY: buffer is non-NULL (capacity >= len > 0) and the caller promises
            // `capacity` writable bytes; the value is a separate allocation.
            unsafe { ptr::copy_nonoverlapping(value.as_ptr(), buffer.cast::<u8>(), value.len()) };
        }
        Ok(())
    })
}

/// Atomically adds `delta` to the integer at `key` (missing: 0) and stores the result in
/// `*value` (may be NULL).
///
/// # Safety
/// `store` NULL or a live store handle; `key` NULL or a NUL-terminated string; `value` NULL or
/// valid for writing an `int64_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_store_add(
    store: *mut tc_store_t,
    key: *const c_char,
    delta: i64,
    value: *mut i64,
) -> tc_status_t {
    const F: &str = "tc_store_add";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let s = unsafe { handle(F, "store", store, "a store from tc_store_create") }?;
        // SAFETY: forwarded to the caller.
        let key = unsafe { c_str(F, "key", key) }?;
        let v = s.store.add(key, delta)?;
        if !value.is_null() {
            // SAFETY: non-NULL; the caller promises it is writable.
            unsafe { put(value, v) };
        }
        Ok(())
    })
}

/// Releases the store handle (NULL is a no-op). Communicators created from it keep the
/// connection, and the server, until they are destroyed.
///
/// # Safety
/// `store` is NULL or a live store handle not used afterwards (nor concurrently).
#[no_mangle]
pub unsafe extern "C" fn tc_store_destroy(store: *mut tc_store_t) -> tc_status_t {
    guard("tc_store_destroy", || {
        if !store.is_null() {
            // SAFETY: the caller hands back a handle from Box::into_raw, used no more.
            drop(unsafe { Box::from_raw(store) });
        }
        Ok(())
    })
}
