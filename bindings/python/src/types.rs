//! Enums, `ReduceOp` and the options classes of torchcomms' Python API.

use std::collections::HashMap;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDelta, PyDict, PyFloat, PyInt, PyTuple};

use crate::error::{type_error, value_error, ResultExt};

/// Defines a Python enum with upstream's member names and `.name` / `.value` like pybind's.
macro_rules! py_enum {
    ($(#[$doc:meta])* $rust:ident, $py:literal { $($var:ident = $val:literal => $name:literal),* $(,)? }) => {
        $(#[$doc])*
        #[pyclass(module = "torchcomms._comms", name = $py, eq, eq_int, hash, frozen, from_py_object)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub(crate) enum $rust {
            $(#[pyo3(name = $name)] $var = $val,)*
        }

        py_enum_methods!($rust, $py { $($var => $name),* });
    };
}

/// The methods of a [`py_enum!`] (also for enums whose members are named by `rename_all`).
macro_rules! py_enum_methods {
    ($rust:ident, $py:literal { $($var:ident => $name:expr),* $(,)? }) => {
        #[pymethods]
        impl $rust {
            /// Member name, as upstream's pybind enums have it.
            #[getter]
            fn name(&self) -> &'static str {
                self.as_str()
            }
            /// Integer value.
            #[getter]
            fn value(&self) -> isize {
                *self as isize
            }
            fn __str__(&self) -> String {
                format!("{}.{}", $py, self.as_str())
            }
            /// Pickles as `getattr(EnumClass, "MEMBER")`.
            fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
                let py = slf.py();
                let getattr = py.import("builtins")?.getattr("getattr")?;
                let args = PyTuple::new(py, [slf.as_any().get_type().into_any(), slf.get().as_str().into_pyobject(py)?.into_any()])?;
                PyTuple::new(py, [getattr, args.into_any()])
            }
            /// Members by name, as upstream's pybind enums have it.
            #[classattr]
            fn __members__(py: Python<'_>) -> PyResult<Py<PyDict>> {
                let d = PyDict::new(py);
                $(d.set_item($name, $rust::$var)?;)*
                Ok(d.unbind())
            }
        }

        impl $rust {
            pub(crate) fn as_str(&self) -> &'static str {
                match self { $($rust::$var => $name,)* }
            }
        }
    };
}

py_enum!(
    /// Type of a reduction (upstream's `RedOpType`).
    RedOpType, "RedOpType" {
    Sum = 0 => "SUM",
    Product = 1 => "PRODUCT",
    Min = 2 => "MIN",
    Max = 3 => "MAX",
    BAnd = 4 => "BAND",
    BOr = 5 => "BOR",
    BXor = 6 => "BXOR",
    PremulSum = 7 => "PREMUL_SUM",
    Avg = 8 => "AVG",
});

py_enum!(
    /// Status of a work object (used by Python backends through `TorchWork._set_status`).
    WorkStatus, "WorkStatus" {
    NotStarted = 0 => "NOT_STARTED",
    InProgress = 1 => "INPROGRESS",
    Completed = 2 => "COMPLETED",
    TimedOut = 3 => "TIMEDOUT",
    Error = 4 => "ERROR",
});

py_enum!(
    /// Kind of a batched point-to-point operation.
    P2POpType, "P2POpType" {
    Send = 0 => "SEND",
    Recv = 1 => "RECV",
});

py_enum!(
    /// How a peer's window memory is reached (`TorchCommWindow.get_attr`).
    WinAccessType, "TorchCommWinAccessType" {
    Unified = 0 => "WIN_ACCESS_TYPE_UNIFIED",
    Separate = 1 => "WIN_ACCESS_TYPE_SEPARATE",
});

/// `OpName`: the operations of the table under upstream's values, then the management calls
/// hooks also fire for. Members are named in snake case (`OpName.all_reduce`).
macro_rules! op_names {
    ($([$name:ident $id:literal $($rest:tt)*])*) => { pastey::paste! {
        /// The operation a hook fires for (upstream's values plus `batch_op_issue`).
        #[pyclass(module = "torchcomms._comms", name = "OpName", eq, eq_int, hash, frozen, from_py_object, rename_all = "snake_case")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub(crate) enum OpName {
            $([<$name:camel>] = $id,)*
            Split = 18,
            NewWindow = 19,
            Finalize = 20,
            BatchOpIssue = 21,
        }

        py_enum_methods!(OpName, "OpName" {
            $([<$name:camel>] => stringify!($name),)*
            Split => "split",
            NewWindow => "new_window",
            Finalize => "finalize",
            BatchOpIssue => "batch_op_issue",
        });
    }};
}

