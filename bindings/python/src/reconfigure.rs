//! `get_init_handle()` and `reconfigure()` of communicators created with
//! `enable_reconfigure=True` on a Rust backend ([`torchcomms::Reconfigurer`] does the work):
//! the old communicator is finalized (aborted if its members do not all come within the
//! timeout), the new one is formed from the handles, and the Python object switches to it,
//! keeping its hooks, default timeout and hints.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyList, PySet, PyString};
use torchcomms::{Reconfigurer, TorchComm};

use crate::core::{Backend, CommCore, NativeComm};
use crate::error::{type_error, ResultExt};

/// The handles in rank order: a list as given, a set sorted (every member sorts alike).
pub(crate) fn handles_arg(init_handles: &Bound<'_, PyAny>, tag: &str) -> PyResult<Vec<String>> {
    let is_set = init_handles.is_instance_of::<PySet>();
    if !(is_set || init_handles.is_instance_of::<PyList>()) {
        return Err(type_error(format!(
            "{tag}: argument `init_handles` must be a list or set of str, got {}",
            init_handles.get_type().name()?
        )));
    }
    let mut handles = Vec::new();
    for h in init_handles.try_iter()? {
        let h = h?;
        if !h.is_instance_of::<PyString>() {
            return Err(type_error(format!(
                "{tag}: argument `init_handles` must be a list or set of str, got an element of type {}",
                h.get_type().name()?
            )));
        }
        handles.push(h.extract::<String>()?);
    }
    if is_set {
        handles.sort();
    }
    Ok(handles)
}

/// Finalizes `old` (a barrier of its members) within `deadline`; aborts it if they do not all
/// come, so a member that died or left never holds the survivors.
fn retire(old: &Arc<CommCore>, deadline: Duration) {
    let Backend::Native(_) = &old.backend else {
        return;
    };
    let (tx, rx) = mpsc::channel();
    let finishing = Arc::clone(old);
    std::thread::spawn(move || {
        if let Backend::Native(c) = &finishing.backend {
            let _ = tx.send(c.finalize());
        }
    });
    match rx.recv_timeout(deadline) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::info!(comm = %old.name, "reconfigure: the old communicator ended with: {e}")
        }
        Err(_) => {
            tracing::warn!(comm = %old.name, ?deadline, "reconfigure: not every old member finalized in time; aborting the old communicator");
            if let Backend::Native(c) = &old.backend {
                let _ = c.abort();
            }
        }
    }
}

/// Forms the communicator of `handles` and returns its state, sharing `old`'s hooks and
/// settings.
pub(crate) fn reconfigure(
    py: Python<'_>,
    reconfigurer: &Reconfigurer,
    old: &Arc<CommCore>,
    uuid: u64,
    handles: &[String],
    timeout: Option<Duration>,
) -> PyResult<CommCore> {
    // Checked before the old communicator is touched: a bad list changes nothing.
    reconfigurer.rank_among(handles).on_rank(old.rank)?;
    let deadline = timeout.unwrap_or(old.settings().timeout);
    let comm: TorchComm = py
        .detach(|| {
            retire(old, deadline);
            reconfigurer.reconfigure(uuid, handles, Some(deadline))
        })
        .on_rank(old.rank)?;
    let (rank, size) = (comm.get_rank(), comm.get_size());
    let core = CommCore::new(
        Backend::Native(NativeComm::new(comm)),
        &old.backend_name,
        &old.name,
        (rank, size),
        old.device.clone_ref(py),
        old.options.copy(py),
    );
    Ok(core.continuing(old))
}

/// Bytes of device memory and of pinned host memory the engine holds in this process now
/// (`(device, pinned)`): zero once every communicator is gone, which the recovery tests check
/// after reconfigurations.
#[pyfunction]
pub(crate) fn _cuda_bytes_held() -> (u64, u64) {
    torchcomms_cuda::live_bytes()
}
