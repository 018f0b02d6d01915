//! The dump format: what a rank writes on timeout, abort, signal or request, and what its live
//! endpoint serves. Documented in `docs/colltrace-schema.md`; every change that a reader of the
//! previous version would misread bumps [`SCHEMA_VERSION`].

use serde::{Deserialize, Serialize};

/// Value of the `schema` field of every dump.
pub const SCHEMA_NAME: &str = "torchcomms-colltrace";

/// Version of the format written by this build; readers refuse other versions.
pub const SCHEMA_VERSION: u32 = 1;

/// Everything one rank knows about its communicators at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dump {
    /// Always [`SCHEMA_NAME`].
    pub schema: String,
    /// [`SCHEMA_VERSION`] of the writer.
    pub version: u32,
    /// Global rank of the process (its rank in the first communicator created from a store).
    pub rank: usize,
    /// Process id.
    pub pid: u32,
    /// Host name.
    pub host: String,
    /// Why the dump was taken.
    pub trigger: Trigger,
    /// The error or request behind the dump, when there is one.
    pub reason: Option<String>,
    /// Wall-clock time of the dump, nanoseconds since the Unix epoch.
    pub dumped_at_ns: u64,
    /// Address of this process's live endpoint, when it serves one.
    pub endpoint: Option<String>,
    /// Every communicator this rank is (or was) a member of, in creation order.
    pub comms: Vec<CommDump>,
}

/// Why a dump was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// An operation timed out.
    Timeout,
    /// An operation failed (peer lost, mismatch, transport error).
    Error,
    /// The communicator was aborted.
    Abort,
    /// SIGUSR1.
    Signal,
    /// A call of the dump API (Rust, Python, C).
    Api,
    /// Served by the live HTTP endpoint.
    Live,
}

impl Trigger {
    /// The name used in the JSON and in `TORCHCOMMS_TRACE_DUMP_ON`.
    pub fn name(self) -> &'static str {
        match self {
            Trigger::Timeout => "timeout",
            Trigger::Error => "error",
            Trigger::Abort => "abort",
            Trigger::Signal => "signal",
            Trigger::Api => "api",
            Trigger::Live => "live",
        }
    }
}

/// Lifecycle of a communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommState {
    /// Connecting to its peers.
    Joining,
    /// Running operations.
    Active,
    /// An operation failed; the communicator refuses new work.
    Failed,
    /// Aborted by its owner.
    Aborted,
    /// Finalized.
    Finalized,
}

/// One communicator as seen by one rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommDump {
    /// Name given at creation.
    pub name: String,
    /// How many communicators of this name this rank created before, plus one (ranks create
    /// them in the same order, so `(name, instance)` names one communicator on every rank).
    pub instance: u64,
    /// This rank in the communicator.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// Global rank of each member, indexed by communicator rank.
    pub global_ranks: Vec<usize>,
    /// Transports in use (`socket`, `shm`, `shm+socket`), once connected.
    pub transport: Option<String>,
    /// Lifecycle state.
    pub state: CommState,
    /// The error that broke it, if any.
    pub error: Option<String>,
    /// Records kept at most (`TORCHCOMMS_TRACE_BUFFER_SIZE`).
    pub buffer_size: usize,
    /// Records evicted from the ring buffer so far.
    pub dropped: u64,
    /// Wall-clock creation time, nanoseconds since the Unix epoch.
    pub created_ns: u64,
    /// Sequence numbers of collectives.
    pub collective: SeqCounters,
    /// Sequence numbers of point-to-point operations (numbered apart).
    pub p2p: SeqCounters,
    /// The last `buffer_size` operations, oldest first.
    pub records: Vec<Record>,
}

/// Progress of one sequence (collective or p2p): the highest sequence number that reached each
/// stage (0: none yet). Kept outside the ring buffer, so exact however many records were
/// evicted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqCounters {
    /// Highest sequence number submitted.
    pub enqueued: u64,
    /// Highest sequence number that started running.
    pub started: u64,
    /// Highest sequence number that completed successfully.
    pub completed: u64,
}

/// What a record describes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// A collective (numbered by the collective sequence).
    #[default]
    Collective,
    /// A send, receive or batch (numbered by the p2p sequence).
    P2p,
    /// Creating (`init`), splitting (`split`) or finalizing (`finalize`) the communicator
    /// (numbered by their own sequence).
    Comm,
}

/// State of one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Submitted, waiting for the operations before it.
    Queued,
    /// Running.
    Started,
    /// Finished successfully.
    Completed,
    /// Finished with an error.
    Failed,
    /// Did not finish before its deadline.
    TimedOut,
}

impl State {
    /// The name used in the JSON.
    pub fn name(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Started => "started",
            State::Completed => "completed",
            State::Failed => "failed",
            State::TimedOut => "timed_out",
        }
    }

    /// True once the operation finished, successfully or not.
    pub fn is_final(self) -> bool {
        matches!(self, State::Completed | State::Failed | State::TimedOut)
    }
}

/// One transfer of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerTransfer {
    /// `true`: send to `peer`; `false`: receive from it.
    pub send: bool,
    /// Communicator rank of the peer.
    pub peer: usize,
    /// Bytes.
    pub bytes: u64,
}

