//! Pre-, post- and abort hooks (upstream §12): one process-wide op id counter shared by every
//! communicator, per-communicator hook lists, and the read-only argument objects hooks receive.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Weak};

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::types::OpName;

static NEXT_OP_ID: AtomicU64 = AtomicU64::new(0);

/// The op id `finalize` passes to hooks: it consumes no id (upstream's `SIZE_MAX`).
pub(crate) const FINALIZE_OP_ID: u64 = u64::MAX;

/// The next process-wide operation id.
pub(crate) fn next_op_id() -> u64 {
    NEXT_OP_ID.fetch_add(1, Ordering::Relaxed)
}

/// Resets the process-wide op id counter (an isolated FlightRecorderHook does this).
#[pyfunction]
pub(crate) fn _reset_op_id_counter() {
    NEXT_OP_ID.store(0, Ordering::Relaxed);
}

/// The id the next operation will get (for tests and recorders).
#[pyfunction]
pub(crate) fn _peek_next_op_id() -> u64 {
    NEXT_OP_ID.load(Ordering::Relaxed)
}

/// Which list a hook lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HookKind {
    Pre,
    Post,
    Abort,
}

/// The hooks of one communicator.
#[derive(Debug, Default)]
pub(crate) struct Hooks {
    next_id: u64,
    list: Vec<(u64, HookKind, Py<PyAny>)>,
}

impl Hooks {
    pub(crate) fn add(&mut self, kind: HookKind, cb: Py<PyAny>) -> u64 {
        self.next_id += 1;
        self.list.push((self.next_id, kind, cb));
        self.next_id
    }

    pub(crate) fn remove(&mut self, id: u64) {
        self.list.retain(|(i, _, _)| *i != id);
    }

    /// Every callback (for the garbage collector).
    pub(crate) fn all(&self) -> impl Iterator<Item = &Py<PyAny>> {
        self.list.iter().map(|(_, _, cb)| cb)
    }

    /// Drops every callback (the garbage collector breaking a cycle).
    pub(crate) fn clear(&mut self) {
        self.list.clear();
    }

    /// The callbacks of `kind`, in registration order (cloned, so hooks may register or remove
    /// hooks while they run).
    pub(crate) fn of(&self, py: Python<'_>, kind: HookKind) -> Vec<Py<PyAny>> {
        self.list
            .iter()
            .filter(|(_, k, _)| *k == kind)
            .map(|(_, _, cb)| cb.clone_ref(py))
            .collect()
    }
}

/// Something that owns a hook list (a communicator).
pub(crate) trait HookOwner: Send + Sync {
    fn hooks(&self) -> &Mutex<Hooks>;
}

/// Returned by `register_*_hook`; `remove()` unregisters the hook. Dropping it keeps the hook.
#[pyclass(module = "torchcomms._comms", name = "RemovableHandle", frozen)]
pub(crate) struct RemovableHandle {
    owner: Weak<dyn HookOwner>,
    id: u64,
}

impl std::fmt::Debug for RemovableHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemovableHandle({})", self.id)
    }
}

impl RemovableHandle {
    pub(crate) fn new(owner: Weak<dyn HookOwner>, id: u64) -> Self {
        RemovableHandle { owner, id }
    }
}

#[pymethods]
impl RemovableHandle {
    /// Unregisters the hook (a no-op once the communicator is gone or the hook was removed).
    fn remove(&self) {
        if let Some(o) = self.owner.upgrade() {
            o.hooks()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(self.id);
        }
    }
}

