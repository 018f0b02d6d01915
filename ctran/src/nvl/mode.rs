//! Which way an operation runs (low-latency, staged, direct or pipelined): from the
//! `CTRAN_NVL_MODE` cvar or the caller's hint, with a refusal that lists the valid hints.

use super::plan::{self, Mode};
use super::Nvl;
use crate::algos::select::Hints;
use crate::error::{Error, Result};
use crate::Op;

impl Nvl {
    /// The mode `op` runs in, the same on every rank; an unknown or inapplicable hint is an
    /// error that lists the valid ones.
    pub(super) fn mode(&self, op: &Op, hints: Hints<'_>) -> Result<Mode> {
        let staged =
            plan::staged_bytes(op, hints.uniform).filter(|&b| b <= self.config.staged_max_bytes);
        let low_latency = matches!(op, Op::AllReduce { buf, .. }
            if self.config.ll_max_bytes > 0 && buf.len() <= self.config.ll_max_bytes);
        // Whether the scratch holds chunks does not depend on the size: ask for none, so the
        // check allocates nothing on the latency path.
        // A broadcast on copy engines needs no scratch.
        let pipelinable = match op {
            Op::AllReduce { .. } => self.chunking(0).is_some(),
            Op::Broadcast { .. } => self.layout.nranks >= 2,
            _ => false,
        };
        // Auto pipelines only where it was measured to win: two GPUs (docs/perf/gpu.md). More
        // ranks may ask for it by cvar or hint.
        let two = pipelinable && self.layout.nranks == 2;
        let auto = || match op {
            Op::AllReduce { buf, .. } if two && buf.len() >= self.config.pipe_min_bytes => {
                Mode::Pipelined
            }
            Op::Broadcast { buf, .. } if two && buf.len() >= self.config.pipe_bcast_min_bytes => {
                Mode::Pipelined
            }
            _ if low_latency => Mode::LowLatency,
            _ if staged.is_some() => Mode::Staged,
            _ => Mode::Direct,
        };
        let Some(asked) = hints.algo else {
            // The cvar: staged where the op can be, pipelined all_reduce where it can be, direct
            // elsewhere.
            return Ok(match (self.config.mode.as_str(), staged) {
                ("pipelined", _) if pipelinable => Mode::Pipelined,
                ("low_latency", _) if low_latency => Mode::LowLatency,
                ("direct", _) => Mode::Direct,
                ("staged", Some(_)) => Mode::Staged,
                ("staged", None) => Mode::Direct,
                _ => auto(),
            });
        };
        let refuse = |expected: String| {
            Err(Error::invalid(
                format!("{} algo", op.name()),
                expected,
                asked,
            ))
        };
        match asked {
            "auto" | "" => Ok(auto()),
            "low_latency" | "ll" if low_latency => Ok(Mode::LowLatency),
            "staged" | "one_shot" if staged.is_some() => Ok(Mode::Staged),
            "direct" | "two_shot" => Ok(Mode::Direct),
            "pipelined" if pipelinable => Ok(Mode::Pipelined),
            "pipelined" => refuse(format!(
                "auto, staged or direct: pipelined is for broadcast, and all_reduce over at least two ranks with CTRAN_NVL_PIPE_BYTES of scratch (it is {})",
                self.config.pipe_bytes
            )),
            "low_latency" | "ll" => refuse(format!(
                "auto, staged or direct: low_latency is for all_reduce of at most {} bytes (CTRAN_NVL_LL_MAX_BYTES)",
                self.config.ll_max_bytes
            )),
            "staged" | "one_shot" => refuse(format!(
                "direct or two_shot: staged takes equal blocks of at most {} bytes per rank (CTRAN_NVL_STAGED_MAX_BYTES)",
                self.config.staged_max_bytes
            )),
            _ => refuse(
                "one of auto, low_latency (ll; all_reduce), staged (one_shot), direct (two_shot), pipelined (all_reduce, broadcast) for GPU buffers over NVLink"
                    .into(),
            ),
        }
    }
}
