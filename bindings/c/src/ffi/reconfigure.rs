//! Reconfiguration (`tc_reconfigurer_*`): forming a new communicator from the init handles of
//! its members after a failure (shrink) or to take in new processes (grow), without a new store
//! or launcher.

use std::ffi::c_char;
use std::ptr;
use std::sync::Arc;

use torchcomms::Reconfigurer;
use torchcomms_core::bootstrap::Store;

use super::args::*;
use crate::handles::{tc_comm_t, tc_reconfigurer_t, tc_store_t};
use crate::status::{guard, tc_status_t, CError};
use crate::types::{self, *};

/// Prepares reconfigurations of communicators named `name` on `backend` for `device`; talks to
/// nobody. Members meet through `store`, or, when it is NULL, torchrun's agent store: a store
/// that outlives every rank (one served by rank 0 would die with it). Stores the handle in
/// `*reconfigurer` (NULL on error).
///
/// # Safety
/// `backend`, `name` NUL-terminated strings; `store` NULL or a live store handle, kept alive
/// while the reconfigurer is used; `options` NULL or valid; `reconfigurer` valid for writing a
/// pointer.
#[no_mangle]
pub unsafe extern "C" fn tc_reconfigurer_create(
    backend: *const c_char,
    device: tc_device_t,
    name: *const c_char,
    store: *mut tc_store_t,
    options: *const tc_comm_options_t,
    reconfigurer: *mut *mut tc_reconfigurer_t,
) -> tc_status_t {
    const F: &str = "tc_reconfigurer_create";
    guard(F, || {
        let reconfigurer = out(F, "reconfigurer", reconfigurer)?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(reconfigurer, ptr::null_mut()) };
        // SAFETY: forwarded to the caller.
        let backend = unsafe { c_str(F, "backend", backend) }?;
        // SAFETY: forwarded to the caller.
        let name = unsafe { c_str(F, "name", name) }?;
        let device = types::device(F, "device", device)?;
        // SAFETY: forwarded to the caller.
        let mut o = unsafe { comm_options(F, options) }?;
        // SAFETY: forwarded to the caller.
        let store = unsafe { store.as_ref() }.map(|s| Arc::clone(&s.store));
        o.store = store.clone().map(|s| s as Arc<dyn Store>);
        crate::ensure_backends();
        let r = Reconfigurer::new(backend, device, name, o)?;
        let handle = Box::into_raw(Box::new(tc_reconfigurer_t::new(r, store)));
        // SAFETY: as above.
        unsafe { put(reconfigurer, handle) };
        Ok(())
    })
}

/// Stores this process's init handle in `*handle` (valid until `tc_reconfigurer_destroy`):
/// give it to every member of a reconfiguration.
///
/// # Safety
/// `reconfigurer` a live handle; `handle` valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn tc_reconfigurer_init_handle(
    reconfigurer: *mut tc_reconfigurer_t,
    handle: *mut *const c_char,
) -> tc_status_t {
    const F: &str = "tc_reconfigurer_init_handle";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let r = unsafe {
            super::args::handle(
                F,
                "reconfigurer",
                reconfigurer,
                "a handle from tc_reconfigurer_create",
            )
        }?;
        let out_ptr = out(F, "handle", handle)?;
        // SAFETY: checked non-NULL; the string lives in the handle.
        unsafe { put(out_ptr, r.handle.as_ptr()) };
        Ok(())
    })
}

/// Forms the communicator of the `num_handles` members in `handles` (a collective of exactly
/// those processes, each passing the same `uuid` and list); ranks follow the list's order.
/// `timeout_seconds` bounds the set-up (negative: the options' timeout). Stores the new
/// communicator in `*comm` (NULL on error); the caller finalizes and destroys the old one.
///
/// # Safety
/// `reconfigurer` a live handle; `handles` `num_handles` NUL-terminated strings; `comm` valid
/// for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn tc_reconfigurer_reconfigure(
    reconfigurer: *mut tc_reconfigurer_t,
    uuid: u64,
    handles: *const *const c_char,
    num_handles: usize,
    timeout_seconds: f64,
    comm: *mut *mut tc_comm_t,
) -> tc_status_t {
    const F: &str = "tc_reconfigurer_reconfigure";
    guard(F, || {
        let comm = out(F, "comm", comm)?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(comm, ptr::null_mut()) };
        // SAFETY: forwarded to the caller.
        let r = unsafe {
            super::args::handle(
                F,
                "reconfigurer",
                reconfigurer,
                "a handle from tc_reconfigurer_create",
            )
        }?;
        // SAFETY: forwarded to the caller.
        let raw = unsafe { slice(F, "handles", handles, num_handles) }?;
        let mut list = Vec::with_capacity(raw.len());
        for &h in raw {
            // SAFETY: forwarded to the caller.
            list.push(unsafe { c_str(F, "handles", h) }?.to_string());
        }
        if timeout_seconds.is_nan() {
            return Err(CError::invalid(
                F,
                "timeout_seconds",
                "a number of seconds",
                "NaN",
            ));
        }
        let timeout = (timeout_seconds >= 0.0).then(|| {
            std::time::Duration::try_from_secs_f64(timeout_seconds)
                .unwrap_or(std::time::Duration::MAX)
        });
        let c = r.reconfigurer.reconfigure(uuid, &list, timeout)?;
        let handle = Box::into_raw(Box::new(tc_comm_t::new(c, r.store.clone())));
        // SAFETY: as above.
        unsafe { put(comm, handle) };
        Ok(())
    })
}

/// Releases a reconfigurer (communicators it made stay valid).
///
/// # Safety
/// `reconfigurer` NULL or a live handle not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn tc_reconfigurer_destroy(
    reconfigurer: *mut tc_reconfigurer_t,
) -> tc_status_t {
    guard("tc_reconfigurer_destroy", || {
        if !reconfigurer.is_null() {
            // SAFETY: the caller hands back a handle from Box::into_raw, used no more.
            drop(unsafe { Box::from_raw(reconfigurer) });
        }
        Ok(())
    })
}
