//! The validated settings every rank runs with.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use ctran::{DataType, Device, ReduceOp};

use super::{Args, CollOp, OpArg};

/// What every rank runs, checked once.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) nranks: usize,
    pub(crate) minbytes: u64,
    pub(crate) maxbytes: u64,
    pub(crate) stepfactor: u64,
    pub(crate) ops: Vec<CollOp>,
    pub(crate) dtypes: Vec<DataType>,
    pub(crate) redops: Vec<ReduceOp>,
    pub(crate) root: usize,
    pub(crate) warmup: u32,
    pub(crate) iters: u32,
    pub(crate) check: bool,
    pub(crate) backend: String,
    pub(crate) device: Device,
    pub(crate) timeout: Option<Duration>,
    pub(crate) launch_timeout: Duration,
    pub(crate) bind: bool,
    pub(crate) json: Option<PathBuf>,
    pub(crate) async_op: bool,
    pub(crate) algo: Option<String>,
    pub(crate) rounds: u32,
    pub(crate) max_iter_bytes: Option<u64>,
    pub(crate) min_iter_bytes: Option<u64>,
    /// `--trace-ab`: iterations per block.
    pub(crate) trace_ab: Option<u32>,
    /// `--ab-control`: recording paused in both settings of `--trace-ab`.
    pub(crate) ab_control: bool,
}

