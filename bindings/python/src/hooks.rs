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

/// Defines a read-only hook-argument class, named in Python as in Rust. Fields are Python
/// objects (the caller's tensors themselves, ints, lists); fields named `_x` are not part of
/// upstream's API (our Python hooks use them: the reduce op, the work, the new communicator)
/// and `repr()` leaves them out.
macro_rules! hook_args {
    ($(#[$doc:meta])* $name:ident { $($field:ident),* $(,)? }) => {
        $(#[$doc])*
        #[pyclass(module = "torchcomms._comms", frozen)]
        #[derive(Debug)]
        pub(crate) struct $name {
            $(#[pyo3(get)] pub(crate) $field: Py<PyAny>,)*
        }

        #[pymethods]
        impl $name {
            #[allow(unused_mut, unused_variables)]
            fn __repr__(&self, py: Python<'_>) -> String {
                let mut parts: Vec<String> = Vec::new();
                $(if !stringify!($field).starts_with('_') {
                    parts.push(format!("{}={}", stringify!($field),
                        self.$field.bind(py).repr().map(|r| r.to_string()).unwrap_or_default()));
                })*
                format!("{}({})", stringify!($name), parts.join(", "))
            }
        }
    };
}

/// The pre-hook record of every operation of the table: upstream's fields, then `async_op`.
macro_rules! pre_hook_classes {
    ($([$name:ident $id:literal $doc:tt $args:tt [$($field:ident $from:ident)*] $($rest:tt)*])*) => { pastey::paste! {
        $(hook_args!(
            #[doc = concat!("What pre-hooks get for `", stringify!($name), "`.")]
            [<$name:camel PreHookArgs>] { $($field,)* async_op }
        );)*

        /// Registers the pre-hook classes of the table's operations.
        fn register_pre_hook_classes(m: &Bound<'_, PyModule>) -> PyResult<()> {
            $(m.add_class::<[<$name:camel PreHookArgs>]>()?;)*
            Ok(())
        }
    }};
}

torchcomms_core::for_each_op!(pre_hook_classes);

hook_args!(SplitPreHookArgs { ranks, name });
hook_args!(NewWindowPreHookArgs {});
hook_args!(BatchOpIssuePreHookArgs { num_ops, async_op });
hook_args!(FinalizePreHookArgs {});
hook_args!(CollectivePostHookArgs { _work });
hook_args!(SplitPostHookArgs { _new_comm });
hook_args!(NewWindowPostHookArgs {});
hook_args!(BatchOpIssuePostHookArgs { _work });
hook_args!(FinalizePostHookArgs {});

/// Registers the hook-argument classes in the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RemovableHandle>()?;
    register_pre_hook_classes(m)?;
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
