//! The operations of `TorchComm`: one Python method per row of the table
//! ([`torchcomms_core::for_each_op`]). Each checks its Python arguments, takes the next
//! process-wide op id, runs the pre-hooks with the op's record, calls the backend with the GIL
//! released (or the Python backend's method of the same name), runs the post-hooks and returns
//! a `TorchWork` (see [`CommCore::issue`](crate::core::CommCore::issue)).

use pyo3::prelude::*;
use torchcomms::TorchComm;

use crate::args::{bool_arg, hook_value, obj, pre, pybool, splits, tuple};
use crate::comm::PyTorchComm;
use crate::core::PostKind;
use crate::error::guard;
use crate::hooks;
use crate::persistent::persistent_arg;
use crate::tensor::{to_tensor, to_tensors};
use crate::types::{reduce_op_arg, OpName};
use crate::work::PyTorchWork;

/// One argument of kind `$kind`: `check` validates what every backend needs checked (ranks,
/// split sizes), `native` converts it for the API, `pass` hands the converted value on.
macro_rules! py_arg {
    (check Rank, $core:ident, $op:ident, $tag:ident, $name:expr, $v:ident) => {
        $core.rank_arg($op, $name, $v).map(|_| ())
    };
    (check Splits, $core:ident, $op:ident, $tag:ident, $name:expr, $v:ident) => {
        splits($v, $tag, $name).map(|_| ())
    };
    (check $kind:ident, $core:ident, $op:ident, $tag:ident, $name:expr, $v:ident) => {
        PyResult::Ok(())
    };
    (native Tensor, $core:ident, $op:ident, $tag:ident, $name:expr, $v:ident) => {
        to_tensor($v, $tag, $name)
    };
    (native Tensors, $core:ident, $op:ident, $tag:ident, $name:expr, $v:ident) => {
        to_tensors($v, $tag, $name)
    };
    (native Rank, $core:ident, $op:ident, $tag:ident, $name:expr, $v:ident) => {
        $core.rank_arg($op, $name, $v)
    };
    (native ReduceOp, $core:ident, $op:ident, $tag:ident, $name:expr, $v:ident) => {
        reduce_op_arg($v, $tag)
    };
    (native Splits, $core:ident, $op:ident, $tag:ident, $name:expr, $v:ident) => {
        splits($v, $tag, $name)
    };
    (native Persistent, $core:ident, $op:ident, $tag:ident, $name:expr, $v:ident) => {
        persistent_arg($v, $tag, $name)
    };
    (pass Rank, $v:ident) => {
        $v
    };
    (pass ReduceOp, $v:ident) => {
        $v
    };
    (pass $kind:ident, $v:ident) => {
        &$v
    };
}

macro_rules! py_methods {
    ($([$name:ident $id:literal [$($doc:literal)*] [$($arg:ident $kind:ident)*] [$($field:ident $from:ident)*] $($rest:tt)*])*) => { pastey::paste! {
        #[pymethods]
        impl PyTorchComm {
            $(
                $(#[doc = $doc])*
                #[pyo3(signature = ($($arg,)* async_op, hints=None, timeout=None))]
                #[allow(clippy::too_many_arguments)]
                fn $name(
                    &self,
                    py: Python<'_>,
                    $($arg: &Bound<'_, PyAny>,)*
                    async_op: &Bound<'_, PyAny>,
                    hints: Option<&Bound<'_, PyAny>>,
                    timeout: Option<&Bound<'_, PyAny>>,
                ) -> PyResult<Py<PyTorchWork>> {
                    let core = &self.core();
                    let op = stringify!($name);
                    guard(op, || {
                        // Formatted once: every argument's error names it.
                        let tag = &core.tag(op);
                        $(py_arg!(check $kind, core, op, tag, stringify!($arg), $arg)?;)*
                        let async_op = bool_arg(async_op, tag, "async_op")?;
                        let opts = core.op_options(op, async_op, hints, timeout)?;
                        let native = match core.native() {
                            Some(_) => {
                                $(let $arg = py_arg!(native $kind, core, op, tag, stringify!($arg), $arg)?;)*
                                Some(move |comm: &TorchComm| {
                                    comm.$name($(py_arg!(pass $kind, $arg),)* &opts)
                                })
                            }
                            None => None,
                        };
                        core.issue(
                            py,
                            OpName::[<$name:camel>],
                            |py| {
                                pre(py, hooks::[<$name:camel PreHookArgs>] {
                                    $($field: hook_value(py, $from, op, stringify!($from))?,)*
                                    async_op: pybool(py, async_op),
                                })
                            },
                            native,
                            |py| tuple(py, vec![$(obj($arg),)* pybool(py, async_op)]),
                            PostKind::Collective,
                        )
                    })
                }
            )*
        }
    }};
}

torchcomms_core::for_each_op!(py_methods);
