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

use std::ffi::{c_char, c_void, CStr};
use std::ptr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ctran::bootstrap::tcp_store::TcpStore;
use ctran::bootstrap::Store;
use torchcomms::{
    CommOptions, Device, Hints, OpOptions, P2POp, Tensor, TorchComm, Work, WorkStatus,
};

use crate::handles::{c_string, tc_comm_t, tc_store_t, tc_work_t};
use crate::status::{guard, last_error_ptr, tc_status_t, CError, CResult};
use crate::types::{self, *};

// ---------------------------------------------------------------------------------------------
// Checked conversions of raw pointers. Each is `unsafe` only in that the pointer, when not
// NULL, must be valid as its documentation says; NULL is always reported as an error.
// ---------------------------------------------------------------------------------------------

/// The string at `p`.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid and unchanged for `'a`.
unsafe fn c_str<'a>(func: &str, arg: &str, p: *const c_char) -> CResult<&'a str> {
    if p.is_null() {
        return Err(CError::null(func, arg, "a NUL-terminated string"));
    }
    // SAFETY: non-NULL, and the caller promises a NUL-terminated string living for 'a.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|_| CError::invalid(func, arg, "UTF-8 text", format!("{s:?}")))
}

/// The object behind handle `p`.
///
/// # Safety
/// `p` is NULL or a handle of type `T` returned by this library and not yet destroyed, and
/// stays so for `'a`.
unsafe fn handle<'a, T>(func: &str, arg: &str, p: *mut T, what: &str) -> CResult<&'a T> {
    // SAFETY: the caller promises p is NULL or a live handle; as_ref maps NULL to None.
    unsafe { p.as_ref() }.ok_or_else(|| CError::null(func, arg, what))
}

/// Checks out-pointer `p` and returns it for a later [`put`].
fn out<T>(func: &str, arg: &str, p: *mut T) -> CResult<*mut T> {
    if p.is_null() {
        return Err(CError::null(func, arg, "a pointer to store the result in"));
    }
    Ok(p)
}

/// Stores `v` through out-pointer `p` (checked by [`out`]).
///
/// # Safety
/// `p` is non-NULL, aligned and valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) {
    // SAFETY: forwarded to the caller; `write` does not drop the (possibly uninitialised)
    // previous value.
    unsafe { p.write(v) }
}

/// The `n` elements at `p` (`p` may be NULL when `n` is 0).
///
/// # Safety
/// `p` is NULL or valid for reads of `n` elements of `T` for `'a`.
unsafe fn slice<'a, T>(func: &str, arg: &str, p: *const T, n: usize) -> CResult<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(CError::invalid(
            func,
            arg,
            format!("an array of {n} elements"),
            "NULL",
        ));
    }
    if !p.is_aligned() {
        return Err(CError::invalid(
            func,
            arg,
            "an aligned array",
            format!("{p:p}"),
        ));
    }
    // SAFETY: non-NULL and aligned; the caller promises n readable elements living for 'a;
    // the elements are plain C data, valid for any bit pattern of their integer fields.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// The tensor `t` describes, after checking its dtype, device, pointer and size.
///
/// # Safety
/// When `t.count > 0`, `t.data` points to `t.count` elements of `t.dtype` that the caller keeps
/// valid, and does not touch, until the operation given the tensor completes.
unsafe fn tensor(func: &str, arg: &str, t: &tc_tensor_t) -> CResult<Tensor> {
    let dtype = types::dtype(func, &format!("{arg}.dtype"), t.dtype)?;
    let device = types::device(func, &format!("{arg}.device"), t.device)?;
    if let Device::Cuda(_) = device {
        return Err(CError::not_supported(
            func,
            format!(
                "`{arg}` is on {device}: CUDA buffers (and the `stream` argument that orders them) \
                 are not supported by this build yet; use TC_DEVICE_CPU buffers"
            ),
        ));
    }
    if t.data.is_null() && t.count > 0 {
        return Err(CError::invalid(
            func,
            &format!("{arg}.data"),
            format!("a buffer of {} elements", t.count),
            "NULL",
        ));
    }
    let fits = t
        .count
        .checked_mul(dtype.size_bytes())
        .is_some_and(|b| isize::try_from(b).is_ok());
    if !fits {
        return Err(CError::invalid(
            func,
            &format!("{arg}.count"),
            "a size in bytes that fits in isize",
            t.count,
        ));
    }
    // SAFETY: the pointer is non-NULL whenever count > 0 and the byte size fits; validity for
    // the duration of the operation is the caller's contract, forwarded from this function's.
    Ok(unsafe { Tensor::from_raw(t.data.cast::<u8>(), t.count, dtype, device) })
}

