//! What the analysis reports: the serialized verdict, per communicator and per rank.

use colltrace::schema::Record;
use serde::Serialize;

use crate::load::Problem;

/// A rank that contributed a dump.
#[derive(Debug, Clone, Serialize)]
pub struct RankInfo {
    /// Global rank.
    pub rank: usize,
    /// Host.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Why it dumped (`timeout`, `error`, `abort`, `signal`, `api`, `live`).
    pub trigger: String,
    /// The error or request behind the dump.
    pub reason: Option<String>,
    /// When.
    pub dumped_at_ns: u64,
}

/// The analysis of everything read.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// One line per important finding over all communicators, most important first.
    pub summary: Vec<String>,
    /// The ranks that contributed dumps.
    pub ranks: Vec<RankInfo>,
    /// Sources that could not be read.
    pub problems: Vec<Problem>,
    /// Per communicator.
    pub comms: Vec<CommVerdict>,
}

/// An operation, in brief.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpBrief {
    /// Sequence number.
    pub seq: u64,
    /// Operation.
    pub op: String,
    /// State.
    pub state: String,
    /// Element type.
    pub dtype: Option<String>,
    /// Elements.
    pub count: Option<u64>,
    /// Bytes in and out.
    pub in_bytes: u64,
    /// Bytes out.
    pub out_bytes: u64,
    /// Root.
    pub root: Option<usize>,
    /// Peer.
    pub peer: Option<usize>,
    /// Reduction.
    pub reduce_op: Option<String>,
    /// Milliseconds it has been running at dump time (unfinished operations).
    pub running_ms: Option<f64>,
    /// Error.
    pub error: Option<String>,
}

impl OpBrief {
    pub(super) fn of(r: &Record, dumped_at: u64) -> OpBrief {
        let running = (!r.state.is_final() && r.started_ns > 0)
            .then(|| dumped_at.saturating_sub(r.started_ns) as f64 / 1e6);
        OpBrief {
            seq: r.seq,
            op: r.op.clone(),
            state: r.state.name().into(),
            dtype: r.dtype.clone(),
            count: r.count,
            in_bytes: r.in_bytes,
            out_bytes: r.out_bytes,
            root: r.root,
            peer: r.peer,
            reduce_op: r.reduce_op.clone(),
            running_ms: running,
            error: r.error.clone(),
        }
    }
}

/// Progress of one rank in one communicator.
#[derive(Debug, Clone, Serialize)]
pub struct RankProgress {
    /// Global rank.
    pub rank: usize,
    /// Rank in the communicator.
    pub comm_rank: usize,
    /// Communicator state on this rank.
    pub state: String,
    /// Highest collective sequence number submitted.
    pub enqueued: u64,
    /// Highest collective sequence number started.
    pub started: u64,
    /// Highest collective sequence number completed.
    pub completed: u64,
    /// Highest p2p sequence number started.
    pub p2p_started: u64,
    /// Highest p2p sequence number completed.
    pub p2p_completed: u64,
    /// The unfinished collective or comm operation it is in, if any.
    pub current: Option<OpBrief>,
}

/// Ranks that disagree about the operation at one sequence number.
#[derive(Debug, Clone, Serialize)]
pub struct Mismatch {
    /// Sequence number.
    pub seq: u64,
    /// The fields that differ (`op`, `dtype`, `count`, `bytes`, `root`, `reduce_op`).
    pub fields: Vec<String>,
    /// Ranks (global) grouped by what they called, largest group first.
    pub groups: Vec<MismatchGroup>,
    /// The ranks outside the majority (all of them when there is no majority).
    pub odd_ranks: Vec<usize>,
}

/// Ranks that called the same thing.
#[derive(Debug, Clone, Serialize)]
pub struct MismatchGroup {
    /// Global ranks.
    pub ranks: Vec<usize>,
    /// What they called.
    pub call: String,
}

/// A rank behind the others.
#[derive(Debug, Clone, Serialize)]
pub struct Behind {
    /// Global rank.
    pub rank: usize,
    /// Its highest started collective.
    pub started: u64,
    /// Its highest completed collective.
    pub completed: u64,
    /// The highest collective any rank started.
    pub others_started: u64,
    /// What the others run at the next sequence number.
    pub waited_for: Option<String>,
    /// The operation it is stuck in, if it is in one.
    pub stuck_in: Option<OpBrief>,
}

/// The latest rank to arrive at an operation.
#[derive(Debug, Clone, Serialize)]
pub struct Slowest {
    /// Operation name.
    pub op: String,
    /// Global rank that arrived last most often (largest mean lateness).
    pub rank: usize,
    /// How often it was last.
    pub times_last: usize,
    /// Operations compared.
    pub of: usize,
    /// Mean delay of its arrival after the first rank's, ms.
    pub mean_late_ms: f64,
    /// Largest such delay, ms.
    pub max_late_ms: f64,
    /// Whether this counts as a finding (see [`Options`]).
    pub significant: bool,
}

/// One operation of one rank, for the timeline.
#[derive(Debug, Clone, Serialize)]
pub struct TimelineEntry {
    /// `collective`, `p2p` or `comm`.
    pub kind: String,
    /// Sequence number.
    pub seq: u64,
    /// Operation.
    pub op: String,
    /// State.
    pub state: String,
    /// Bytes in.
    pub bytes: u64,
    /// Algorithm.
    pub algorithm: Option<String>,
    /// Submission, start and end, ms after the earliest event of the communicator (end: null
    /// while running).
    pub enqueued_ms: f64,
    /// Start (null: not started).
    pub started_ms: Option<f64>,
    /// End (null: not finished).
    pub ended_ms: Option<f64>,
    /// Error.
    pub error: Option<String>,
}

/// The timeline of one rank.
#[derive(Debug, Clone, Serialize)]
pub struct RankTimeline {
    /// Global rank.
    pub rank: usize,
    /// Time of its dump, ms after the origin.
    pub dumped_ms: f64,
    /// Its operations, oldest first.
    pub entries: Vec<TimelineEntry>,
}

/// The verdict on one communicator.
#[derive(Debug, Clone, Serialize)]
pub struct CommVerdict {
    /// Name.
    pub name: String,
    /// Instance (see the schema).
    pub instance: u64,
    /// Number of ranks.
    pub size: usize,
    /// Global rank of each member.
    pub global_ranks: Vec<usize>,
    /// `ok`, `running`, `hung`, `mismatch`, `failed` or `incomplete`.
    pub status: String,
    /// Findings, most important first.
    pub findings: Vec<String>,
    /// Highest collective sequence number completed by every rank present.
    pub completed_by_all: u64,
    /// Highest collective sequence number started by every rank present.
    pub started_by_all: u64,
    /// Highest collective sequence number started by any rank.
    pub started_by_any: u64,
    /// Per rank.
    pub progress: Vec<RankProgress>,
    /// Ranks behind the others.
    pub behind: Vec<Behind>,
    /// Disagreements.
    pub mismatches: Vec<Mismatch>,
    /// Ranks that dumped but have no record of this communicator.
    pub never_joined: Vec<usize>,
    /// Members with no dump at all.
    pub no_dump: Vec<usize>,
    /// Ranks still connecting (creation unfinished).
    pub joining: Vec<usize>,
    /// Unfinished point-to-point operations.
    pub p2p_pending: Vec<(usize, OpBrief)>,
    /// Latest arrival per operation name.
    pub slowest: Vec<Slowest>,
    /// Per rank, oldest operation first.
    pub timeline: Vec<RankTimeline>,
}