/// Keeps the first occurrence of every element.
fn dedup<T: PartialEq + Copy>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for x in items {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

impl Settings {
    /// Validates what clap cannot check alone.
    pub(crate) fn from_args(a: Args) -> Result<Settings> {
        if a.minbytes > a.maxbytes {
            bail!(
                "invalid value for '--minbytes': {} is larger than --maxbytes {}",
                a.minbytes,
                a.maxbytes
            );
        }
        if a.maxbytes > usize::MAX as u64 / 2 {
            bail!(
                "invalid value for '--maxbytes': {} is too large",
                a.maxbytes
            );
        }
        if !torchcomms::is_backend_registered(&a.backend) {
            bail!(
                "invalid value for '--backend': `{}` is not a registered backend (registered: {})",
                a.backend,
                torchcomms::backend_names().join(", ")
            );
        }
        let ops = if a.ops.contains(&OpArg::All) {
            CollOp::ALL.to_vec()
        } else {
            dedup(a.ops.iter().map(|o| match o {
                OpArg::All | OpArg::AllReduce => CollOp::AllReduce,
                OpArg::AllGather => CollOp::AllGather,
                OpArg::ReduceScatter => CollOp::ReduceScatter,
                OpArg::AllToAll => CollOp::AllToAll,
                OpArg::Broadcast => CollOp::Broadcast,
                OpArg::Reduce => CollOp::Reduce,
                OpArg::Scatter => CollOp::Scatter,
                OpArg::Gather => CollOp::Gather,
                OpArg::SendRecv => CollOp::SendRecv,
            }))
        };
        let dtypes = dedup(a.dtypes.into_iter().flat_map(|l| l.0));
        let mut redops: Vec<ReduceOp> = Vec::new();
        for op in a.redops.into_iter().flat_map(|l| l.0) {
            if !redops.iter().any(|o| o.name() == op.name()) {
                redops.push(op);
            }
        }
        let algo = a.algo.map(|x| x.trim().to_ascii_lowercase());
        if let Some(name) = &algo {
            if name.is_empty() {
                bail!("invalid value for '--algo': expected an algorithm name, got an empty one");
            }
            if name == "all" && a.backend != "ctran" {
                bail!(
                    "invalid value for '--algo': `all` needs --backend ctran (the {} backend has no \
                     algorithms to choose from)",
                    a.backend
                );
            }
            if name != "all" && name != "auto" && !ops.iter().any(|op| op.has_algo(name)) {
                let known: Vec<String> = ops
                    .iter()
                    .filter_map(|op| {
                        op.algos()
                            .map(|v| format!("{}: {}", op.name(), v.join(", ")))
                    })
                    .collect();
                bail!(
                    "invalid value for '--algo': no operation run has an algorithm `{name}` \
                     (expected all, auto or one of {})",
                    known.join("; ")
                );
            }
        }
        let trace_ab = a.trace_ab.then_some(a.ab_block);
        if let Some(block) = trace_ab {
            let one = |what: &str, n: usize| -> Result<()> {
                if n != 1 {
                    bail!(
                        "invalid value for '--trace-ab': it times one combination, got {n} {what} \
                         (give one --op, one --dtype, one --redop, and -b equal to -e)"
                    );
                }
                Ok(())
            };
            one("operations", ops.len())?;
            one("element types", dtypes.len())?;
            if ops[0].reduces() {
                one("reductions", redops.len())?;
            }
            if a.minbytes != a.maxbytes {
                one("sizes", 2)?;
            }
            if a.backend != "ctran" {
                bail!(
                    "invalid value for '--trace-ab': needs --backend ctran (the {} backend keeps \
                     no colltrace)",
                    a.backend
                );
            }
            if algo.as_deref() == Some("all") || a.rounds > 1 || a.min_iter_bytes.is_some() {
                bail!(
                    "invalid value for '--trace-ab': --algo all, --rounds and --min-iter-bytes do \
                     not apply"
                );
            }
            let group = 4 * u64::from(block);
            if u64::from(a.iters) % group != 0 || u64::from(a.iters) < 2 * group {
                bail!(
                    "invalid value for '--iters': --trace-ab needs a multiple of 4 x --ab-block \
                     ({group}), at least two groups ({}), got {}",
                    2 * group,
                    a.iters
                );
            }
        }
        Ok(Settings {
            nranks: a.nranks as usize,
            minbytes: a.minbytes,
            maxbytes: a.maxbytes,
            stepfactor: a.stepfactor,
            ops,
            dtypes,
            redops,
            root: a.root,
            warmup: a.warmup,
            iters: a.iters,
            check: a.check == 1,
            backend: a.backend,
            device: a.device,
            timeout: a.timeout,
            launch_timeout: a.launch_timeout,
            bind: a.bind,
            json: a.json,
            async_op: a.async_op,
            algo,
            rounds: a.rounds,
            max_iter_bytes: a.max_iter_bytes,
            min_iter_bytes: a.min_iter_bytes,
            trace_ab,
            ab_control: a.ab_control,
        })
    }

    /// The algorithms to measure `op` with, in table order (`None`: no hint, the backend
    /// chooses); `Err` with the reason when `--algo` names none of `op`'s.
    pub(crate) fn algos_for(&self, op: CollOp) -> Result<Vec<Option<String>>, String> {
        let Some(name) = &self.algo else {
            return Ok(vec![None]);
        };
        let Some(names) = op.algos() else {
            // Point-to-point: nothing to choose, run it as is.
            return Ok(vec![None]);
        };
        if name == "all" {
            return Ok(names
                .iter()
                .map(|a| Some(a.to_string()))
                .chain(std::iter::once(Some("auto".to_string())))
                .collect());
        }
        if name == "auto" || op.has_algo(name) {
            return Ok(vec![Some(name.clone())]);
        }
        Err(format!(
            "no algorithm `{name}`; one of auto, {}",
            names.join(", ")
        ))
    }

    /// Warm-up and timed iterations for a size of `bytes` (`--min-iter-bytes`,
    /// `--max-iter-bytes`).
    pub(crate) fn iterations(&self, bytes: usize) -> (u32, u32) {
        // Iterations of `bytes` that fit `budget` (at least one).
        let fit = |budget: u64| (budget / bytes as u64).clamp(1, u64::from(u32::MAX)) as u32;
        let cap = |k: u32| match self.max_iter_bytes {
            Some(budget) if bytes > 0 => k.min(fit(budget)),
            _ => k,
        };
        let warmup = if self.warmup == 0 {
            0
        } else {
            cap(self.warmup)
        };
        let iters = match self.min_iter_bytes {
            Some(floor) if bytes > 0 => self.iters.max(fit(floor)),
            _ => self.iters,
        };
        (warmup, cap(iters))
    }

    /// The sizes to measure, in bytes, before rounding to the operation's unit.
    pub(crate) fn sizes(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut s = self.minbytes;
        loop {
            out.push(s);
            let next = if s == 0 {
                Some(1)
            } else {
                s.checked_mul(self.stepfactor)
            };
            match next {
                Some(next) if next <= self.maxbytes && next > s => s = next,
                _ => break,
            }
        }
        out
    }
}