/// One operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Position in this communicator's submission order (1, 2, ...; unique per communicator).
    pub id: u64,
    /// Which sequence `seq` belongs to.
    pub kind: RecordKind,
    /// Sequence number within its kind.
    pub seq: u64,
    /// Operation name (`all_reduce`, `send`, `batch_op_issue`, `split`, ...).
    pub op: String,
    /// Element type, when the engine knows it (`null` for operations that move bytes).
    pub dtype: Option<String>,
    /// Elements of this rank's buffer that every rank must agree on (`null`: no dtype).
    pub count: Option<u64>,
    /// Bytes this rank contributes.
    pub in_bytes: u64,
    /// Bytes this rank receives.
    pub out_bytes: u64,
    /// Root (communicator rank) of rooted collectives.
    pub root: Option<usize>,
    /// Peer (communicator rank) of a send or receive.
    pub peer: Option<usize>,
    /// Transfers of a batch.
    pub peers: Option<Vec<PeerTransfer>>,
    /// Reduction of reducing collectives.
    pub reduce_op: Option<String>,
    /// Whether the caller issued it asynchronously (`null`: the caller did not say).
    pub async_op: Option<bool>,
    /// Algorithm that ran it, once chosen.
    pub algorithm: Option<String>,
    /// Transport(s) it ran over, once started.
    pub transport: Option<String>,
    /// Its deadline, milliseconds after it started.
    pub timeout_ms: u64,
    /// State.
    pub state: State,
    /// Submission time, nanoseconds since the Unix epoch. For an operation submitted right
    /// after its caller saw the previous one complete, its start time (it waited for nothing).
    pub enqueued_ns: u64,
    /// Start time (0: not started).
    pub started_ns: u64,
    /// End time (0: not finished).
    pub ended_ns: u64,
    /// Error of a failed or timed-out operation.
    pub error: Option<String>,
    /// Free-form detail (the new communicator of a split).
    pub detail: Option<String>,
}

/// Why a dump cannot be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// Not JSON, or cut short.
    #[error("not a colltrace dump: {0} (truncated or corrupt file?)")]
    Corrupt(String),
    /// JSON, but not a colltrace dump.
    #[error("not a colltrace dump: expected \"schema\": \"{SCHEMA_NAME}\", found {0}")]
    WrongSchema(String),
    /// A colltrace dump of a version this build does not read.
    #[error("colltrace dump of schema version {found}; this build reads version {SCHEMA_VERSION} only (use the comms-analyzer of the build that wrote it)")]
    UnsupportedVersion {
        /// The version in the file.
        found: String,
    },
    /// The right schema and version, but a field is missing or has the wrong type.
    #[error("malformed colltrace dump (version {SCHEMA_VERSION}): {0}")]
    Malformed(String),
}

fn check_one(v: serde_json::Value) -> Result<Dump, SchemaError> {
    let obj = v
        .as_object()
        .ok_or_else(|| SchemaError::WrongSchema("a JSON value that is not an object".into()))?;
    match obj.get("schema") {
        Some(serde_json::Value::String(s)) if s == SCHEMA_NAME => {}
        Some(other) => return Err(SchemaError::WrongSchema(other.to_string())),
        None => return Err(SchemaError::WrongSchema("no \"schema\" field".into())),
    }
    match obj.get("version") {
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(u64::from(SCHEMA_VERSION)) => {}
        Some(other) => {
            return Err(SchemaError::UnsupportedVersion {
                found: other.to_string(),
            })
        }
        None => {
            return Err(SchemaError::UnsupportedVersion {
                found: "none (no \"version\" field)".into(),
            })
        }
    }
    serde_json::from_value(v).map_err(|e| SchemaError::Malformed(e.to_string()))
}

/// Parses a dump file or a live endpoint's answer: one dump object, or an array of them (a
/// process whose ranks are threads serves one per rank).
pub fn parse_dumps(text: &[u8]) -> Result<Vec<Dump>, SchemaError> {
    let v: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| SchemaError::Corrupt(e.to_string()))?;
    match v {
        serde_json::Value::Array(items) => items.into_iter().map(check_one).collect(),
        v => check_one(v).map(|d| vec![d]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Dump {
        Dump {
            schema: SCHEMA_NAME.into(),
            version: SCHEMA_VERSION,
            rank: 1,
            pid: 7,
            host: "h".into(),
            trigger: Trigger::Api,
            reason: None,
            dumped_at_ns: 5,
            endpoint: None,
            comms: vec![],
        }
    }

    #[test]
    fn round_trip_and_arrays() {
        let d = sample();
        let text = serde_json::to_vec(&d).unwrap();
        assert_eq!(parse_dumps(&text).unwrap(), vec![d.clone()]);
        let arr = serde_json::to_vec(&vec![d.clone(), d.clone()]).unwrap();
        assert_eq!(parse_dumps(&arr).unwrap().len(), 2);
    }

    #[test]
    fn bad_inputs_are_named() {
        let text = serde_json::to_string(&sample()).unwrap();
        let cut = &text.as_bytes()[..text.len() / 2];
        assert!(matches!(parse_dumps(cut), Err(SchemaError::Corrupt(_))));
        assert!(matches!(
            parse_dumps(b"\x00\x01garbage"),
            Err(SchemaError::Corrupt(_))
        ));
        let other = text.replace("\"version\":1", "\"version\":99");
        let e = parse_dumps(other.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("version 99"), "{e}");
        let fr = br#"{"version":"2.10","pg_config":{},"entries":[]}"#;
        assert!(matches!(parse_dumps(fr), Err(SchemaError::WrongSchema(_))));
        let missing = text.replace("\"pid\":7,", "");
        let e = parse_dumps(missing.as_bytes()).unwrap_err();
        assert!(
            matches!(e, SchemaError::Malformed(_)) && e.to_string().contains("pid"),
            "{e}"
        );
    }
}
