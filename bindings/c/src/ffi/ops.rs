//! The operations: one entry point per row of the table of operations
//! ([`torchcomms_core::for_each_op`]), named `tc_<op>`, and `tc_batch_p2p`. Each takes the
//! communicator first; then the operation's arguments (a tensor as a `tc_tensor_t`, a list as
//! a pointer and a `<name>_len` count, a rank as an `int32_t`, a reduce op as a
//! `tc_reduce_op_t`); then `stream`, `options` and `work` (see the module conventions). All
//! ranks of a communicator issue collectives in the same order. Buffers must stay valid until
//! the operation completes.

use std::ffi::c_void;
use std::ptr;

use torchcomms::P2POp;

use super::args::*;
use crate::handles::{tc_all_gather_p_t, tc_comm_t, tc_work_t};
use crate::status::{guard, tc_status_t, CError};
use crate::types::*;

/// Builds one entry point: its C parameters and argument conversions are accumulated kind by
/// kind (a list is a pointer and a `_len` count), then the function is written out. `$call`
/// and `$f` name the call and the function name in every step, so the conversions written by
/// one step see the bindings of the last.
macro_rules! c_function {
    (@munch $head:tt [$($p:tt)*] [$($conv:tt)*] ($arg:ident : Tensor, $($rest:tt)*)) => {
        c_function!(@munch $head [$($p)* $arg: tc_tensor_t,]
            [$($conv)* $arg (Tensor) ($arg),] ($($rest)*));
    };
    (@munch $head:tt [$($p:tt)*] [$($conv:tt)*] ($arg:ident : Tensors, $($rest:tt)*)) => {
        pastey::paste! {
            c_function!(@munch $head [$($p)* $arg: *const tc_tensor_t, [<$arg _len>]: usize,]
                [$($conv)* $arg (Tensors) ($arg, [<$arg _len>]),] ($($rest)*));
        }
    };
    (@munch $head:tt [$($p:tt)*] [$($conv:tt)*] ($arg:ident : Rank, $($rest:tt)*)) => {
        c_function!(@munch $head [$($p)* $arg: i32,] [$($conv)* $arg (Rank) ($arg),] ($($rest)*));
    };
    (@munch $head:tt [$($p:tt)*] [$($conv:tt)*] ($arg:ident : ReduceOp, $($rest:tt)*)) => {
        c_function!(@munch $head [$($p)* $arg: tc_reduce_op_t,]
            [$($conv)* $arg (ReduceOp) ($arg),] ($($rest)*));
    };
    (@munch $head:tt [$($p:tt)*] [$($conv:tt)*] ($arg:ident : Persistent, $($rest:tt)*)) => {
        c_function!(@munch $head [$($p)* $arg: *mut tc_all_gather_p_t,]
            [$($conv)* $arg (Persistent) ($arg),] ($($rest)*));
    };
    (@munch $head:tt [$($p:tt)*] [$($conv:tt)*] ($arg:ident : Splits, $($rest:tt)*)) => {
        pastey::paste! {
            c_function!(@munch $head [$($p)* $arg: *const usize, [<$arg _len>]: usize,]
                [$($conv)* $arg (Splits) ($arg, [<$arg _len>]),] ($($rest)*));
        }
    };
    (@munch [[$(#[doc = $doc:literal])*] $name:ident $call:ident $f:ident]
        [$($p:tt)*] [$($arg:ident ($kind:ident) ($($raw:ident),*),)*] ()) => {
        pastey::paste! {
            $(#[doc = $doc])*
            ///
            /// # Safety
            /// Pointers as in the conventions atop torchcomms.h; tensors as in `tc_tensor_t`; a
            /// list or split-size array NULL or holding its `_len` count of elements.
            #[no_mangle]
            pub unsafe extern "C" fn [<tc_ $name>](
                comm: *mut tc_comm_t,
                $($p)*
                stream: *mut c_void,
                options: *const tc_op_options_t,
                work: *mut *mut tc_work_t,
            ) -> tc_status_t {
                const $f: &str = concat!("tc_", stringify!($name));
                guard($f, || {
                    // SAFETY: forwarded to the caller.
                    let mut $call = unsafe { Call::new($f, comm, options, work) }?;
                    $(let $arg = c_arg!($kind, $call, $f, stringify!($arg), $($raw),*);)*
                    $call.stream(stream)?;
                    $call.issue(|c, o| c.$name($(c_arg!(pass $kind, $arg),)* o))
                })
            }
        }
    };
}

/// One argument of kind `$kind`, checked and converted for the API; `pass` hands it on.
macro_rules! c_arg {
    (Tensor, $call:ident, $f:ident, $name:expr, $t:ident) => {
        // SAFETY: forwarded to the caller.
        unsafe { tensor($f, $name, &$t) }?
    };
    (Tensors, $call:ident, $f:ident, $name:expr, $p:ident, $len:ident) => {
        // SAFETY: forwarded to the caller.
        unsafe { tensors($f, $name, $p, $len) }?
    };
    (Rank, $call:ident, $f:ident, $name:expr, $r:ident) => {
        $call.rank($name, $r)?
    };
    (ReduceOp, $call:ident, $f:ident, $name:expr, $op:ident) => {
        $call.reduce_op($op)?
    };
    (Splits, $call:ident, $f:ident, $name:expr, $p:ident, $len:ident) => {
        // SAFETY: forwarded to the caller.
        unsafe { slice($f, $name, $p, $len) }?
    };
    (Persistent, $call:ident, $f:ident, $name:expr, $h:ident) => {
        // SAFETY: forwarded to the caller.
        unsafe { handle($f, $name, $h, "a handle from tc_all_gather_p_init") }?
    };
    (pass Persistent, $arg:ident) => {
        &$arg.handle
    };
    (pass Rank, $arg:ident) => {
        $arg
    };
    (pass ReduceOp, $arg:ident) => {
        $arg
    };
    (pass Splits, $arg:ident) => {
        $arg
    };
    (pass $kind:ident, $arg:ident) => {
        &$arg
    };
}

macro_rules! c_functions {
    ($([$name:ident $id:literal [$($doc:literal)*] [$($arg:ident $kind:ident)*] $($rest:tt)*])*) => {
        $(c_function!(@munch [[$(#[doc = $doc])*] $name call F] [] [] ($($arg : $kind,)*));)*
    };
}

torchcomms_core::for_each_op!(c_functions);

/// Binds `output` (a buffer of `size` equal blocks) for `tc_all_gather_p_exec`, which gathers
/// every rank's input into it; stores the handle in `*handle` (release it with
/// `tc_all_gather_p_free`). Local: executions run the backend's all-gather (the Rust and
/// Python APIs can ask for a window instead).
///
/// # Safety
/// Pointers as in the conventions atop torchcomms.h; `output` as in `tc_tensor_t`, valid until
/// the handle is freed and its last execution completed.
#[no_mangle]
pub unsafe extern "C" fn tc_all_gather_p_init(
    comm: *mut tc_comm_t,
    output: tc_tensor_t,
    handle: *mut *mut tc_all_gather_p_t,
) -> tc_status_t {
    const F: &str = "tc_all_gather_p_init";
    guard(F, || {
        let handle = out(F, "handle", handle)?;
        // SAFETY: checked non-NULL; the caller promises it is writable.
        unsafe { put(handle, ptr::null_mut()) };
        // SAFETY: forwarded to the caller.
        let c = unsafe { self::handle(F, "comm", comm, "a communicator from tc_comm_create") }?;
        // SAFETY: forwarded to the caller.
        let output = unsafe { tensor(F, "output", &output) }?;
        let bound = c
            .comm
            .all_gather_p_init(&output, &torchcomms::Hints::new())?;
        let h = Box::into_raw(Box::new(tc_all_gather_p_t { handle: bound }));
        // SAFETY: as above.
        unsafe { put(handle, h) };
        Ok(())
    })
}

/// Releases a handle of `tc_all_gather_p_init` (NULL is a no-op).
///
/// # Safety
/// `handle` is NULL or a live handle not used afterwards (nor concurrently).
#[no_mangle]
pub unsafe extern "C" fn tc_all_gather_p_free(handle: *mut tc_all_gather_p_t) -> tc_status_t {
    guard("tc_all_gather_p_free", || {
        if !handle.is_null() {
            // SAFETY: the caller hands back a handle from Box::into_raw, used no more.
            drop(unsafe { Box::from_raw(handle) });
        }
        Ok(())
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
        let mut call = unsafe { Call::new(F, comm, options, work) }?;
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