/// The tensors of the array `p` of `n` descriptors.
///
/// # Safety
/// As for [`slice`] and, for every element, [`tensor`].
unsafe fn tensors(func: &str, arg: &str, p: *const tc_tensor_t, n: usize) -> CResult<Vec<Tensor>> {
    // SAFETY: forwarded to the caller.
    let descs = unsafe { slice(func, arg, p, n) }?;
    descs
        .iter()
        .enumerate()
        // SAFETY: forwarded to the caller.
        .map(|(i, t)| unsafe { tensor(func, &format!("{arg}[{i}]"), t) })
        .collect()
}

/// The hints of the array `p` of `n` key/value pairs.
///
/// # Safety
/// As for [`slice`]; every key and value as for [`c_str`].
unsafe fn hints(func: &str, arg: &str, p: *const tc_hint_t, n: usize) -> CResult<Hints> {
    // SAFETY: forwarded to the caller.
    let pairs = unsafe { slice(func, arg, p, n) }?;
    let mut out = Hints::new();
    for (i, h) in pairs.iter().enumerate() {
        // SAFETY: forwarded to the caller.
        let key = unsafe { c_str(func, &format!("{arg}[{i}].key"), h.key) }?;
        // SAFETY: forwarded to the caller.
        let value = unsafe { c_str(func, &format!("{arg}[{i}].value"), h.value) }?;
        out.insert(key.to_owned(), value.to_owned());
    }
    Ok(out)
}

/// Communicator options: the environment's defaults with `o` (NULL: nothing) applied.
///
/// # Safety
/// `o` is NULL or points to a valid `tc_comm_options_t` whose hints are as for [`hints`].
unsafe fn comm_options(func: &str, o: *const tc_comm_options_t) -> CResult<CommOptions> {
    let mut options = CommOptions::from_env()?;
    // SAFETY: the caller promises NULL or a valid options struct.
    let Some(o) = (unsafe { o.as_ref() }) else {
        return Ok(options);
    };
    if let Some(t) = types::timeout(func, "options.timeout_seconds", o.timeout_seconds)? {
        options.timeout = t;
    }
    options.abort_process_on_timeout_or_error = match o.abort_process_on_timeout_or_error {
        -1 => options.abort_process_on_timeout_or_error,
        0 => false,
        1 => true,
        other => {
            return Err(CError::invalid(
                func,
                "options.abort_process_on_timeout_or_error",
                "1, 0 or -1 (from TORCHCOMM_ABORT_ON_ERROR)",
                other,
            ))
        }
    };
    // SAFETY: forwarded to the caller.
    options.hints = unsafe { hints(func, "options.hints", o.hints, o.num_hints) }?;
    Ok(options)
}

/// An operation call in the making: the communicator, its options, and where its work goes.
struct Call<'a> {
    func: &'static str,
    comm: &'a TorchComm,
    options: OpOptions,
    premul_sum_factor: f64,
    work: *mut *mut tc_work_t,
}

