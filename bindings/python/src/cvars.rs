//! `_comms._cvar(name)`: the effective value of a cvar for the pure-Python half of the package,
//! so that its knobs (`TORCHCOMMS_SERIALIZATION`, `TORCHCOMM_FR_*`, ...) come from the same
//! declarations, configuration file (`TORCHCOMMS_CONFIG`) and validation as the engine's.

use pyo3::prelude::*;
use pyo3::types::PyList;
use torchcomms_cvars::{names, parse_bool, parse_bytes, parse_duration, Cvars, Entry, Kind, Spec};

use crate::error::value_error;

/// The Python value of a loaded cvar (`None` when unset).
fn to_python(py: Python<'_>, e: &Entry) -> PyResult<Py<PyAny>> {
    if !e.is_set {
        return Ok(py.None());
    }
    let v = e.value.as_str();
    let bad = || {
        value_error(format!(
            "{}: canonical value {v:?} does not parse",
            e.spec.name
        ))
    };
    Ok(match e.spec.kind {
        Kind::Bool => parse_bool(v)
            .ok_or_else(bad)?
            .into_pyobject(py)?
            .to_owned()
            .into_any()
            .unbind(),
        Kind::Int => v
            .parse::<u64>()
            .map_err(|_| bad())?
            .into_pyobject(py)?
            .into_any()
            .unbind(),
        Kind::Bytes => parse_bytes(v)
            .ok_or_else(bad)?
            .into_pyobject(py)?
            .into_any()
            .unbind(),
        Kind::Float => v
            .parse::<f64>()
            .map_err(|_| bad())?
            .into_pyobject(py)?
            .into_any()
            .unbind(),
        Kind::Duration => parse_duration(v, e.spec.unit)
            .ok_or_else(bad)?
            .as_secs_f64()
            .into_pyobject(py)?
            .into_any()
            .unbind(),
        Kind::List => {
            let items: Vec<&str> = v.split(',').filter(|s| !s.is_empty()).collect();
            PyList::new(py, items)?.into_any().unbind()
        }
        // String, Enum, Ip, Addr and kinds added later: the canonical text.
        _ => v.into_pyobject(py)?.into_any().unbind(),
    })
}

/// The effective value of the cvar `name` (declared in `cvars/cvars.toml`), loaded now from
/// the defaults, the `TORCHCOMMS_CONFIG` file and the environment: `bool`, `int` (ints and byte
/// counts), `float` (floats, and durations in seconds), `list[str]`, `str`, or `None` when
/// unset. An invalid value of it (or a bad configuration file) raises `CommValueError` naming
/// the variable, the value, its source and what is allowed, as communicator creation does.
#[pyfunction]
pub(crate) fn _cvar(py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
    if Spec::find(name).is_none() {
        return Err(value_error(format!(
            "{name} is not a declared cvar (see docs/cvars.md)"
        )));
    }
    // Only this variable (and the file) from the environment: an invalid value of another
    // variable fails communicator creation, not this lookup.
    let cv = Cvars::load_from(|k| {
        (k == name || k == names::TORCHCOMMS_CONFIG)
            .then(|| std::env::var(k).ok())
            .flatten()
    })
    .map_err(|e| value_error(e.to_string()))?;
    let entry = cv
        .entry(name)
        .ok_or_else(|| value_error(format!("{name} is not a declared cvar")))?;
    to_python(py, entry)
}
