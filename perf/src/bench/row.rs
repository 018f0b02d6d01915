//! What a measurement gives: a row of the tables, and the buffer layout of a requested size.

use ctran::DataType;
use serde::Serialize;

use crate::cli::CollOp;

/// One line of a table (and one object of the JSON array).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    pub(super) op: &'static str,
    /// The algorithm asked for (`--algo`); `None` when the backend chose.
    pub(super) algo: Option<String>,
    pub(super) dtype: &'static str,
    pub(super) redop: &'static str,
    /// The root rank, for operations that have one.
    pub(super) root: Option<usize>,
    pub(super) bytes: u64,
    pub(super) count: u64,
    pub(super) time_us: f64,
    /// Host time per iteration up to the last wait, before the final synchronize: on a GPU,
    /// where a wait only orders streams, `time_us` well above it means the device bounds the
    /// loop, and equal means the host does.
    pub(super) issue_us: f64,
    pub(super) algbw_gbps: f64,
    pub(super) busbw_gbps: f64,
    /// Mismatching elements summed over ranks; `None` when not checked.
    pub(super) wrong: Option<u64>,
    pub(super) nranks: usize,
    /// With `--rounds`: the time of every round, in order (`time_us` is the best). Rounds time
    /// every algorithm in turn, so round `k` of two algorithms saw about the same background
    /// load: their paired ratios cancel what drifts between rounds.
    #[serde(skip_serializing_if = "one_round")]
    pub(super) rounds_us: Vec<f64>,
}

pub(super) fn one_round(rounds: &[f64]) -> bool {
    rounds.len() < 2
}

/// How much slower `a` is than `b`: the median over rounds of their paired ratios (see
/// [`Row::rounds_us`]); with one round, the ratio of the two times.
pub(super) fn paired_ratio(a: &Row, b: &Row) -> f64 {
    let ratios: Vec<f64> = a
        .rounds_us
        .iter()
        .zip(&b.rounds_us)
        .filter(|&(_, &y)| y > 0.0)
        .map(|(x, y)| x / y)
        .collect();
    if ratios.is_empty() {
        return if b.time_us > 0.0 {
            a.time_us / b.time_us
        } else {
            1.0
        };
    }
    crate::ab::median(&ratios)
}

/// Bytes and element count of the operation's largest buffer for a requested size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) bytes: usize,
    pub(super) count: usize,
}

pub(super) fn layout(op: CollOp, n: usize, dtype: DataType, size: u64) -> Layout {
    let e = dtype.size_bytes();
    let unit = if op.splits() { n * e } else { e };
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    let bytes = size / unit * unit;
    Layout {
        bytes,
        count: bytes / e,
    }
}
