//! Communicators (`tc_comm_*`) and work handles (`tc_work_*`).

use std::ffi::c_char;
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use torchcomms::WorkStatus;
use torchcomms_core::bootstrap::Store;

use super::args::*;
use crate::handles::{c_string, tc_comm_t, tc_store_t, tc_work_t};
use crate::status::{guard, tc_status_t, CError, CResult};
use crate::types::{self, *};

// ---------------------------------------------------------------------------------------------
// Communicators.
// ---------------------------------------------------------------------------------------------

/// Creates a communicator on `backend` ("ctran") for `device`, named `name`. A collective:
/// every rank calls it. `rank` and `size` are this rank and the number of ranks, or
/// `TC_RANK_FROM_ENV` to read them from the launcher (torchrun `RANK`/`WORLD_SIZE`,
/// `TORCHCOMM_RANK`/`TORCHCOMM_SIZE`, SLURM, Open MPI, PMI). Ranks bootstrap through `store`,
/// or, when it is NULL, through `MASTER_ADDR`/`MASTER_PORT` (rank 0 serves when no torchrun
/// agent store is there). Communicators created one after another on one store need distinct
/// names. Stores the new communicator in `*comm` (NULL on error).
///
/// # Safety
/// `backend`, `name` NULL or NUL-terminated strings; `store` NULL or a live store handle;
/// `options` NULL or valid; `comm` NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn tc_comm_create(
    backend: *const c_char,
    device: tc_device_t,
    name: *const c_char,
    store: *mut tc_store_t,
    rank: i32,
    size: i32,
    options: *const tc_comm_options_t,
    comm: *mut *mut tc_comm_t,
) -> tc_status_t {
    const F: &str = "tc_comm_create";
    guard(F, || {
        let comm = out(F, "comm", comm)?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(comm, ptr::null_mut()) };
        // SAFETY: forwarded to the caller.
        let backend = unsafe { c_str(F, "backend", backend) }?;
        // SAFETY: forwarded to the caller.
        let name = unsafe { c_str(F, "name", name) }?;
        let device = types::device(F, "device", device)?;
        let rank = env_or(F, "rank", rank)?;
        let size = env_or(F, "size", size)?;
        if size == Some(0) {
            return Err(CError::invalid(F, "size", "at least 1 rank", 0));
        }
        if let (Some(r), Some(s)) = (rank, size) {
            if r >= s {
                return Err(CError::invalid(F, "rank", format!("a rank in [0, {s})"), r));
            }
        }
        // SAFETY: forwarded to the caller.
        let store = unsafe { store.as_ref() }.map(|s| Arc::clone(&s.store));
        // SAFETY: forwarded to the caller.
        let mut o = unsafe { comm_options(F, options) }?;
        o.rank = rank;
        o.size = size;
        o.store = store.clone().map(|s| s as Arc<dyn Store>);
        crate::ensure_backends();
        let c = torchcomms::new_comm(backend, device, name, o)?;
        let handle = Box::into_raw(Box::new(tc_comm_t::new(c, store)));
        // SAFETY: as above.
        unsafe { put(comm, handle) };
        Ok(())
    })
}

/// `tc_comm_create` with rank and size from the launcher's environment and the store from
/// `MASTER_ADDR`/`MASTER_PORT` (or torchrun's agent store).
///
/// # Safety
/// As for `tc_comm_create`.
#[no_mangle]
pub unsafe extern "C" fn tc_comm_create_from_env(
    backend: *const c_char,
    device: tc_device_t,
    name: *const c_char,
    options: *const tc_comm_options_t,
    comm: *mut *mut tc_comm_t,
) -> tc_status_t {
    // SAFETY: forwarded to the caller; a NULL store and TC_RANK_FROM_ENV are always valid.
    unsafe {
        tc_comm_create(
            backend,
            device,
            name,
            ptr::null_mut(),
            TC_RANK_FROM_ENV,
            TC_RANK_FROM_ENV,
            options,
            comm,
        )
    }
}

