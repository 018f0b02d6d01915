//! One-sided windows (`tc_window_*`): a buffer every rank registers collectively
//! (`tc_window_register`), into which peers write with `tc_window_put` and signal with
//! `tc_window_signal`, and on which a rank waits with `tc_window_wait_signal`. Each operation
//! takes `stream`, `options` and `work` as the collectives do (a non-NULL `work` makes it
//! asynchronous; on a CUDA communicator the operation follows the work on `stream`, and waiting
//! orders that stream after it).

use std::ffi::c_void;
use std::ptr;

use torchcomms::{OpOptions, Work};

use super::args::*;
use crate::handles::{tc_comm_t, tc_window_t, tc_work_t};
use crate::status::{guard, tc_status_t, CError, CResult};
use crate::types::*;

/// The window of `win`, the options of this call and where its work goes.
///
/// # Safety
/// As the public functions below promise for `win`, `options` and `work`.
unsafe fn window_call<'a>(
    func: &'static str,
    win: *mut tc_window_t,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> CResult<(&'a tc_window_t, OpOptions)> {
    if !work.is_null() {
        // SAFETY: the caller promises a non-NULL work is valid for writing a pointer.
        unsafe { put(work, ptr::null_mut()) };
    }
    // SAFETY: forwarded to the caller.
    let w = unsafe { handle(func, "window", win, "a window from tc_window_create") }?;
    // SAFETY: forwarded to the caller.
    let (mut opts, _) = unsafe { op_options(func, options, !work.is_null()) }?;
    opts.stream = stream_for(func, w.device, stream)?;
    Ok((w, opts))
}

/// Stores the work of an asynchronous call in `*work` (a synchronous one finished already).
///
/// # Safety
/// `work` NULL or valid for writing a pointer.
unsafe fn hand_out(result: torchcomms::Result<Work>, work: *mut *mut tc_work_t) -> CResult {
    let w = result?;
    if !work.is_null() {
        let h = Box::into_raw(Box::new(tc_work_t { work: w }));
        // SAFETY: checked non-NULL; the caller promised it is valid for writing.
        unsafe { put(work, h) };
    }
    Ok(())
}

fn rank(func: &str, arg: &str, r: i32, size: usize) -> CResult<usize> {
    usize::try_from(r)
        .map_err(|_| CError::invalid(func, arg, format!("{arg} in range [0, {size})"), r))
}

/// Creates a window of `comm` with no buffer registered, stored in `*window` (release it with
/// `tc_window_destroy`).
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h.
#[no_mangle]
pub unsafe extern "C" fn tc_window_create(
    comm: *mut tc_comm_t,
    window: *mut *mut tc_window_t,
) -> tc_status_t {
    const F: &str = "tc_window_create";
    guard(F, || {
        let window = out(F, "window", window)?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(window, ptr::null_mut()) };
        // SAFETY: forwarded to the caller.
        let c = unsafe { handle(F, "comm", comm, "a communicator from tc_comm_create") }?;
        let w = c.comm.new_window(None)?;
        let h = Box::into_raw(Box::new(tc_window_t {
            window: w,
            size: c.comm.get_size(),
            device: c.comm.device(),
        }));
        // SAFETY: as above.
        unsafe { put(window, h) };
        Ok(())
    })
}

/// Registers `buffer` with the window (collective: every rank calls it with a buffer of the
/// same size, valid until `tc_window_deregister`).
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; `buffer` as in `tc_tensor_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_window_register(
    window: *mut tc_window_t,
    buffer: tc_tensor_t,
) -> tc_status_t {
    const F: &str = "tc_window_register";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let w = unsafe { handle(F, "window", window, "a window from tc_window_create") }?;
        // SAFETY: forwarded to the caller.
        let t = unsafe { tensor(F, "buffer", &buffer) }?;
        Ok(w.window.tensor_register(&t)?)
    })
}

/// Deregisters the window's buffer (collective); puts into it fail afterwards.
///
/// # Safety
/// `window` as in the conventions atop torchcomms.h.
#[no_mangle]
pub unsafe extern "C" fn tc_window_deregister(window: *mut tc_window_t) -> tc_status_t {
    const F: &str = "tc_window_deregister";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let w = unsafe { handle(F, "window", window, "a window from tc_window_create") }?;
        Ok(w.window.tensor_deregister()?)
    })
}

/// Writes `tensor` into rank `dst_rank`'s window at element `target_offset_nelems` (one-sided:
/// the target does not take part); ordered before this rank's later signals to it.
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; `tensor` as in `tc_tensor_t`, valid until
/// the put completes.
#[no_mangle]
pub unsafe extern "C" fn tc_window_put(
    window: *mut tc_window_t,
    tensor: tc_tensor_t,
    dst_rank: i32,
    target_offset_nelems: usize,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_window_put";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let (w, opts) = unsafe { window_call(F, window, stream, options, work) }?;
        // SAFETY: forwarded to the caller.
        let t = unsafe { self::tensor(F, "tensor", &tensor) }?;
        let dst = rank(F, "dst_rank", dst_rank, w.size)?;
        let r = w.window.put(&t, dst, target_offset_nelems, &opts);
        // SAFETY: forwarded to the caller.
        unsafe { hand_out(r, work) }
    })
}

/// Adds one to the signal `peer_rank` keeps for this rank, after this rank's earlier puts to
/// it.
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h.
#[no_mangle]
pub unsafe extern "C" fn tc_window_signal(
    window: *mut tc_window_t,
    peer_rank: i32,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_window_signal";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let (w, opts) = unsafe { window_call(F, window, stream, options, work) }?;
        let peer = rank(F, "peer_rank", peer_rank, w.size)?;
        let r = w.window.signal(peer, &opts);
        // SAFETY: forwarded to the caller.
        unsafe { hand_out(r, work) }
    })
}

/// Waits for the next signal of `peer_rank` (each wait consumes one).
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h.
#[no_mangle]
pub unsafe extern "C" fn tc_window_wait_signal(
    window: *mut tc_window_t,
    peer_rank: i32,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_window_wait_signal";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let (w, opts) = unsafe { window_call(F, window, stream, options, work) }?;
        let peer = rank(F, "peer_rank", peer_rank, w.size)?;
        let r = w.window.wait_signal(peer, &opts);
        // SAFETY: forwarded to the caller.
        unsafe { hand_out(r, work) }
    })
}

/// Bytes of the registered buffer in `*size` (0 when none).
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h.
#[no_mangle]
pub unsafe extern "C" fn tc_window_get_size(
    window: *mut tc_window_t,
    size: *mut usize,
) -> tc_status_t {
    const F: &str = "tc_window_get_size";
    guard(F, || {
        let size = out(F, "size", size)?;
        // SAFETY: forwarded to the caller.
        let w = unsafe { handle(F, "window", window, "a window from tc_window_create") }?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(size, w.window.get_size()) };
        Ok(())
    })
}

/// Releases a window (NULL is a no-op); a registered buffer is released without the
/// collective deregistration, so call `tc_window_deregister` first.
///
/// # Safety
/// `window` is NULL or a live window not used afterwards (nor concurrently).
#[no_mangle]
pub unsafe extern "C" fn tc_window_destroy(window: *mut tc_window_t) -> tc_status_t {
    guard("tc_window_destroy", || {
        if !window.is_null() {
            // SAFETY: the caller hands back a handle from Box::into_raw, used no more.
            drop(unsafe { Box::from_raw(window) });
        }
        Ok(())
    })
}
