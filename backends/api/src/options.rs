//! Options of communicators and operations, with torchcomms' defaults and environment variables.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use torchcomms_core::bootstrap::Store;

use crate::error::{Error, Result};

/// Free-form backend hints (`{"algo": "ring"}`).
pub type Hints = BTreeMap<String, String>;

/// Parses a torchcomms boolean environment value: 1/true/yes/y or 0/false/no/n.
pub fn parse_env_bool(name: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "y" => Ok(true),
        "0" | "false" | "no" | "n" => Ok(false),
        _ => Err(Error::invalid(
            "environment",
            name,
            "1/true/yes/y or 0/false/no/n",
            value,
        )),
    }
}

/// Options of a communicator (torchcomms' `CommOptions`).
#[derive(Debug, Clone)]
pub struct CommOptions {
    /// Abort the process when an operation times out or fails (`TORCHCOMM_ABORT_ON_ERROR`).
    pub abort_process_on_timeout_or_error: bool,
    /// Init timeout and default per-operation timeout (`TORCHCOMM_TIMEOUT_SECONDS`, 600 s).
    pub timeout: Duration,
    /// Store to bootstrap through; `None` uses `MASTER_ADDR`/`MASTER_PORT`.
    pub store: Option<Arc<dyn Store>>,
    /// Backend hints.
    pub hints: Hints,
    /// This rank, when not discovered from the launcher's environment.
    pub rank: Option<usize>,
    /// Number of ranks, when not discovered from the launcher's environment.
    pub size: Option<usize>,
    /// Use a high-priority stream (GPU backends).
    pub high_priority_stream: bool,
    /// The store serves this communicator alone (a reconfiguration's own prefix): its keys need
    /// no per-name instance number, which ranks renumbered by a reconfiguration would disagree on.
    pub dedicated_store: bool,
}

impl CommOptions {
    /// Defaults, read from the cvars (`TORCHCOMM_ABORT_ON_ERROR`, `TORCHCOMM_TIMEOUT_SECONDS`)
    /// like torchcomms does at construction.
    pub fn from_env() -> Result<CommOptions> {
        // Defaults, the TORCHCOMMS_CONFIG file and the environment (docs/cvars.md).
        let cv = torchcomms_cvars::reload()
            .map_err(|e| Error::invalid("environment", e.name(), e.expected(), e.value()))?;
        let abort = cv.torchcomm_abort_on_error();
        let timeout = cv.torchcomm_timeout_seconds();
        Ok(CommOptions {
            abort_process_on_timeout_or_error: abort,
            timeout,
            store: None,
            hints: Hints::new(),
            rank: None,
            size: None,
            high_priority_stream: false,
            dedicated_store: false,
        })
    }
}

impl Default for CommOptions {
    /// Defaults from the environment; an invalid environment value falls back to the built-in
    /// default here (use [`CommOptions::from_env`] to see the error).
    fn default() -> Self {
        CommOptions::from_env().unwrap_or(CommOptions {
            abort_process_on_timeout_or_error: true,
            timeout: torchcomms_core::DEFAULT_TIMEOUT,
            store: None,
            hints: Hints::new(),
            rank: None,
            size: None,
            high_priority_stream: false,
            dedicated_store: false,
        })
    }
}

/// Options of one operation.
#[derive(Debug, Clone, Default)]
pub struct OpOptions {
    /// Return before completion; the caller waits on the work.
    pub async_op: bool,
    /// Backend hints for this call.
    pub hints: Hints,
    /// Timeout for this call; `None` (or zero) uses the communicator's.
    pub timeout: Option<Duration>,
    /// The caller's current CUDA stream, as a `CUstream` integer
    /// (`torch.cuda.current_stream(device).cuda_stream`); `None` is the legacy default stream.
    /// GPU backends order the operation after it and make it wait in `Work::wait()`; CPU
    /// backends ignore it.
    pub stream: Option<u64>,
}

impl OpOptions {
    /// Synchronous, no hints, the communicator's timeout.
    pub fn sync() -> OpOptions {
        OpOptions::default()
    }

    /// Asynchronous, no hints, the communicator's timeout.
    pub fn async_op() -> OpOptions {
        OpOptions {
            async_op: true,
            ..OpOptions::default()
        }
    }

    /// The same options with a timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> OpOptions {
        self.timeout = Some(timeout);
        self
    }

    /// The same options on the caller's CUDA stream (see [`OpOptions::stream`]).
    pub fn with_stream(mut self, stream: u64) -> OpOptions {
        self.stream = Some(stream);
        self
    }

    /// The same options with a hint.
    pub fn with_hint(mut self, key: &str, value: &str) -> OpOptions {
        self.hints.insert(key.into(), value.into());
        self
    }

    /// The effective timeout, given the communicator's default.
    pub fn timeout_or(&self, default: Duration) -> Duration {
        self.timeout.filter(|t| !t.is_zero()).unwrap_or(default)
    }
}