torchcomms_core::for_each_op!(op_names);

impl From<torchcomms::WorkStatus> for WorkStatus {
    fn from(s: torchcomms::WorkStatus) -> Self {
        match s {
            torchcomms::WorkStatus::NotStarted => WorkStatus::NotStarted,
            torchcomms::WorkStatus::InProgress => WorkStatus::InProgress,
            torchcomms::WorkStatus::Completed => WorkStatus::Completed,
            torchcomms::WorkStatus::TimedOut => WorkStatus::TimedOut,
            torchcomms::WorkStatus::Error => WorkStatus::Error,
        }
    }
}

/// A reduction operator: one of the static members (`ReduceOp.SUM`...) or
/// `ReduceOp.PREMUL_SUM(factor)`.
#[pyclass(module = "torchcomms._comms", name = "ReduceOp", frozen)]
#[derive(Debug)]
pub(crate) struct PyReduceOp {
    kind: RedOpType,
    /// PREMUL_SUM's factor as given (a float or a tensor).
    factor: Option<Py<PyAny>>,
    factor_value: f64,
}

impl PyReduceOp {
    fn of(kind: RedOpType) -> PyReduceOp {
        PyReduceOp {
            kind,
            factor: None,
            factor_value: 1.0,
        }
    }

    fn copy(&self, py: Python<'_>) -> PyReduceOp {
        PyReduceOp {
            kind: self.kind,
            factor: self.factor.as_ref().map(|f| f.clone_ref(py)),
            factor_value: self.factor_value,
        }
    }

    /// The engine's operator.
    pub(crate) fn to_api(&self) -> torchcomms::ReduceOp {
        use torchcomms::ReduceOp as R;
        match self.kind {
            RedOpType::Sum => R::Sum,
            RedOpType::Product => R::Product,
            RedOpType::Min => R::Min,
            RedOpType::Max => R::Max,
            RedOpType::BAnd => R::BAnd,
            RedOpType::BOr => R::BOr,
            RedOpType::BXor => R::BXor,
            RedOpType::Avg => R::Avg,
            RedOpType::PremulSum => R::PremulSum {
                factor: self.factor_value,
            },
        }
    }
}

/// Reads the `op` argument of a reduction: a `ReduceOp` or a `RedOpType`.
pub(crate) fn reduce_op_arg(op: &Bound<'_, PyAny>, opname: &str) -> PyResult<torchcomms::ReduceOp> {
    if let Ok(r) = op.cast::<PyReduceOp>() {
        return Ok(r.get().to_api());
    }
    if let Ok(t) = op.extract::<RedOpType>() {
        if t == RedOpType::PremulSum {
            return Err(value_error(format!(
                "{opname}: argument `op`: PREMUL_SUM needs a factor, use ReduceOp.PREMUL_SUM(factor)"
            )));
        }
        return Ok(PyReduceOp::of(t).to_api());
    }
    Err(type_error(format!(
        "{opname}: argument `op` must be a torchcomms.ReduceOp, got {}",
        op.get_type().name()?
    )))
}

#[pymethods]
impl PyReduceOp {
    #[new]
    #[allow(non_snake_case)]
    fn new(opType: &Bound<'_, PyAny>) -> PyResult<Self> {
        let opType = opType.extract::<RedOpType>().map_err(|_| {
            type_error(format!(
                "ReduceOp: argument `opType` must be a RedOpType, got {}",
                crate::args::type_name(opType)
            ))
        })?;
        if opType == RedOpType::PremulSum {
            return Err(value_error(
                "ReduceOp(RedOpType.PREMUL_SUM) needs a factor: use ReduceOp.PREMUL_SUM(factor)",
            ));
        }
        Ok(PyReduceOp::of(opType))
    }

    #[classattr]
    #[pyo3(name = "SUM")]
    fn sum() -> Self {
        PyReduceOp::of(RedOpType::Sum)
    }
    #[classattr]
    #[pyo3(name = "PRODUCT")]
    fn product() -> Self {
        PyReduceOp::of(RedOpType::Product)
    }
    #[classattr]
    #[pyo3(name = "MIN")]
    fn min() -> Self {
        PyReduceOp::of(RedOpType::Min)
    }
    #[classattr]
    #[pyo3(name = "MAX")]
    fn max() -> Self {
        PyReduceOp::of(RedOpType::Max)
    }
    #[classattr]
    #[pyo3(name = "BAND")]
    fn band() -> Self {
        PyReduceOp::of(RedOpType::BAnd)
    }
    #[classattr]
    #[pyo3(name = "BOR")]
    fn bor() -> Self {
        PyReduceOp::of(RedOpType::BOr)
    }
    #[classattr]
    #[pyo3(name = "BXOR")]
    fn bxor() -> Self {
        PyReduceOp::of(RedOpType::BXor)
    }
    #[classattr]
    #[pyo3(name = "AVG")]
    fn avg() -> Self {
        PyReduceOp::of(RedOpType::Avg)
    }