impl<'a> Call<'a> {
    /// Checks the communicator and options, and clears `*work` when given.
    ///
    /// # Safety
    /// `comm` as for [`handle`]; `options` NULL or valid (hints as for [`hints`]); `work` NULL
    /// or valid for writing a pointer.
    unsafe fn new(
        func: &'static str,
        comm: *mut tc_comm_t,
        options: *const tc_op_options_t,
        work: *mut *mut tc_work_t,
    ) -> CResult<Call<'a>> {
        if !work.is_null() {
            // SAFETY: the caller promises a non-NULL work is valid for writing a pointer.
            unsafe { put(work, ptr::null_mut()) };
        }
        // SAFETY: forwarded to the caller.
        let comm = unsafe { handle(func, "comm", comm, "a communicator from tc_comm_create") }?;
        // SAFETY: the caller promises NULL or a valid options struct.
        let o = unsafe { options.as_ref() }.copied().unwrap_or_default();
        let timeout = types::timeout(func, "options.timeout_seconds", o.timeout_seconds)?;
        // SAFETY: forwarded to the caller.
        let hints = unsafe { hints(func, "options.hints", o.hints, o.num_hints) }?;
        Ok(Call {
            func,
            comm: &comm.comm,
            options: OpOptions {
                async_op: !work.is_null(),
                hints,
                timeout,
                stream: None,
            },
            premul_sum_factor: o.premul_sum_factor,
            work,
        })
    }

    /// A rank argument: negative values fail with the same wording as ranks past the end.
    fn rank(&self, arg: &str, r: i32) -> CResult<usize> {
        usize::try_from(r).map_err(|_| {
            let n = self.comm.get_size();
            CError::invalid(self.func, arg, format!("{arg} in range [0, {n})"), r)
        })
    }

    /// The reduce op of code `op`.
    fn reduce_op(&self, op: tc_reduce_op_t) -> CResult<torchcomms::ReduceOp> {
        types::reduce_op(self.func, op, self.premul_sum_factor)
    }

    /// Checks the stream argument: only CUDA buffers are ordered on a stream.
    fn stream(&self, stream: *mut c_void) -> CResult<()> {
        if let Device::Cuda(_) = self.comm.device() {
            return Err(CError::not_supported(
                self.func,
                "CUDA communicators and streams are not supported by this build yet",
            ));
        }
        if !stream.is_null() {
            return Err(CError::invalid(
                self.func,
                "stream",
                "NULL for CPU buffers (a cudaStream_t orders CUDA buffers only)",
                format!("{stream:p}"),
            ));
        }
        Ok(())
    }

    /// Runs the operation; for asynchronous calls stores the work handle in `*work`.
    fn issue(self, op: impl FnOnce(&TorchComm, &OpOptions) -> torchcomms::Result<Work>) -> CResult {
        let work = op(self.comm, &self.options)?;
        if !self.work.is_null() {
            let handle = Box::into_raw(Box::new(tc_work_t { work }));
            // SAFETY: checked non-NULL; Call::new's caller promised it is valid for writing.
            unsafe { put(self.work, handle) };
        }
        Ok(())
    }
}

/// A rank count or rank of `tc_comm_create`: `TC_RANK_FROM_ENV` (-1) or a value >= 0.
fn env_or(func: &str, arg: &str, v: i32) -> CResult<Option<usize>> {
    match v {
        TC_RANK_FROM_ENV => Ok(None),
        v => types::rank(func, arg, v)
            .map(Some)
            .map_err(|_| CError::invalid(func, arg, "a value >= 0 or TC_RANK_FROM_ENV (-1)", v)),
    }
}

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

// ---------------------------------------------------------------------------------------------
// Collectives and point-to-point operations. All ranks of a communicator issue collectives in
// the same order. Each takes the communicator first and `stream`, `options`, `work` last (see
// the module conventions). Buffers must stay valid until the operation completes.
// ---------------------------------------------------------------------------------------------

/// In-place all-reduce of `tensor` with `op`.
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; `tensor` as in `tc_tensor_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_all_reduce(
    comm: *mut tc_comm_t,
    tensor: tc_tensor_t,
    op: tc_reduce_op_t,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_all_reduce";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let t = unsafe { self::tensor(F, "tensor", &tensor) }?;
        call.stream(stream)?;
        let op = call.reduce_op(op)?;
        call.issue(|c, o| c.all_reduce(&t, op, o))
    })
}

/// Reduce of `tensor` with `op` onto rank `root`; other ranks' buffers are unchanged.
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; `tensor` as in `tc_tensor_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_reduce(
    comm: *mut tc_comm_t,
    tensor: tc_tensor_t,
    root: i32,
    op: tc_reduce_op_t,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_reduce";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let t = unsafe { self::tensor(F, "tensor", &tensor) }?;
        call.stream(stream)?;
        let root = call.rank("root", root)?;
        let op = call.reduce_op(op)?;
        call.issue(|c, o| c.reduce(&t, root, op, o))
    })
}