/// Stores this rank in `*rank`.
///
/// # Safety
/// `comm` NULL or a live communicator; `rank` NULL or valid for writing an `int32_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_comm_rank(comm: *mut tc_comm_t, rank: *mut i32) -> tc_status_t {
    const F: &str = "tc_comm_rank";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { handle(F, "comm", comm, "a communicator from tc_comm_create") }?;
        let rank = out(F, "rank", rank)?;
        let r = i32::try_from(c.comm.get_rank()).unwrap_or(i32::MAX);
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(rank, r) };
        Ok(())
    })
}

/// Stores the number of ranks in `*size`.
///
/// # Safety
/// `comm` NULL or a live communicator; `size` NULL or valid for writing an `int32_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_comm_size(comm: *mut tc_comm_t, size: *mut i32) -> tc_status_t {
    const F: &str = "tc_comm_size";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { handle(F, "comm", comm, "a communicator from tc_comm_create") }?;
        let size = out(F, "size", size)?;
        let n = i32::try_from(c.comm.get_size()).unwrap_or(i32::MAX);
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(size, n) };
        Ok(())
    })
}

/// Stores the communicator's name in `*name` (valid until `tc_comm_destroy`).
///
/// # Safety
/// `comm` NULL or a live communicator; `name` NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn tc_comm_name(
    comm: *mut tc_comm_t,
    name: *mut *const c_char,
) -> tc_status_t {
    const F: &str = "tc_comm_name";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { handle(F, "comm", comm, "a communicator from tc_comm_create") }?;
        let name = out(F, "name", name)?;
        // SAFETY: checked non-NULL; the caller promises it is writable. The string lives in
        // the handle.
        unsafe { put(name, c.name.as_ptr()) };
        Ok(())
    })
}

/// Stores the backend's name ("ctran") in `*backend` (valid until `tc_comm_destroy`).
///
/// # Safety
/// `comm` NULL or a live communicator; `backend` NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn tc_comm_backend(
    comm: *mut tc_comm_t,
    backend: *mut *const c_char,
) -> tc_status_t {
    const F: &str = "tc_comm_backend";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { handle(F, "comm", comm, "a communicator from tc_comm_create") }?;
        let backend = out(F, "backend", backend)?;
        // SAFETY: checked non-NULL; the caller promises it is writable. The string lives in
        // the handle.
        unsafe { put(backend, c.backend.as_ptr()) };
        Ok(())
    })
}

/// Stores the version of the engine behind the backend ("ctran 0.1.0") in `*version` (valid
/// until `tc_comm_destroy`).
///
/// # Safety
/// `comm` NULL or a live communicator; `version` NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn tc_comm_backend_version(
    comm: *mut tc_comm_t,
    version: *mut *const c_char,
) -> tc_status_t {
    const F: &str = "tc_comm_backend_version";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { handle(F, "comm", comm, "a communicator from tc_comm_create") }?;
        let version = out(F, "version", version)?;
        let v = match c.backend_version.get() {
            Some(v) => v,
            None => {
                let v = c_string(&c.comm.get_backend_version()?);
                c.backend_version.get_or_init(|| v)
            }
        };
        // SAFETY: checked non-NULL; the caller promises it is writable. The string lives in
        // the handle.
        unsafe { put(version, v.as_ptr()) };
        Ok(())
    })
}

/// Stores the communicator's device in `*device`.
///
/// # Safety
/// `comm` NULL or a live communicator; `device` NULL or valid for writing a `tc_device_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_comm_device(
    comm: *mut tc_comm_t,
    device: *mut tc_device_t,
) -> tc_status_t {
    const F: &str = "tc_comm_device";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { handle(F, "comm", comm, "a communicator from tc_comm_create") }?;
        let device = out(F, "device", device)?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(device, types::device_to_c(c.comm.device())) };
        Ok(())
    })
}

