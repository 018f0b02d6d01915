//! Python arguments of the operations: converting them to the API's values (per argument kind
//! of the table, see `ops.rs`) and back into the Python objects hooks and Python backends get.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyList, PyTuple};

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

/// The name of `obj`'s type, for messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// An integer argument: `Some` when it fits in an i64, `None` for an int outside that range
/// (the caller says which range it expects), a `CommTypeError` for anything else.
pub(crate) fn int_arg(obj: &Bound<'_, PyAny>, op: &str, arg: &str) -> PyResult<Option<i64>> {
    match obj.extract::<i64>() {
        Ok(v) => Ok(Some(v)),
        Err(_) if obj.is_instance_of::<PyInt>() => Ok(None),
        Err(_) => Err(type_error(format!(
            "{op}: argument `{arg}` must be an int, got {}",
            type_name(obj)
        ))),
    }
}

/// A non-negative integer argument below 2**63 (an id).
pub(crate) fn index_arg(obj: &Bound<'_, PyAny>, op: &str, arg: &str) -> PyResult<u64> {
    match int_arg(obj, op, arg)? {
        Some(v) if v >= 0 => Ok(v as u64),
        _ => Err(value_error(format!(
            "{op}: invalid argument `{arg}`: expected an int in range [0, 2**63), got {obj}"
        ))),
    }
}

/// A bool argument (only `True`/`False`: an int here is usually a misplaced positional).
pub(crate) fn bool_arg(obj: &Bound<'_, PyAny>, op: &str, arg: &str) -> PyResult<bool> {
    match obj.cast::<PyBool>() {
        Ok(b) => Ok(b.is_true()),
        Err(_) => Err(type_error(format!(
            "{op}: argument `{arg}` must be a bool, got {}",
            type_name(obj)
        ))),
    }
}

/// An optional bool argument (`None` is absent).
pub(crate) fn opt_bool_arg(
    obj: Option<&Bound<'_, PyAny>>,
    op: &str,
    arg: &str,
) -> PyResult<Option<bool>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => bool_arg(o, op, arg).map(Some),
    }
}

/// A str argument.
pub(crate) fn str_arg(obj: &Bound<'_, PyAny>, op: &str, arg: &str) -> PyResult<String> {
    obj.extract::<String>().map_err(|_| {
        type_error(format!(
            "{op}: argument `{arg}` must be a str, got {}",
            type_name(obj)
        ))
    })
}

/// The `hints` argument: a `dict[str, str]` or None.
pub(crate) fn hints_arg(
    obj: Option<&Bound<'_, PyAny>>,
    op: &str,
) -> PyResult<Option<HashMap<String, String>>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => o.extract().map(Some).map_err(|_| {
            type_error(format!(
                "{op}: argument `hints` must be a dict[str, str] or None, got {}",
                type_name(o)
            ))
        }),
    }
}

/// A callable argument (a hook).
pub(crate) fn callable_arg(obj: &Bound<'_, PyAny>, op: &str, arg: &str) -> PyResult<Py<PyAny>> {
    if !obj.is_callable() {
        return Err(type_error(format!(
            "{op}: argument `{arg}` must be callable, got {}",
            type_name(obj)
        )));
    }
    Ok(obj.clone().unbind())
}

/// Split sizes: a list of ints in range [0, 2**63) (their sum is checked by the API).
pub(crate) fn splits(obj: &Bound<'_, PyAny>, op: &str, arg: &str) -> PyResult<Vec<usize>> {
    let items: Vec<Bound<'_, PyAny>> = if let Ok(l) = obj.cast::<PyList>() {
        l.iter().collect()
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        t.iter().collect()
    } else {
        return Err(type_error(format!(
            "{op}: argument `{arg}` must be a list of int, got {}",
            type_name(obj)
        )));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, x)| match int_arg(x, op, &format!("{arg}[{i}]"))? {
            Some(v) if v >= 0 => usize::try_from(v).map_err(|_| split_range(op, arg, x)),
            _ => Err(split_range(op, arg, x)),
        })
        .collect()
}

fn split_range(op: &str, arg: &str, x: &Bound<'_, PyAny>) -> PyErr {
    value_error(format!(
        "{op}: invalid argument `{arg}`: split sizes must be >= 0 and < 2**63, got {x}"
    ))
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