/// Broadcast of rank `root`'s `tensor` into every rank's `tensor`.
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; `tensor` as in `tc_tensor_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_broadcast(
    comm: *mut tc_comm_t,
    tensor: tc_tensor_t,
    root: i32,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_broadcast";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let t = unsafe { self::tensor(F, "tensor", &tensor) }?;
        call.stream(stream)?;
        let root = call.rank("root", root)?;
        call.issue(|c, o| c.broadcast(&t, root, o))
    })
}

/// All-gather: every rank's `input` lands in `outputs[rank]` (one buffer per rank, each of
/// `input`'s count).
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; `outputs` NULL or `num_outputs` descriptors.
#[no_mangle]
pub unsafe extern "C" fn tc_all_gather(
    comm: *mut tc_comm_t,
    outputs: *const tc_tensor_t,
    num_outputs: usize,
    input: tc_tensor_t,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_all_gather";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let outs = unsafe { tensors(F, "outputs", outputs, num_outputs) }?;
        // SAFETY: forwarded to the caller.
        let input = unsafe { tensor(F, "input", &input) }?;
        call.stream(stream)?;
        call.issue(|c, o| c.all_gather(&outs, &input, o))
    })
}

/// All-gather where ranks contribute different counts: `outputs[r]` has rank r's count.
///
/// # Safety
/// As for `tc_all_gather`.
#[no_mangle]
pub unsafe extern "C" fn tc_all_gather_v(
    comm: *mut tc_comm_t,
    outputs: *const tc_tensor_t,
    num_outputs: usize,
    input: tc_tensor_t,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_all_gather_v";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let outs = unsafe { tensors(F, "outputs", outputs, num_outputs) }?;
        // SAFETY: forwarded to the caller.
        let input = unsafe { tensor(F, "input", &input) }?;
        call.stream(stream)?;
        call.issue(|c, o| c.all_gather_v(&outs, &input, o))
    })
}

/// All-gather into one buffer of `size` blocks of `input`'s count, in rank order.
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; tensors as in `tc_tensor_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_all_gather_single(
    comm: *mut tc_comm_t,
    output: tc_tensor_t,
    input: tc_tensor_t,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_all_gather_single";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let output = unsafe { tensor(F, "output", &output) }?;
        // SAFETY: forwarded to the caller.
        let input = unsafe { tensor(F, "input", &input) }?;
        call.stream(stream)?;
        call.issue(|c, o| c.all_gather_single(&output, &input, o))
    })
}

/// Reduce-scatter: `inputs[r]` of every rank, reduced with `op`, lands in rank r's `output`
/// (one input per rank, each of `output`'s count).
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; `inputs` NULL or `num_inputs` descriptors.
#[no_mangle]
pub unsafe extern "C" fn tc_reduce_scatter(
    comm: *mut tc_comm_t,
    output: tc_tensor_t,
    inputs: *const tc_tensor_t,
    num_inputs: usize,
    op: tc_reduce_op_t,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_reduce_scatter";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let output = unsafe { tensor(F, "output", &output) }?;
        // SAFETY: forwarded to the caller.
        let ins = unsafe { tensors(F, "inputs", inputs, num_inputs) }?;
        call.stream(stream)?;
        let op = call.reduce_op(op)?;
        call.issue(|c, o| c.reduce_scatter(&output, &ins, op, o))
    })
}

/// Reduce-scatter where blocks differ in count: `inputs[r]` has rank r's output count.
///
/// # Safety
/// As for `tc_reduce_scatter`.
#[no_mangle]
pub unsafe extern "C" fn tc_reduce_scatter_v(
    comm: *mut tc_comm_t,
    output: tc_tensor_t,
    inputs: *const tc_tensor_t,
    num_inputs: usize,
    op: tc_reduce_op_t,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_reduce_scatter_v";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let output = unsafe { tensor(F, "output", &output) }?;
        // SAFETY: forwarded to the caller.
        let ins = unsafe { tensors(F, "inputs", inputs, num_inputs) }?;
        call.stream(stream)?;
        let op = call.reduce_op(op)?;
        call.issue(|c, o| c.reduce_scatter_v(&output, &ins, op, o))
    })
}

