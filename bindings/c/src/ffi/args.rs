//! Checked conversions of raw pointers, and [`Call`], an operation call in the making.

use std::ffi::{c_char, c_void, CStr};
use std::ptr;

use torchcomms::{CommOptions, Device, Hints, OpOptions, Tensor, TorchComm, Work};

use crate::handles::{tc_comm_t, tc_work_t};
use crate::status::{CError, CResult};
use crate::types::{self, *};

// ---------------------------------------------------------------------------------------------
// Checked conversions of raw pointers. Each is `unsafe` only in that the pointer, when not
// NULL, must be valid as its documentation says; NULL is always reported as an error.
// ---------------------------------------------------------------------------------------------

/// The string at `p`.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid and unchanged for `'a`.
pub(super) unsafe fn c_str<'a>(func: &str, arg: &str, p: *const c_char) -> CResult<&'a str> {
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
pub(super) unsafe fn handle<'a, T>(func: &str, arg: &str, p: *mut T, what: &str) -> CResult<&'a T> {
    // SAFETY: the caller promises p is NULL or a live handle; as_ref maps NULL to None.
    unsafe { p.as_ref() }.ok_or_else(|| CError::null(func, arg, what))
}

/// Checks out-pointer `p` and returns it for a later [`put`].
pub(super) fn out<T>(func: &str, arg: &str, p: *mut T) -> CResult<*mut T> {
    if p.is_null() {
        return Err(CError::null(func, arg, "a pointer to store the result in"));
    }
    Ok(p)
}

/// Stores `v` through out-pointer `p` (checked by [`out`]).
///
/// # Safety
/// `p` is non-NULL, aligned and valid for a write of `T`.
pub(super) unsafe fn put<T>(p: *mut T, v: T) {
    // SAFETY: forwarded to the caller; `write` does not drop the (possibly uninitialised)
    // previous value.
    unsafe { p.write(v) }
}

/// The `n` elements at `p` (`p` may be NULL when `n` is 0).
///
/// # Safety
/// `p` is NULL or valid for reads of `n` elements of `T` for `'a`.
pub(super) unsafe fn slice<'a, T>(
    func: &str,
    arg: &str,
    p: *const T,
    n: usize,
) -> CResult<&'a [T]> {
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
pub(super) unsafe fn tensor(func: &str, arg: &str, t: &tc_tensor_t) -> CResult<Tensor> {
    let dtype = types::dtype(func, &format!("{arg}.dtype"), t.dtype)?;
    let device = types::device(func, &format!("{arg}.device"), t.device)?;
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
pub(super) unsafe fn tensors(
    func: &str,
    arg: &str,
    p: *const tc_tensor_t,
    n: usize,
) -> CResult<Vec<Tensor>> {
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
pub(super) unsafe fn hints(func: &str, arg: &str, p: *const tc_hint_t, n: usize) -> CResult<Hints> {
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
pub(super) unsafe fn comm_options(func: &str, o: *const tc_comm_options_t) -> CResult<CommOptions> {
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

/// The API options of `options` (NULL: the defaults), and its PREMUL_SUM factor; `async_op`
/// when the caller asked for a work handle.
///
/// # Safety
/// `options` NULL or valid, its hints as for [`hints`].
pub(super) unsafe fn op_options(
    func: &str,
    options: *const tc_op_options_t,
    async_op: bool,
) -> CResult<(OpOptions, f64)> {
    // SAFETY: the caller promises NULL or a valid options struct.
    let o = unsafe { options.as_ref() }.copied().unwrap_or_default();
    let timeout = types::timeout(func, "options.timeout_seconds", o.timeout_seconds)?;
    // SAFETY: forwarded to the caller.
    let hints = unsafe { hints(func, "options.hints", o.hints, o.num_hints) }?;
    let options = OpOptions {
        async_op,
        hints,
        timeout,
        stream: None,
    };
    Ok((options, o.premul_sum_factor))
}

/// An operation call in the making: the communicator, its options, and where its work goes.
pub(super) struct Call<'a> {
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
    pub(super) unsafe fn new(
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
        // SAFETY: forwarded to the caller.
        let (options, premul_sum_factor) = unsafe { op_options(func, options, !work.is_null()) }?;
        Ok(Call {
            func,
            comm: &comm.comm,
            options,
            premul_sum_factor,
            work,
        })
    }

    /// A rank argument: negative values fail with the same wording as ranks past the end.
    pub(super) fn rank(&self, arg: &str, r: i32) -> CResult<usize> {
        usize::try_from(r).map_err(|_| {
            let n = self.comm.get_size();
            CError::invalid(self.func, arg, format!("{arg} in range [0, {n})"), r)
        })
    }

    /// The reduce op of code `op`.
    pub(super) fn reduce_op(&self, op: tc_reduce_op_t) -> CResult<torchcomms::ReduceOp> {
        types::reduce_op(self.func, op, self.premul_sum_factor)
    }

    /// Takes the stream argument: the operation follows the work on it (CUDA communicators).
    pub(super) fn stream(&mut self, stream: *mut c_void) -> CResult<()> {
        self.options.stream = stream_for(self.func, self.comm.device(), stream)?;
        Ok(())
    }

    /// Runs the operation; for asynchronous calls stores the work handle in `*work`.
    pub(super) fn issue(
        self,
        op: impl FnOnce(&TorchComm, &OpOptions) -> torchcomms::Result<Work>,
    ) -> CResult {
        let work = op(self.comm, &self.options)?;
        if !self.work.is_null() {
            let handle = Box::into_raw(Box::new(tc_work_t { work }));
            // SAFETY: checked non-NULL; Call::new's caller promised it is valid for writing.
            unsafe { put(self.work, handle) };
        }
        Ok(())
    }
}

/// The stream an operation of a communicator on `device` follows: on a CUDA device `stream` (a
/// `cudaStream_t`; NULL is the legacy default stream); on the CPU there is none, and `stream`
/// must be NULL.
pub(super) fn stream_for(func: &str, device: Device, stream: *mut c_void) -> CResult<Option<u64>> {
    match device {
        Device::Cuda(_) => Ok(Some(stream as usize as u64)),
        _ if stream.is_null() => Ok(None),
        _ => Err(CError::invalid(
            func,
            "stream",
            "NULL for a CPU communicator (a cudaStream_t orders CUDA communicators' work)",
            format!("{stream:p}"),
        )),
    }
}

/// A rank count or rank of `tc_comm_create`: `TC_RANK_FROM_ENV` (-1) or a value >= 0.
pub(super) fn env_or(func: &str, arg: &str, v: i32) -> CResult<Option<usize>> {
    match v {
        TC_RANK_FROM_ENV => Ok(None),
        v => types::rank(func, arg, v)
            .map(Some)
            .map_err(|_| CError::invalid(func, arg, "a value >= 0 or TC_RANK_FROM_ENV (-1)", v)),
    }
}