/// Splits off a communicator of `ranks` (ranks of `comm`, `num_ranks` of them). A collective:
/// every rank of `comm` calls it; ranks passing an empty list get NULL in `*child`, the others
/// a communicator in which their rank is their position in `ranks`. `options` NULL gives the
/// child fresh defaults.
///
/// # Safety
/// `comm` NULL or a live communicator; `ranks` NULL or valid for reading `num_ranks` values;
/// `name` NULL or a NUL-terminated string; `options` NULL or valid; `child` NULL or valid for
/// writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn tc_comm_split(
    comm: *mut tc_comm_t,
    ranks: *const i32,
    num_ranks: usize,
    name: *const c_char,
    options: *const tc_comm_options_t,
    child: *mut *mut tc_comm_t,
) -> tc_status_t {
    const F: &str = "tc_comm_split";
    guard(F, || {
        let child = out(F, "child", child)?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(child, ptr::null_mut()) };
        // SAFETY: forwarded to the caller.
        let c = unsafe { handle(F, "comm", comm, "a communicator from tc_comm_create") }?;
        // SAFETY: forwarded to the caller.
        let ranks = unsafe { slice(F, "ranks", ranks, num_ranks) }?;
        let n = c.comm.get_size();
        let ranks = ranks
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                usize::try_from(r).map_err(|_| {
                    CError::invalid(
                        F,
                        &format!("ranks[{i}]"),
                        format!("ranks in range [0, {n})"),
                        r,
                    )
                })
            })
            .collect::<CResult<Vec<usize>>>()?;
        // SAFETY: forwarded to the caller.
        let name = unsafe { c_str(F, "name", name) }?;
        let options = if options.is_null() {
            None
        } else {
            // SAFETY: forwarded to the caller.
            Some(unsafe { comm_options(F, options) }?)
        };
        if let Some(sub) = c.comm.split(&ranks, name, options)? {
            let handle = Box::into_raw(Box::new(tc_comm_t::new(sub, None)));
            // SAFETY: as above.
            unsafe { put(child, handle) };
        }
        Ok(())
    })
}

/// Waits for outstanding work and releases the communicator's connections; operations fail
/// afterwards (`TC_ERR_COMMUNICATION`). A collective. Calling it twice is fine.
///
/// # Safety
/// `comm` NULL or a live communicator.
#[no_mangle]
pub unsafe extern "C" fn tc_comm_finalize(comm: *mut tc_comm_t) -> tc_status_t {
    const F: &str = "tc_comm_finalize";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { handle(F, "comm", comm, "a communicator from tc_comm_create") }?;
        Ok(c.comm.finalize()?)
    })
}

/// Fails outstanding and future work of this rank and closes its connections (peers notice).
///
/// # Safety
/// `comm` NULL or a live communicator.
#[no_mangle]
pub unsafe extern "C" fn tc_comm_abort(comm: *mut tc_comm_t) -> tc_status_t {
    const F: &str = "tc_comm_abort";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { handle(F, "comm", comm, "a communicator from tc_comm_create") }?;
        Ok(c.comm.abort()?)
    })
}

/// Writes the colltrace of every communicator of this process (its last operations, sequence
/// numbers and states; schema `docs/colltrace-schema.md`) as JSON, one file
/// `colltrace_rank<N>.json` per rank, into `dir`, or into `TORCHCOMMS_TRACE_DIR` when `dir` is
/// NULL. `comms-analyzer report DIR` reads the files of all ranks. A directory that cannot be
/// written is `TC_ERR_INVALID_ARGUMENT`, naming it.
///
/// # Safety
/// `dir` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tc_dump_trace(dir: *const c_char) -> tc_status_t {
    const F: &str = "tc_dump_trace";
    guard(F, || {
        let reason = Some("tc_dump_trace");
        let written = if dir.is_null() {
            colltrace::dump_configured(colltrace::Trigger::Api, reason)
        } else {
            // SAFETY: forwarded to the caller.
            let d = unsafe { c_str(F, "dir", dir) }?;
            colltrace::dump(std::path::Path::new(d), colltrace::Trigger::Api, reason)
        };
        written.map(|_| ()).map_err(|e| CError {
            status: tc_status_t::TC_ERR_INVALID_ARGUMENT,
            message: format!("{F}: {e}"),
        })
    })
}