/// Reduce-scatter of one buffer of `size` blocks of `output`'s count: block r, reduced over
/// ranks with `op`, lands in rank r's `output`.
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; tensors as in `tc_tensor_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_reduce_scatter_single(
    comm: *mut tc_comm_t,
    output: tc_tensor_t,
    input: tc_tensor_t,
    op: tc_reduce_op_t,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_reduce_scatter_single";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let output = unsafe { tensor(F, "output", &output) }?;
        // SAFETY: forwarded to the caller.
        let input = unsafe { tensor(F, "input", &input) }?;
        call.stream(stream)?;
        let op = call.reduce_op(op)?;
        call.issue(|c, o| c.reduce_scatter_single(&output, &input, op, o))
    })
}

/// All-to-all of buffer lists: `inputs[r]` goes to rank r, which receives it in its
/// `outputs[this rank]` (counts may differ per pair).
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; `outputs`, `inputs` NULL or that many descriptors.
#[no_mangle]
pub unsafe extern "C" fn tc_all_to_all(
    comm: *mut tc_comm_t,
    outputs: *const tc_tensor_t,
    num_outputs: usize,
    inputs: *const tc_tensor_t,
    num_inputs: usize,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_all_to_all";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let outs = unsafe { tensors(F, "outputs", outputs, num_outputs) }?;
        // SAFETY: forwarded to the caller.
        let ins = unsafe { tensors(F, "inputs", inputs, num_inputs) }?;
        call.stream(stream)?;
        call.issue(|c, o| c.all_to_all(&outs, &ins, o))
    })
}

/// All-to-all of one buffer split into `size` equal blocks: block r goes to rank r.
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; tensors as in `tc_tensor_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_all_to_all_single(
    comm: *mut tc_comm_t,
    output: tc_tensor_t,
    input: tc_tensor_t,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_all_to_all_single";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let output = unsafe { tensor(F, "output", &output) }?;
        // SAFETY: forwarded to the caller.
        let input = unsafe { tensor(F, "input", &input) }?;
        call.stream(stream)?;
        call.issue(|c, o| c.all_to_all_single(&output, &input, o))
    })
}

/// All-to-all with explicit split sizes, in elements (buffers are flat): `input_split_sizes[r]`
/// elements go to rank r, `output_split_sizes[r]` arrive from it. Each array has one entry per
/// rank.
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; the split arrays NULL or that many `size_t`s.
#[no_mangle]
pub unsafe extern "C" fn tc_all_to_all_v_single(
    comm: *mut tc_comm_t,
    output: tc_tensor_t,
    input: tc_tensor_t,
    output_split_sizes: *const usize,
    num_output_splits: usize,
    input_split_sizes: *const usize,
    num_input_splits: usize,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_all_to_all_v_single";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let output = unsafe { tensor(F, "output", &output) }?;
        // SAFETY: forwarded to the caller.
        let input = unsafe { tensor(F, "input", &input) }?;
        // SAFETY: forwarded to the caller.
        let out_splits = unsafe {
            slice(
                F,
                "output_split_sizes",
                output_split_sizes,
                num_output_splits,
            )
        }?;
        // SAFETY: forwarded to the caller.
        let in_splits =
            unsafe { slice(F, "input_split_sizes", input_split_sizes, num_input_splits) }?;
        call.stream(stream)?;
        call.issue(|c, o| c.all_to_all_v_single(&output, &input, out_splits, in_splits, o))
    })
}

/// Scatter: `inputs[r]` of rank `root` lands in rank r's `output`. `inputs` is read on `root`
/// only (elsewhere it may be NULL with `num_inputs` 0).
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; `inputs` NULL or `num_inputs` descriptors.
#[no_mangle]
pub unsafe extern "C" fn tc_scatter(
    comm: *mut tc_comm_t,
    output: tc_tensor_t,
    inputs: *const tc_tensor_t,
    num_inputs: usize,
    root: i32,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_scatter";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let output = unsafe { tensor(F, "output", &output) }?;
        // SAFETY: forwarded to the caller.
        let ins = unsafe { tensors(F, "inputs", inputs, num_inputs) }?;
        call.stream(stream)?;
        let root = call.rank("root", root)?;
        call.issue(|c, o| c.scatter(&output, &ins, root, o))
    })
}