    /// Sum of inputs each multiplied by `factor` (a float, or a one-element tensor on any
    /// device).
    #[staticmethod]
    #[pyo3(name = "PREMUL_SUM")]
    fn premul_sum(factor: &Bound<'_, PyAny>) -> PyResult<Self> {
        let what = "ReduceOp.PREMUL_SUM: argument `factor`";
        let value: f64 = if let Ok(f) = factor.extract::<f64>() {
            f
        } else if factor.is_instance_of::<PyInt>() {
            return Err(value_error(format!(
                "{what} must be a float or a one-element tensor, got an int beyond the float \
                 range: {factor}"
            )));
        } else if factor.hasattr("item")? && factor.hasattr("numel")? {
            // `item()` itself refuses a tensor of several elements, whatever `numel()` says.
            factor
                .call_method0("item")
                .and_then(|v| v.extract::<f64>())
                .map_err(|e| {
                    value_error(format!(
                        "{what} must be a float or a one-element tensor, got a tensor of \
                         several elements or a non-number: {e}"
                    ))
                })?
        } else {
            return Err(type_error(format!(
                "ReduceOp.PREMUL_SUM: argument `factor` must be a float or a tensor, got {}",
                factor.get_type().name()?
            )));
        };
        Ok(PyReduceOp {
            kind: RedOpType::PremulSum,
            factor: Some(factor.clone().unbind()),
            factor_value: value,
        })
    }

    /// The operator's type.
    #[getter]
    fn r#type(&self) -> RedOpType {
        self.kind
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        if let Ok(o) = other.cast::<PyReduceOp>() {
            let o = o.get();
            return o.kind == self.kind
                && (self.kind != RedOpType::PremulSum || o.factor_value == self.factor_value);
        }
        if let Ok(t) = other.extract::<RedOpType>() {
            return t == self.kind;
        }
        false
    }

    fn __hash__(&self) -> u64 {
        (self.kind as u64) ^ self.factor_value.to_bits().rotate_left(8)
    }

    fn __repr__(&self) -> String {
        match self.kind {
            RedOpType::PremulSum => format!("ReduceOp.PREMUL_SUM({})", self.factor_value),
            k => format!("ReduceOp.{}", k.as_str()),
        }
    }

    fn __copy__(&self, py: Python<'_>) -> Self {
        self.copy(py)
    }

    fn __deepcopy__(&self, py: Python<'_>, _memo: &Bound<'_, PyAny>) -> Self {
        self.copy(py)
    }

    fn __reduce__(slf: &Bound<'_, Self>) -> PyResult<Py<PyTuple>> {
        // Pickles as the constructor call that rebuilds it.
        let py = slf.py();
        let me = slf.get();
        let t = match &me.factor {
            Some(f) => PyTuple::new(
                py,
                [
                    slf.get_type().getattr("PREMUL_SUM")?,
                    PyTuple::new(py, [f.bind(py)])?.into_any(),
                ],
            )?,
            None => PyTuple::new(
                py,
                [
                    slf.get_type().into_any(),
                    PyTuple::new(py, [Bound::new(py, me.kind)?.into_any()])?.into_any(),
                ],
            )?,
        };
        Ok(t.unbind())
    }
}