/// Releases the communicator (NULL is a no-op). Without `tc_comm_finalize` first, queued work
/// still runs before the connections close. Work handles of the communicator stay valid.
///
/// # Safety
/// `comm` is NULL or a live communicator not used afterwards (nor concurrently).
#[no_mangle]
pub unsafe extern "C" fn tc_comm_destroy(comm: *mut tc_comm_t) -> tc_status_t {
    guard("tc_comm_destroy", || {
        if !comm.is_null() {
            // SAFETY: the caller hands back a handle from Box::into_raw, used no more.
            drop(unsafe { Box::from_raw(comm) });
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Work.
// ---------------------------------------------------------------------------------------------

/// Waits for the work: up to `timeout_seconds`, or, with `TC_WAIT_OP_TIMEOUT` (any negative
/// value), up to the operation's own timeout. Returns `TC_OK` once it completed successfully,
/// its error if it failed, and `TC_ERR_TIMEOUT` if it is still running at the deadline (the
/// work goes on; wait again or test later).
///
/// # Safety
/// `work` NULL or a live work handle.
#[no_mangle]
pub unsafe extern "C" fn tc_work_wait(work: *mut tc_work_t, timeout_seconds: f64) -> tc_status_t {
    const F: &str = "tc_work_wait";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let w = unsafe { handle(F, "work", work, "a work handle from an asynchronous call") }?;
        if timeout_seconds.is_nan() {
            return Err(CError::invalid(
                F,
                "timeout_seconds",
                "a number of seconds",
                "NaN",
            ));
        }
        if timeout_seconds < 0.0 {
            return Ok(w.work.wait()?);
        }
        let t = Duration::try_from_secs_f64(timeout_seconds).unwrap_or(Duration::MAX);
        Ok(w.work.wait_timeout(t)?)
    })
}

/// Stores in `*completed` whether the work finished, without blocking. Returns `TC_OK` while it
/// runs or once it succeeded, and its error once it failed.
///
/// # Safety
/// `work` NULL or a live work handle; `completed` NULL or valid for writing a bool.
#[no_mangle]
pub unsafe extern "C" fn tc_work_test(work: *mut tc_work_t, completed: *mut bool) -> tc_status_t {
    const F: &str = "tc_work_test";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let w = unsafe { handle(F, "work", work, "a work handle from an asynchronous call") }?;
        let completed = out(F, "completed", completed)?;
        let status = w.work.status();
        let done = matches!(
            status,
            WorkStatus::Completed | WorkStatus::Error | WorkStatus::TimedOut
        );
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(completed, done) };
        match (status, w.work.error()) {
            (WorkStatus::Error | WorkStatus::TimedOut, Some(e)) => Err(e.into()),
            (WorkStatus::Error | WorkStatus::TimedOut, None) => Err(CError {
                status: if status == WorkStatus::TimedOut {
                    tc_status_t::TC_ERR_TIMEOUT
                } else {
                    tc_status_t::TC_ERR_COMMUNICATION
                },
                message: format!("{F}: the operation failed ({status:?})"),
            }),
            _ => Ok(()),
        }
    })
}

/// Stores where the work stands (`TC_WORK_COMPLETED`...) in `*status`.
///
/// # Safety
/// `work` NULL or a live work handle; `status` NULL or valid for writing an `int32_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_work_status(
    work: *mut tc_work_t,
    status: *mut tc_work_status_t,
) -> tc_status_t {
    const F: &str = "tc_work_status";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let w = unsafe { handle(F, "work", work, "a work handle from an asynchronous call") }?;
        let status = out(F, "status", status)?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(status, types::work_status_to_c(w.work.status())) };
        Ok(())
    })
}

/// Releases the work handle (NULL is a no-op). The operation is not cancelled: its buffers must
/// stay valid until it completes.
///
/// # Safety
/// `work` is NULL or a live work handle not used afterwards (nor concurrently).
#[no_mangle]
pub unsafe extern "C" fn tc_work_free(work: *mut tc_work_t) -> tc_status_t {
    guard("tc_work_free", || {
        if !work.is_null() {
            // SAFETY: the caller hands back a handle from Box::into_raw, used no more.
            drop(unsafe { Box::from_raw(work) });
        }
        Ok(())
    })
}