/// Gather: rank r's `input` lands in `outputs[r]` of rank `root`. `outputs` is written on
/// `root` only (elsewhere it may be NULL with `num_outputs` 0).
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; `outputs` NULL or `num_outputs` descriptors.
#[no_mangle]
pub unsafe extern "C" fn tc_gather(
    comm: *mut tc_comm_t,
    outputs: *const tc_tensor_t,
    num_outputs: usize,
    input: tc_tensor_t,
    root: i32,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_gather";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let outs = unsafe { tensors(F, "outputs", outputs, num_outputs) }?;
        // SAFETY: forwarded to the caller.
        let input = unsafe { tensor(F, "input", &input) }?;
        call.stream(stream)?;
        let root = call.rank("root", root)?;
        call.issue(|c, o| c.gather(&outs, &input, root, o))
    })
}

/// Gather into one buffer of `size` blocks of `input`'s count on rank `root`. `output` is
/// written on `root` only (elsewhere pass an empty buffer: `tc_cpu_tensor(NULL, 0, dtype)`).
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; tensors as in `tc_tensor_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_gather_single(
    comm: *mut tc_comm_t,
    output: tc_tensor_t,
    input: tc_tensor_t,
    root: i32,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_gather_single";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let output = unsafe { tensor(F, "output", &output) }?;
        // SAFETY: forwarded to the caller.
        let input = unsafe { tensor(F, "input", &input) }?;
        call.stream(stream)?;
        let root = call.rank("root", root)?;
        call.issue(|c, o| c.gather_single(&output, &input, root, o))
    })
}

/// Barrier: returns (or completes) once every rank reached it.
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h.
#[no_mangle]
pub unsafe extern "C" fn tc_barrier(
    comm: *mut tc_comm_t,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_barrier";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        call.stream(stream)?;
        call.issue(|c, o| c.barrier(o))
    })
}

/// Sends `tensor` to rank `dst` (which posts a matching `tc_recv`).
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; `tensor` as in `tc_tensor_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_send(
    comm: *mut tc_comm_t,
    tensor: tc_tensor_t,
    dst: i32,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_send";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let t = unsafe { self::tensor(F, "tensor", &tensor) }?;
        call.stream(stream)?;
        let dst = call.rank("dst", dst)?;
        call.issue(|c, o| c.send(&t, dst, o))
    })
}

/// Receives into `tensor` from rank `src` (which posts a matching `tc_send`).
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; `tensor` as in `tc_tensor_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_recv(
    comm: *mut tc_comm_t,
    tensor: tc_tensor_t,
    src: i32,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_recv";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let t = unsafe { self::tensor(F, "tensor", &tensor) }?;
        call.stream(stream)?;
        let src = call.rank("src", src)?;
        call.issue(|c, o| c.recv(&t, src, o))
    })
}

/// Runs `num_ops` sends and receives concurrently (deadlock-free exchanges, e.g. a ring
/// shift).
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; `ops` NULL or `num_ops` entries whose tensors are as
/// in `tc_tensor_t`.
#[no_mangle]
pub unsafe extern "C" fn tc_batch_p2p(
    comm: *mut tc_comm_t,
    ops: *const tc_p2p_op_t,
    num_ops: usize,
    stream: *mut c_void,
    options: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_status_t {
    const F: &str = "tc_batch_p2p";
    guard(F, || {
        // SAFETY: forwarded to the caller.
        let call = unsafe { Call::new(F, comm, options, work) }?;
        // SAFETY: forwarded to the caller.
        let descs = unsafe { slice(F, "ops", ops, num_ops) }?;
        let mut batch = Vec::with_capacity(descs.len());
        for (i, d) in descs.iter().enumerate() {
            // SAFETY: forwarded to the caller.
            let tensor = unsafe { self::tensor(F, &format!("ops[{i}].tensor"), &d.tensor) }?;
            let peer = call.rank(&format!("ops[{i}].peer"), d.peer)?;
            batch.push(match d.kind {
                TC_P2P_SEND => P2POp::Send { tensor, peer },
                TC_P2P_RECV => P2POp::Recv { tensor, peer },
                other => {
                    return Err(CError::invalid(
                        F,
                        &format!("ops[{i}].kind"),
                        "TC_P2P_SEND (0) or TC_P2P_RECV (1)",
                        other,
                    ))
                }
            });
        }
        call.stream(stream)?;
        call.issue(|c, o| c.batch_p2p(&batch, o))
    })
}
