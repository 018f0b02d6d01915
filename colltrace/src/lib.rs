//! # colltrace
//!
//! The flight recorder of torchcomms-rs: every operation of every communicator (collectives,
//! point-to-point, batches, creation and split) is recorded with its communicator, sequence
//! number, op, dtype, counts, root or peer, reduction, async flag, algorithm, transport,
//! enqueue/start/end times, state and error, in a ring buffer of the last
//! `TORCHCOMMS_TRACE_BUFFER_SIZE` per communicator (0 turns it off).
//!
//! Every rank dumps its records as JSON (schema: `docs/colltrace-schema.md`, [`schema`]) into
//! `TORCHCOMMS_TRACE_DIR`, one file per rank, when an operation times out or fails, when the
//! communicator is aborted, on SIGUSR1, and when asked ([`dump_all`]). With
//! `TORCHCOMMS_TRACE_HTTP=1` each process also serves its live state on a local HTTP port and
//! the engine publishes the address in the store; `comms-analyzer` reads either and names the
//! rank that hangs and why.
//!
//! ```
//! use std::time::Duration;
//! use colltrace::{CommMeta, CommTrace, OpInfo, Outcome};
//!
//! let meta = CommMeta { name: "doc".into(), instance: 1, rank: 0, size: 2, global_ranks: vec![0, 1] };
//! let trace = CommTrace::new(meta, 100);
//! let mut writer = trace.writer(); // owned by the progress thread
//! // Submitting thread:
//! let mut op = trace.submit(false, 1, "all_reduce", Some(false), Duration::from_secs(5));
//! trace.publish(op.queued()); // after handing `op` to the progress thread
//! // Progress thread:
//! let info = || OpInfo { op: "all_reduce", dtype: Some("f32"), count: Some(2), ..Default::default() };
//! writer.start(&mut op, info, Some("shm"), Some("shm"));
//! writer.finish(&mut op, Outcome::Completed);
//! let dir = std::env::temp_dir().join(format!("colltrace-doc-{}", std::process::id()));
//! let files = colltrace::dump_all(&dir).unwrap();
//! let dumps = colltrace::schema::parse_dumps(&std::fs::read(&files[0]).unwrap()).unwrap();
//! assert_eq!(dumps[0].comms.last().unwrap().records[0].op, "all_reduce");
//! ```
//!
//! Cost: on the critical path of an operation whose caller waited for the previous one (every
//! synchronous collective), one atomic add on the calling thread and a record of eleven words
//! written in place under a per-slot sequence number on the progress thread, and no clock
//! read: such an operation is enqueued and started at the progress thread's anchor (the end of
//! the previous operation, or a mark it takes every few polls while it spins for work), and
//! its end (a clock read and two words) is written after its caller was told. An operation
//! queued behind others costs one `rdtsc` more on the calling thread; one picked up after the
//! progress thread slept, one more on the progress thread. No lock, no allocation, names
//! interned as 16-bit codes, formatting deferred to the dump; see [`CommTrace`] and
//! [`TraceWriter`].
//! [`CommTrace::set_recording`] pauses and resumes recording at run time (paused, it costs
//! what `TORCHCOMMS_TRACE_BUFFER_SIZE=0` costs), which `torchcomms-perf --trace-ab` uses to
//! measure the cost within one process. Measured in `docs/perf/colltrace.md`.
//! Thread safety: everything is `Send + Sync`; the execution side has one writer by
//! construction ([`TraceWriter`]).

mod clock;
mod http;
mod names;
mod registry;
pub mod schema;
mod signal;
mod trace;
mod waited;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

pub use clock::now_ns;
pub use registry::{
    configure, dump, dump_all, dump_configured, dump_file_name, find, http_addr, next_instance,
    on_failure, snapshot, trace_dir,
};
pub use schema::{CommState, Dump, Trigger};
pub use trace::{
    CommMeta, CommTrace, Ended, OpHandle, OpInfo, OpRecord, Outcome, QueuedOp, TraceWriter,
};
pub use waited::Waited;

/// Errors of dumping.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Writing a dump failed.
    #[error("writing colltrace dump {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: Arc<std::io::Error>,
    },
}

/// Which events make a rank dump by itself (`TORCHCOMMS_TRACE_DUMP_ON`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DumpOn {
    /// An operation timed out.
    pub timeout: bool,
    /// An operation failed.
    pub error: bool,
    /// The communicator was aborted.
    pub abort: bool,
    /// SIGUSR1 arrived.
    pub signal: bool,
}

impl DumpOn {
    /// Whether `trigger` dumps.
    pub fn wants(&self, trigger: Trigger) -> bool {
        match trigger {
            Trigger::Timeout => self.timeout,
            Trigger::Error => self.error,
            Trigger::Abort => self.abort,
            Trigger::Signal => self.signal,
            Trigger::Api | Trigger::Live => true,
        }
    }
}

/// Tracing settings, from the cvars.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceConfig {
    /// Records kept per communicator; 0 turns tracing off.
    pub buffer_size: usize,
    /// Where automatic dumps go.
    pub dir: PathBuf,
    /// Which events dump.
    pub dump_on: DumpOn,
    /// Address of the live endpoint, when enabled.
    pub http: Option<SocketAddr>,
    /// Timestamp with the invariant TSC where the CPU has one (`TORCHCOMMS_TRACE_TSC`).
    pub tsc: bool,
}

impl TraceConfig {
    /// The settings of `cv`: `TORCHCOMMS_TRACE_BUFFER_SIZE`, `TORCHCOMMS_TRACE_DIR`,
    /// `TORCHCOMMS_TRACE_DUMP_ON`, `TORCHCOMMS_TRACE_HTTP`, `TORCHCOMMS_TRACE_HTTP_ADDR`.
    pub fn from_cvars(cv: &torchcomms_cvars::Cvars) -> TraceConfig {
        let dir = match cv.torchcomms_trace_dir() {
            "" => std::env::temp_dir().join("torchcomms-trace"),
            d => PathBuf::from(d),
        };
        let on = cv.torchcomms_trace_dump_on();
        TraceConfig {
            buffer_size: usize::try_from(cv.torchcomms_trace_buffer_size()).unwrap_or(usize::MAX),
            dir,
            dump_on: DumpOn {
                timeout: on.contains(&"timeout"),
                error: on.contains(&"error"),
                abort: on.contains(&"abort"),
                signal: on.contains(&"signal"),
            },
            http: cv
                .torchcomms_trace_http()
                .then(|| cv.torchcomms_trace_http_addr()),
            tsc: cv.torchcomms_trace_tsc(),
        }
    }
}

impl Default for TraceConfig {
    /// The declared defaults.
    fn default() -> Self {
        TraceConfig::from_cvars(&torchcomms_cvars::Cvars::defaults())
    }
}