/// Defines a read-only hook-argument class. Fields are Python objects (the caller's tensors
/// themselves, ints, lists); `hidden` fields start with `_` and are not part of upstream's API
/// (our Python hooks use them: the reduce op, the work, the new communicator).
macro_rules! hook_args {
    ($(#[$doc:meta])* $rust:ident, $py:literal { $($field:ident),* } hidden { $($hfield:ident => $hname:literal),* }) => {
        $(#[$doc])*
        #[pyclass(module = "torchcomms._comms", name = $py, frozen)]
        #[derive(Debug)]
        pub(crate) struct $rust {
            $(#[pyo3(get)] pub(crate) $field: Py<PyAny>,)*
            $(#[pyo3(get, name = $hname)] pub(crate) $hfield: Py<PyAny>,)*
        }

        #[pymethods]
        impl $rust {
            #[allow(unused_mut, unused_variables)]
            fn __repr__(&self, py: Python<'_>) -> String {
                let mut parts: Vec<String> = Vec::new();
                $(parts.push(format!("{}={}", stringify!($field),
                    self.$field.bind(py).repr().map(|r| r.to_string()).unwrap_or_default()));)*
                format!("{}({})", $py, parts.join(", "))
            }
        }
    };
}

hook_args!(SendPreHookArgs, "SendPreHookArgs" { tensor, peer, async_op } hidden {});
hook_args!(RecvPreHookArgs, "RecvPreHookArgs" { tensor, peer, async_op } hidden {});
hook_args!(BroadcastPreHookArgs, "BroadcastPreHookArgs" { tensor, root, async_op } hidden {});
hook_args!(AllReducePreHookArgs, "AllReducePreHookArgs" { tensor, async_op } hidden { red_op => "_op" });
hook_args!(ReducePreHookArgs, "ReducePreHookArgs" { tensor, root, async_op } hidden { red_op => "_op" });
hook_args!(AllGatherPreHookArgs, "AllGatherPreHookArgs" { input, output, async_op } hidden {});
hook_args!(AllGatherVPreHookArgs, "AllGatherVPreHookArgs" { input, output, async_op } hidden {});
hook_args!(AllGatherSinglePreHookArgs, "AllGatherSinglePreHookArgs" { input, output, async_op } hidden {});
hook_args!(ReduceScatterPreHookArgs, "ReduceScatterPreHookArgs" { input, output, async_op } hidden { red_op => "_op" });
hook_args!(ReduceScatterVPreHookArgs, "ReduceScatterVPreHookArgs" { input, output, async_op } hidden { red_op => "_op" });
hook_args!(ReduceScatterSinglePreHookArgs, "ReduceScatterSinglePreHookArgs" { input, output, async_op } hidden { red_op => "_op" });
hook_args!(AllToAllSinglePreHookArgs, "AllToAllSinglePreHookArgs" { input, output, async_op } hidden {});
hook_args!(AllToAllVSinglePreHookArgs, "AllToAllVSinglePreHookArgs" { input, output, input_split_sizes, output_split_sizes, async_op } hidden {});
hook_args!(AllToAllPreHookArgs, "AllToAllPreHookArgs" { input, output, async_op } hidden {});
hook_args!(BarrierPreHookArgs, "BarrierPreHookArgs" { async_op } hidden {});
hook_args!(ScatterPreHookArgs, "ScatterPreHookArgs" { output, input, root, async_op } hidden {});
hook_args!(GatherPreHookArgs, "GatherPreHookArgs" { input, output, root, async_op } hidden {});
hook_args!(GatherSinglePreHookArgs, "GatherSinglePreHookArgs" { input, output, root, async_op } hidden {});
hook_args!(SplitPreHookArgs, "SplitPreHookArgs" { ranks, name } hidden {});
hook_args!(NewWindowPreHookArgs, "NewWindowPreHookArgs" {} hidden {});
hook_args!(BatchOpIssuePreHookArgs, "BatchOpIssuePreHookArgs" { num_ops, async_op } hidden {});
hook_args!(FinalizePreHookArgs, "FinalizePreHookArgs" {} hidden {});
hook_args!(CollectivePostHookArgs, "CollectivePostHookArgs" {} hidden { work => "_work" });
hook_args!(SplitPostHookArgs, "SplitPostHookArgs" {} hidden { new_comm => "_new_comm" });
hook_args!(NewWindowPostHookArgs, "NewWindowPostHookArgs" {} hidden {});
hook_args!(BatchOpIssuePostHookArgs, "BatchOpIssuePostHookArgs" {} hidden { work => "_work" });
hook_args!(FinalizePostHookArgs, "FinalizePostHookArgs" {} hidden {});

/// Registers the hook-argument classes in the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RemovableHandle>()?;
    m.add_class::<SendPreHookArgs>()?;
    m.add_class::<RecvPreHookArgs>()?;
    m.add_class::<BroadcastPreHookArgs>()?;
    m.add_class::<AllReducePreHookArgs>()?;
    m.add_class::<ReducePreHookArgs>()?;
    m.add_class::<AllGatherPreHookArgs>()?;
    m.add_class::<AllGatherVPreHookArgs>()?;
    m.add_class::<AllGatherSinglePreHookArgs>()?;
    m.add_class::<ReduceScatterPreHookArgs>()?;
    m.add_class::<ReduceScatterVPreHookArgs>()?;
    m.add_class::<ReduceScatterSinglePreHookArgs>()?;
    m.add_class::<AllToAllSinglePreHookArgs>()?;
    m.add_class::<AllToAllVSinglePreHookArgs>()?;
    m.add_class::<AllToAllPreHookArgs>()?;
    m.add_class::<BarrierPreHookArgs>()?;
    m.add_class::<ScatterPreHookArgs>()?;
    m.add_class::<GatherPreHookArgs>()?;
    m.add_class::<GatherSinglePreHookArgs>()?;
    m.add_class::<SplitPreHookArgs>()?;
    m.add_class::<NewWindowPreHookArgs>()?;
    m.add_class::<BatchOpIssuePreHookArgs>()?;
    m.add_class::<FinalizePreHookArgs>()?;
    m.add_class::<CollectivePostHookArgs>()?;
    m.add_class::<SplitPostHookArgs>()?;
    m.add_class::<NewWindowPostHookArgs>()?;
    m.add_class::<BatchOpIssuePostHookArgs>()?;
    m.add_class::<FinalizePostHookArgs>()?;
    m.add_function(wrap_pyfunction!(_reset_op_id_counter, m)?)?;
    m.add_function(wrap_pyfunction!(_peek_next_op_id, m)?)?;
    Ok(())
}

/// Calls every pre-hook of `owner` with `(name, op_id, args)`; the first exception stops the
/// operation (a NaN check, say).
pub(crate) fn run_pre(
    py: Python<'_>,
    owner: &dyn HookOwner,
    name: OpName,
    op_id: u64,
    args: impl FnOnce(Python<'_>) -> PyResult<Py<PyAny>>,
) -> PyResult<()> {
    let cbs = owner
        .hooks()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .of(py, HookKind::Pre);
    if cbs.is_empty() {
        return Ok(());
    }
    let args = args(py)?;
    for cb in cbs {
        cb.call1(py, (name, op_id, args.clone_ref(py)))?;
    }
    Ok(())
}

/// Calls every post-hook of `owner` with `(op_id, args)`.
pub(crate) fn run_post(
    py: Python<'_>,
    owner: &dyn HookOwner,
    op_id: u64,
    args: impl FnOnce(Python<'_>) -> PyResult<Py<PyAny>>,
) -> PyResult<()> {
    let cbs = owner
        .hooks()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .of(py, HookKind::Post);
    if cbs.is_empty() {
        return Ok(());
    }
    let args = args(py)?;
    for cb in cbs {
        cb.call1(py, (op_id, args.clone_ref(py)))?;
    }
    Ok(())
}

/// Calls every abort hook of `owner`; errors are printed, never raised (an abort follows).
pub(crate) fn run_abort(py: Python<'_>, owner: &dyn HookOwner) {
    let cbs = owner
        .hooks()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .of(py, HookKind::Abort);
    for cb in cbs {
        if let Err(e) = cb.call1(py, PyTuple::empty(py)) {
            e.print(py);
        }
    }
}
