//! # torchcomms._comms
//!
//! The compiled half of the `torchcomms` Python package: torchcomms' Python API (communicators,
//! work handles, reduce ops, options, hooks, batches, Python backends) on the TorchComm API
//! crate and the ctran engine. The pure-Python half (`python/torchcomms/`) re-exports it and
//! adds `objcol`, `hooks` and backend discovery.
//!
//! Threading: every call that can block (init, synchronous operations, `wait()`, `split`,
//! `finalize`) releases the GIL. Tensors are read through torch's base class and checked
//! against their storage ([`tensor`]); the Python tensor and storage objects are handed to the
//! engine as the owner of the memory, so async operations keep their tensors alive. Errors map
//! once, in [`error`], and no Rust panic reaches Python ([`error::guard`]).
//!
//! Logging: the engine logs through `tracing`; set the cvar `TORCHCOMMS_LOG` (an `EnvFilter`,
//! e.g. `debug` or `ctran=trace`; environment or `TORCHCOMMS_CONFIG` file) to see it on stderr.
//! The default shows errors only.

mod args;
mod batch;
mod comm;
mod completion;
mod core;
mod create;
mod cvars;
mod error;
mod extent;
mod fake;
mod hooks;
mod moe;
mod ops;
mod persistent;
mod rdma;
mod reconfigure;
mod store;
mod stream;
mod tensor;
mod types;
mod watchdog;
mod window;
mod work;

use pyo3::prelude::*;

// Linking the backend crates registers `ctran` and `nccl` (libnccl loads at run time, on first
// use of the `nccl` backend: the wheel links no CUDA library).
use torchcomms_ctran as _;
use torchcomms_nccl as _;

fn init_logging() {
    // `TORCHCOMMS_LOG` through the cvars (the configuration file may set it too); an invalid
    // configuration leaves the defaults here and fails communicator creation.
    let filter = torchcomms_cvars::Cvars::load()
        .map(|cv| cv.torchcomms_log().to_string())
        .unwrap_or_else(|_| "error".into());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    // Another library may have installed a subscriber already: keep it.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Where libnccl was found and its version, or why it cannot be used here (`nccl` backend).
#[pyfunction]
#[pyo3(name = "_nccl_info")]
fn nccl_info() -> String {
    match (
        torchcomms_nccl::nccl_version(),
        torchcomms_nccl::nccl_path(),
    ) {
        (Ok(v), Ok(p)) => format!("NCCL {v} ({})", p.display()),
        (Err(e), _) | (_, Err(e)) => format!("unavailable: {e}"),
    }
}

/// The colltrace records of every communicator of this process (the engine's flight recorder),
/// as the JSON of `colltrace::snapshot` (a list of per-rank dumps, schema
/// `docs/colltrace-schema.md`). `FlightRecorderHook` reads operation states and times from it.
#[pyfunction]
fn _colltrace_snapshot(py: Python<'_>) -> PyResult<String> {
    let dumps =
        py.detach(|| colltrace::snapshot(colltrace::Trigger::Api, Some("FlightRecorderHook")));
    serde_json::to_string(&dumps)
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(format!("colltrace snapshot: {e}")))
}

/// Tells the CUDA loader where this interpreter's NVIDIA wheels are (`nvidia.__path__`), so
/// NCCL and NVRTC load from the same wheels as PyTorch's, found without starting a process.
fn register_nvidia_wheels(py: Python<'_>) {
    let Ok(nvidia) = py.import("nvidia") else {
        return; // no NVIDIA wheels in this environment
    };
    let paths = nvidia.getattr("__path__").and_then(|p| {
        py.import("builtins")?
            .getattr("list")?
            .call1((p,))?
            .extract::<Vec<std::path::PathBuf>>()
    });
    match paths {
        Ok(p) => torchcomms_cuda::libs::add_nvidia_roots(p),
        Err(e) => tracing::debug!("nvidia.__path__: {e}"),
    }
}

/// Panics inside [`error::guard`], as a bug in an entry point would: tests check that Python
/// sees `CommInternalError` (a `RuntimeError`), never pyo3's `PanicException`.
#[pyfunction]
fn _panic_for_test(message: &str) -> PyResult<()> {
    error::guard("_panic_for_test", || panic!("{message}"))
}

#[pymodule]
fn _comms(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logging();
    register_nvidia_wheels(m.py());
    fake::register();
    error::register(m)?;
    hooks::register(m)?;
    m.add_class::<types::RedOpType>()?;
    m.add_class::<types::WorkStatus>()?;
    m.add_class::<types::P2POpType>()?;
    m.add_class::<types::WinAccessType>()?;
    m.add_class::<types::OpName>()?;
    m.add_class::<types::PyReduceOp>()?;
    m.add_class::<types::PyCommOptions>()?;
    m.add_class::<types::PyBatchP2POptions>()?;
    m.add_class::<types::PyReconfigureOptions>()?;
    m.add_class::<work::PyTorchWork>()?;
    m.add_class::<comm::PyTorchComm>()?;
    m.add_class::<persistent::PyAllGatherP>()?;
    m.add_class::<moe::PyMoeBuffer>()?;
    m.add_class::<moe::PyMoeHandle>()?;
    m.add_class::<create::PyTorchCommBackend>()?;
    m.add_class::<window::PyTorchCommWindow>()?;
    m.add_class::<window::PyWindowAttr>()?;
    m.add_class::<window::PyRegisteredBuffer>()?;
    m.add_class::<batch::PyBatchSendRecv>()?;
    m.add_class::<batch::PyP2POp>()?;
    rdma::register(m)?;
    m.add_function(wrap_pyfunction!(create::new_comm, m)?)?;
    m.add_function(wrap_pyfunction!(create::register_backend, m)?)?;
    m.add_function(wrap_pyfunction!(create::_is_backend_registered, m)?)?;
    m.add_function(wrap_pyfunction!(create::_registered_backends, m)?)?;
    m.add_function(wrap_pyfunction!(create::get_mem_allocator, m)?)?;
    m.add_function(wrap_pyfunction!(_colltrace_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    m.add_function(wrap_pyfunction!(cvars::_cvar, m)?)?;
    m.add_function(wrap_pyfunction!(watchdog::_health_check, m)?)?;
    m.add_function(wrap_pyfunction!(reconfigure::_cuda_bytes_held, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("_ENGINE_VERSION", torchcomms_ctran::VERSION)?;
    m.add_function(wrap_pyfunction!(nccl_info, m)?)?;
    Ok(())
}
