//! Persistent all-gather (upstream's `all_gather_p_init` / `_exec` / `_free`): `init` binds an
//! output tensor and returns an `AllGatherPHandle`; `all_gather_p_exec` (an operation of the
//! table, `ops.rs`) gathers every rank's input into it.

use pyo3::prelude::*;
use torchcomms::AllGatherP;

use crate::args::hints_arg;
use crate::comm::PyTorchComm;
use crate::core::Backend;
use crate::error::{guard, not_implemented, type_error, ResultExt};
use crate::tensor::to_tensor;
use crate::types::timeout_arg;

/// The handle of a persistent all-gather: the output every `all_gather_p_exec` fills.
#[pyclass(module = "torchcomms._comms", name = "AllGatherPHandle", frozen)]
#[derive(Debug)]
pub(crate) struct PyAllGatherP {
    pub(crate) handle: AllGatherP,
    /// The output tensor (the handle's tensor holds it too; this is what Python sees).
    output: Py<PyAny>,
}

#[pymethods]
impl PyAllGatherP {
    /// The output tensor every execution fills.
    #[getter]
    fn output(&self, py: Python<'_>) -> Py<PyAny> {
        self.output.clone_ref(py)
    }

    /// Whether executions put straight into every peer's output through a window over it
    /// (backends with windows for the output's device), rather than running an all-gather.
    #[getter]
    fn uses_window(&self) -> bool {
        self.handle.uses_window()
    }

    fn __repr__(&self) -> String {
        format!(
            "AllGatherPHandle({} elements, {})",
            self.handle.output().numel(),
            if self.handle.uses_window() {
                "on a window"
            } else {
                "as all_gather"
            }
        )
    }
}

/// The handle an `all_gather_p_exec` argument holds, for the API.
pub(crate) fn persistent_arg(obj: &Bound<'_, PyAny>, op: &str, arg: &str) -> PyResult<AllGatherP> {
    let h = obj.cast::<PyAllGatherP>().map_err(|_| {
        type_error(format!(
            "{op}: argument `{arg}` must be an AllGatherPHandle from all_gather_p_init, got {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    Ok(h.get().handle.clone())
}

#[pymethods]
impl PyTorchComm {
    /// Binds `output` (size equal blocks) for `all_gather_p_exec`, which gathers every rank's
    /// input into it; returns the handle. `hints={"window": "true"}` runs executions as
    /// one-sided puts into a window over the output (collective then); "auto" (the default)
    /// and "false" run the backend's all-gather.
    #[pyo3(signature = (output, hints=None, timeout=None))]
    fn all_gather_p_init(
        &self,
        py: Python<'_>,
        output: &Bound<'_, PyAny>,
        hints: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let core = &self.core();
        let op = "all_gather_p_init";
        timeout_arg(timeout, &core.tag(op))?;
        let hints: torchcomms::Hints = hints_arg(hints, &core.tag(op))?
            .unwrap_or_default()
            .into_iter()
            .collect();
        guard(op, || match &core.backend {
            Backend::Native(comm) => {
                let t = to_tensor(output, &core.tag(op), "output")?;
                let handle = comm.all_gather_p_init(&t, &hints).on_rank(core.rank)?;
                let h = PyAllGatherP {
                    handle,
                    output: output.clone().unbind(),
                };
                Ok(Py::new(py, h)?.into_any())
            }
            Backend::Python(b) => {
                let b = b.bind(py);
                if !b.hasattr(op)? {
                    return Err(not_implemented(op, &core.name));
                }
                Ok(b.call_method1(op, (output,))?.unbind())
            }
        })
    }

    /// Releases a handle of `all_gather_p_init`.
    fn all_gather_p_free(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<()> {
        let core = &self.core();
        let op = "all_gather_p_free";
        guard(op, || match &core.backend {
            Backend::Native(comm) => {
                let h = persistent_arg(handle, &core.tag(op), "handle")?;
                comm.all_gather_p_free(h).on_rank(core.rank)
            }
            Backend::Python(b) => {
                let b = b.bind(py);
                if !b.hasattr(op)? {
                    return Err(not_implemented(op, &core.name));
                }
                b.call_method1(op, (handle,))?;
                Ok(())
            }
        })
    }
}
