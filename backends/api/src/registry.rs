//! Backends by name. Backend crates register at link time through [`inventory`]
//! (`inventory::submit!(BackendRegistration { .. })`); programs can also register at run time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::backend::{Backend, InitArgs};
use crate::error::{Error, Result};

/// Creates a backend instance for one communicator.
pub type BackendFactory = Arc<dyn Fn(&InitArgs) -> Result<Box<dyn Backend>> + Send + Sync>;

/// A backend registered at link time.
#[derive(Debug)]
pub struct BackendRegistration {
    /// Name users pass to `new_comm`.
    pub name: &'static str,
    /// Creates one communicator.
    pub create: fn(&InitArgs) -> Result<Box<dyn Backend>>,
}

inventory::collect!(BackendRegistration);

fn runtime() -> &'static Mutex<BTreeMap<String, BackendFactory>> {
    static R: OnceLock<Mutex<BTreeMap<String, BackendFactory>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Registers (or replaces) a backend under `name` at run time.
pub fn register_backend(name: &str, factory: BackendFactory) {
    runtime()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(name.to_string(), factory);
}

/// Names of every registered backend, sorted.
pub fn backend_names() -> Vec<String> {
    let mut names: Vec<String> = inventory::iter::<BackendRegistration>
        .into_iter()
        .map(|r| r.name.to_string())
        .collect();
    names.extend(
        runtime()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned(),
    );
    names.sort();
    names.dedup();
    names
}

/// Whether a backend of this name is registered.
pub fn is_backend_registered(name: &str) -> bool {
    backend_names().iter().any(|n| n == name)
}

/// Creates a backend instance by name.
pub fn create_backend(name: &str, args: &InitArgs) -> Result<Box<dyn Backend>> {
    let rt = runtime()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(name)
        .cloned();
    if let Some(f) = rt {
        return f(args);
    }
    if let Some(r) = inventory::iter::<BackendRegistration>
        .into_iter()
        .find(|r| r.name == name)
    {
        return (r.create)(args);
    }
    Err(Error::UnknownBackend {
        name: name.into(),
        known: backend_names().join(", "),
    })
}
