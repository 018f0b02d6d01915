//! The one way this module waits: on a condition variable, until the state says done or a
//! deadline passes.

use std::sync::{Condvar, MutexGuard};
use std::time::Instant;

/// Waits on `changed` until `ready` returns a value (checked first, then after every
/// notification) or `deadline` passes (`None`). The guard comes back with the answer, so the
/// caller can act on the state under the same lock.
pub(crate) fn wait_for<'a, T, R>(
    changed: &Condvar,
    mut guard: MutexGuard<'a, T>,
    deadline: Instant,
    mut ready: impl FnMut(&mut T) -> Option<R>,
) -> (MutexGuard<'a, T>, Option<R>) {
    loop {
        if let Some(r) = ready(&mut guard) {
            return (guard, Some(r));
        }
        let now = Instant::now();
        if now >= deadline {
            return (guard, None);
        }
        guard = changed
            .wait_timeout(guard, deadline - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}