/// Reads a timeout given as `timedelta` or a number of seconds; `None` stays `None`.
pub(crate) fn timeout_arg(t: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<Duration>> {
    let Some(t) = t else { return Ok(None) };
    if t.is_none() {
        return Ok(None);
    }
    let out_of_range = || {
        value_error(format!(
            "{what}: invalid argument `timeout`: expected a non-negative datetime.timedelta or \
             number of seconds, got {t}"
        ))
    };
    if t.is_instance_of::<PyDelta>() {
        return t
            .extract::<Duration>()
            .map(Some)
            .map_err(|_| out_of_range());
    }
    if t.is_instance_of::<PyInt>() || t.is_instance_of::<PyFloat>() {
        // An int too large for a float, a negative or non-finite number.
        return t
            .extract::<f64>()
            .ok()
            .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
            .map(Some)
            .ok_or_else(out_of_range);
    }
    Err(type_error(format!(
        "{what}: argument `timeout` must be a datetime.timedelta, a number of seconds or None, \
         got {}",
        t.get_type().name()?
    )))
}

/// Options of a communicator (upstream's `CommOptions`); defaults come from the environment
/// (`TORCHCOMM_ABORT_ON_ERROR`, `TORCHCOMM_TIMEOUT_SECONDS`) at construction.
#[pyclass(module = "torchcomms._comms", name = "CommOptions", get_all, set_all)]
#[derive(Debug)]
pub(crate) struct PyCommOptions {
    /// Abort the process when an operation times out or fails.
    pub(crate) abort_process_on_timeout_or_error: bool,
    /// Init timeout and default per-operation timeout.
    pub(crate) timeout: Duration,
    /// A `torch.distributed.Store` to bootstrap through, or None.
    pub(crate) store: Option<Py<PyAny>>,
    /// Created for `reconfigure()` (Rust backends and the fake one).
    pub(crate) enable_reconfigure: bool,
    /// Backend hints.
    pub(crate) hints: HashMap<String, String>,
    /// GPU backends only.
    pub(crate) is_high_priority_stream: bool,
}

impl PyCommOptions {
    pub(crate) fn from_env() -> PyResult<PyCommOptions> {
        let o = torchcomms::CommOptions::from_env().py()?;
        Ok(PyCommOptions {
            abort_process_on_timeout_or_error: o.abort_process_on_timeout_or_error,
            timeout: o.timeout,
            store: None,
            enable_reconfigure: false,
            hints: HashMap::new(),
            is_high_priority_stream: false,
        })
    }

    pub(crate) fn copy(&self, py: Python<'_>) -> PyCommOptions {
        PyCommOptions {
            abort_process_on_timeout_or_error: self.abort_process_on_timeout_or_error,
            timeout: self.timeout,
            store: self.store.as_ref().map(|s| s.clone_ref(py)),
            enable_reconfigure: self.enable_reconfigure,
            hints: self.hints.clone(),
            is_high_priority_stream: self.is_high_priority_stream,
        }
    }
}

#[pymethods]
impl PyCommOptions {
    #[new]
    fn new() -> PyResult<Self> {
        PyCommOptions::from_env()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let store = match &self.store {
            Some(s) => s
                .bind(py)
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_else(|_| "<store>".into()),
            None => "None".into(),
        };
        let py_bool = |b: bool| if b { "True" } else { "False" };
        format!(
            "CommOptions(abort_process_on_timeout_or_error={}, timeout=datetime.timedelta(seconds={}), \
             store={store}, enable_reconfigure={}, hints={:?}, is_high_priority_stream={})",
            py_bool(self.abort_process_on_timeout_or_error),
            self.timeout.as_secs_f64(),
            py_bool(self.enable_reconfigure),
            self.hints,
            py_bool(self.is_high_priority_stream),
        )
    }
}

/// Options of `BatchSendRecv.issue` (a zero timeout means the communicator's).
#[pyclass(
    module = "torchcomms._comms",
    name = "BatchP2POptions",
    get_all,
    set_all
)]
#[derive(Debug, Default)]
pub(crate) struct PyBatchP2POptions {
    /// Backend hints.
    pub(crate) hints: HashMap<String, String>,
    /// Timeout of the batch; zero uses the communicator's.
    pub(crate) timeout: Duration,
}

#[pymethods]
impl PyBatchP2POptions {
    #[new]
    fn new() -> Self {
        PyBatchP2POptions::default()
    }
}

/// Options of `reconfigure()` (upstream passes them to backends; `TorchComm.reconfigure` takes
/// the same fields as arguments).
#[pyclass(
    module = "torchcomms._comms",
    name = "ReconfigureOptions",
    get_all,
    set_all
)]
#[derive(Debug)]
pub(crate) struct PyReconfigureOptions {
    uuid: i64,
    init_handles: Option<Py<PyAny>>,
    timeout: Option<Duration>,
    hints: HashMap<String, String>,
}

#[pymethods]
impl PyReconfigureOptions {
    #[new]
    #[pyo3(signature = (uuid=None, init_handles=None, timeout=None, hints=None))]
    fn new(
        uuid: Option<&Bound<'_, PyAny>>,
        init_handles: Option<Py<PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
        hints: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let op = "ReconfigureOptions";
        Ok(PyReconfigureOptions {
            uuid: match uuid.filter(|u| !u.is_none()) {
                Some(u) => crate::args::index_arg(u, op, "uuid")? as i64,
                None => 0,
            },
            init_handles,
            timeout: timeout_arg(timeout, op)?,
            hints: crate::args::hints_arg(hints, op)?.unwrap_or_default(),
        })
    }
}
