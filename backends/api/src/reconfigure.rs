//! Reconfiguring a communicator without restarting the job (upstream's `get_init_handle()` and
//! `reconfigure(uuid, init_handles, timeout)`): after a failure the survivors form a new
//! communicator from their init handles (shrink), new processes join with theirs (grow).
//!
//! Every member reaches the others through a store that outlives any rank: the one passed in
//! the options, or torchrun's agent store (`MASTER_ADDR`/`MASTER_PORT` with
//! `TORCHELASTIC_USE_AGENT_STORE`); a store served by rank 0 would die with rank 0. Each
//! reconfiguration bootstraps under its own prefix (`name` and `uuid`), so no key of an earlier
//! membership is read again. Ranks are numbered in the order of the handles (a set is sorted).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use torchcomms_core::bootstrap::rendezvous;
use torchcomms_core::bootstrap::{PrefixStore, Store};
use torchcomms_core::Device;

use crate::{new_comm, CommOptions, Error, Result, TorchComm};

/// What a process needs to take part in reconfigurations of one communicator: its backend,
/// device, name, options, a durable store and the handle that names this process in them.
#[derive(Debug, Clone)]
pub struct Reconfigurer {
    backend: String,
    device: Device,
    name: String,
    options: CommOptions,
    store: Arc<dyn Store>,
    handle: String,
}

impl Reconfigurer {
    /// Prepares reconfigurations; communicates with nobody. The store is `options.store`, else
    /// torchrun's agent store; without either this fails, naming both.
    pub fn new(
        backend: &str,
        device: Device,
        name: &str,
        options: CommOptions,
    ) -> Result<Reconfigurer> {
        let store = match &options.store {
            Some(s) => Arc::clone(s),
            None => agent_store(options.timeout)?,
        };
        Ok(Reconfigurer {
            backend: backend.into(),
            device,
            name: name.into(),
            handle: new_handle(backend),
            options,
            store,
        })
    }

    /// This process's init handle: unique to this process and communicator, the same for
    /// every reconfiguration.
    pub fn init_handle(&self) -> &str {
        &self.handle
    }

    /// The rank this process takes among `handles`, checking them: not empty, no duplicates,
    /// this process's own among them.
    pub fn rank_among(&self, handles: &[String]) -> Result<usize> {
        let op = "reconfigure";
        if handles.is_empty() {
            return Err(Error::invalid(
                op,
                "init_handles",
                "the init handles of the new communicator's members (at least this process's own)",
                "none",
            ));
        }
        for (i, h) in handles.iter().enumerate() {
            if let Some(j) = handles[..i].iter().position(|o| o == h) {
                return Err(Error::invalid(
                    op,
                    "init_handles",
                    "distinct handles, one per member",
                    format!("{h:?} at positions {j} and {i}"),
                ));
            }
        }
        handles
            .iter()
            .position(|h| *h == self.handle)
            .ok_or_else(|| {
                Error::invalid(
                    op,
                    "init_handles",
                    format!(
                        "a list that holds this process's handle {:?} (from get_init_handle())",
                        self.handle
                    ),
                    format!("{} other handles", handles.len()),
                )
            })
    }

    /// Forms the communicator of `handles` (a collective of exactly those members, each
    /// passing the same `uuid` and list); `timeout` bounds the set-up and becomes the new
    /// communicator's default (the options' timeout when `None`).
    pub fn reconfigure(
        &self,
        uuid: u64,
        handles: &[String],
        timeout: Option<Duration>,
    ) -> Result<TorchComm> {
        let rank = self.rank_among(handles)?;
        let prefix = format!("torchcomms/reconfigure/{}/{uuid}", self.name);
        let options = CommOptions {
            store: Some(Arc::new(PrefixStore::new(prefix, Arc::clone(&self.store)))),
            rank: Some(rank),
            size: Some(handles.len()),
            timeout: timeout.unwrap_or(self.options.timeout),
            dedicated_store: true,
            ..self.options.clone()
        };
        tracing::info!(name = %self.name, uuid, rank, size = handles.len(), "reconfigure");
        new_comm(&self.backend, self.device, &self.name, options)
    }

    /// A communicator of this process alone (what an `enable_reconfigure` communicator is
    /// before its first reconfiguration); bootstraps through a store of its own.
    pub fn alone(&self) -> Result<TorchComm> {
        let options = CommOptions {
            store: Some(Arc::new(torchcomms_core::bootstrap::HashStore::new())),
            rank: Some(0),
            size: Some(1),
            dedicated_store: true,
            ..self.options.clone()
        };
        new_comm(&self.backend, self.device, &self.name, options)
    }
}

/// A handle no other process or communicator of this one shares: backend, host, pid, time and
/// a counter.
fn new_handle(backend: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{backend}:{host}:{}:{nanos:x}:{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// torchrun's agent store, which outlives every worker.
fn agent_store(timeout: Duration) -> Result<Arc<dyn Store>> {
    match rendezvous::agent_store_from_env(timeout)? {
        Some(client) => Ok(Arc::new(client)),
        None => Err(Error::invalid(
            "new_comm",
            "store",
            "a store that outlives every rank: pass `store` (e.g. a torch TCPStore) or run under torchrun, whose agent serves MASTER_PORT",
            "no store, and no torchrun agent store (TORCHELASTIC_USE_AGENT_STORE) in the environment",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reconfigurer() -> Reconfigurer {
        let options = CommOptions {
            store: Some(Arc::new(torchcomms_core::bootstrap::HashStore::new())),
            ..CommOptions::from_env().unwrap()
        };
        Reconfigurer::new("ctran", Device::Cpu, "r", options).unwrap()
    }

    #[test]
    fn handles_are_unique_per_communicator_and_ranks_follow_their_order() {
        let (a, b) = (reconfigurer(), reconfigurer());
        assert_ne!(a.init_handle(), b.init_handle());
        let handles = vec![b.init_handle().to_string(), a.init_handle().to_string()];
        assert_eq!(a.rank_among(&handles).unwrap(), 1);
        assert_eq!(b.rank_among(&handles).unwrap(), 0);
    }

    #[test]
    fn bad_handle_lists_name_the_argument_and_what_is_wrong() {
        let a = reconfigurer();
        let me = a.init_handle().to_string();
        for (handles, want) in [
            (vec![], "at least this process's own"),
            (
                vec![me.clone(), "x".into(), me.clone()],
                "positions 0 and 2",
            ),
            (vec!["x".into(), "y".into()], "this process's handle"),
        ] {
            let err = a.rank_among(&handles).unwrap_err().to_string();
            assert!(err.contains("init_handles") && err.contains(want), "{err}");
        }
    }
}
