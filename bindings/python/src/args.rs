//! Python arguments of the operations: converting them to the API's values (per argument kind
//! of the table, see `ops.rs`) and back into the Python objects hooks and Python backends get.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::error::{type_error, value_error};
use crate::tensor::seq_items;

/// The object itself, as a new reference.
pub(crate) fn obj(b: &Bound<'_, PyAny>) -> Py<PyAny> {
    b.clone().unbind()
}

/// A Python bool.
pub(crate) fn pybool(py: Python<'_>, v: bool) -> Py<PyAny> {
    pyo3::types::PyBool::new(py, v)
        .to_owned()
        .into_any()
        .unbind()
}

/// A tuple of `items`.
pub(crate) fn tuple<'py>(py: Python<'py>, items: Vec<Py<PyAny>>) -> PyResult<Py<PyTuple>> {
    Ok(PyTuple::new(py, items)?.unbind())
}

/// A new Python object of class `T`.
pub(crate) fn pre<T: pyo3::PyClass + Into<pyo3::PyClassInitializer<T>>>(
    py: Python<'_>,
    v: T,
) -> PyResult<Py<PyAny>> {
    Ok(Py::new(py, v)?.into_any())
}

/// An integer argument (a rank).
pub(crate) fn int_arg(obj: &Bound<'_, PyAny>, op: &str, arg: &str) -> PyResult<i64> {
    obj.extract::<i64>().map_err(|_| {
        type_error(format!(
            "{op}: argument `{arg}` must be an int, got {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })
}

/// Split sizes: non-negative integers.
pub(crate) fn splits(obj: &Bound<'_, PyAny>, op: &str, arg: &str) -> PyResult<Vec<usize>> {
    let v: Vec<i64> = obj
        .extract()
        .map_err(|_| type_error(format!("{op}: argument `{arg}` must be a list of int")))?;
    v.iter()
        .map(|&x| {
            usize::try_from(x).map_err(|_| {
                value_error(format!(
                    "{op}: invalid argument `{arg}`: split sizes must be >= 0, got {x}"
                ))
            })
        })
        .collect()
}

/// What a hook record holds for an argument: the caller's object, except that lists are
/// copied (a record never aliases the caller's list).
pub(crate) fn hook_value(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    op: &str,
    arg: &str,
) -> PyResult<Py<PyAny>> {
    if value.cast::<PyList>().is_ok() || value.cast::<PyTuple>().is_ok() {
        return Ok(PyList::new(py, seq_items(value, op, arg)?)?
            .into_any()
            .unbind());
    }
    Ok(obj(value))
}
