//! Command line: the options, their parsers, and the validated [`Settings`] the ranks run with.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Parser, ValueEnum};
use ctran::{DataType, Device, ReduceOp};

/// Factor of PREMUL_SUM when the benchmark runs it (its check depends on the value).
pub(crate) const PREMUL_FACTOR: f64 = 2.0;

const AFTER_HELP: &str = "\
LAUNCH:
  When the environment names a rank (TORCHCOMM_RANK/TORCHCOMM_SIZE, torchrun's RANK/WORLD_SIZE,
  Open MPI, PMI, PALS or SLURM), the process joins that job as that rank; the store comes from
  MASTER_ADDR/MASTER_PORT. Otherwise it launches -n local ranks itself (copies of this binary
  on 127.0.0.1 and a free port), waits for them, and stops them all if one fails.

SIZES:
  A size is the largest buffer of the operation, as in nccl-tests: the whole buffer for
  all_reduce, broadcast, reduce and all_to_all; the gathered output for all_gather and gather;
  the whole input for reduce_scatter and scatter; what each rank sends for send_recv. Sizes of
  ops that split per rank are rounded down to a multiple of nranks x element size.
  algbw = size / time; busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (all_gather,
  reduce_scatter, all_to_all) or 1 (the others). GB/s is 1e9 bytes per second. time is the
  average per iteration of the slowest rank.

CHECK:
  With -c 1 every (op, size) runs once more on deterministic inputs and every element is
  compared with the value computed on the host; #wrong is the sum over ranks of mismatching
  elements. Combinations that do not exist (bitwise reductions on float types, avg and
  premul_sum on bool) print n/a. premul_sum uses the factor 2.

EXIT STATUS:
  0 all good; 1 an error (bad option, failed rank, timeout); 2 usage error; 3 some #wrong > 0.";

/// Bandwidth and correctness benchmark of the TorchComm collectives, modelled on nccl-tests.
#[derive(Debug, Parser)]
#[command(name = "torchcomms-perf", version, after_long_help = AFTER_HELP)]
pub(crate) struct Args {
    /// Ranks to launch on this host when the environment names no rank (ignored when it does).
    #[arg(short = 'n', long = "nranks", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) nranks: u32,

    /// Smallest size in bytes; accepts K, M, G suffixes (powers of 1024).
    #[arg(short = 'b', long, default_value = "8", value_parser = parse_bytes)]
    pub(crate) minbytes: u64,

    /// Largest size in bytes; accepts K, M, G suffixes (powers of 1024).
    #[arg(short = 'e', long, default_value = "64M", value_parser = parse_bytes)]
    pub(crate) maxbytes: u64,

    /// Multiply the size by this factor between steps.
    #[arg(short = 'f', long, default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(2..))]
    pub(crate) stepfactor: u64,

    /// Operations to run, comma-separated (all_reduce, all_gather, reduce_scatter, all_to_all,
    /// broadcast, reduce, scatter, gather, send_recv), or `all`.
    #[arg(
        long = "op",
        value_name = "OP",
        value_enum,
        value_delimiter = ',',
        default_value = "all",
        hide_possible_values = true
    )]
    pub(crate) ops: Vec<OpArg>,

    /// Element types, comma-separated (f16, bf16, f32, f64, i8, u8, i32, i64, bool), or `all`.
    #[arg(short = 'd', long = "dtype", value_name = "DTYPE", value_delimiter = ',',
          default_value = "f32",
          value_parser = parse_dtypes)]
    pub(crate) dtypes: Vec<DtypeList>,

    /// Reductions of all_reduce, reduce and reduce_scatter, comma-separated (sum, prod, min,
    /// max, band, bor, bxor, avg, premul_sum), or `all`.
    #[arg(short = 'o', long = "redop", value_name = "REDOP", value_delimiter = ',',
          default_value = "sum",
          value_parser = parse_redops)]
    pub(crate) redops: Vec<RedopList>,

    /// Root rank of broadcast, reduce, scatter and gather.
    #[arg(short = 'r', long, default_value_t = 0)]
    pub(crate) root: usize,

    /// Untimed iterations before timing.
    #[arg(short = 'w', long, default_value_t = 5)]
    pub(crate) warmup: u32,

    /// Timed iterations (the time is their average).
    #[arg(short = 'i', long, default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) iters: u32,

    /// Verify results: 1 checks every element, 0 skips (#wrong prints N/A).
    #[arg(short = 'c', long, default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(0..=1))]
    pub(crate) check: u8,

    /// Communication backend: ctran (the project's engine) or nccl (NVIDIA's NCCL, CUDA only).
    #[arg(long, default_value = "ctran")]
    pub(crate) backend: String,

    /// Device of the tensors (cpu, cuda, cuda:N). With CUDA, local rank r uses GPU N + r (mod
    /// the GPUs present); inputs are copied up and results copied back to be checked.
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    pub(crate) device: Device,

    /// Timeout in seconds of communicator creation and of each operation (default: the
    /// backend's, TORCHCOMM_TIMEOUT_SECONDS or 600).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub(crate) timeout: Option<Duration>,

    /// Limit in seconds on the whole run of the ranks this process launches itself.
    #[arg(long, value_name = "SECONDS", default_value = "3600", value_parser = parse_seconds)]
    pub(crate) launch_timeout: Duration,

    /// Bind each rank this process launches to its own CPUs, as `mpirun --bind-to core` does:
    /// rank r to the r-th of -n equal parts of the CPUs this process may use, or with fewer
    /// CPUs than ranks to CPU r mod their count. Off by default (the scheduler places ranks).
    #[arg(long)]
    pub(crate) bind: bool,

    /// Write the rows as a JSON array to FILE (rank 0).
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,

    /// Issue the timed operations asynchronously, then wait for all of them.
    #[arg(long = "async")]
    pub(crate) async_op: bool,

    /// Algorithm to run (ctran): passed as the hint {"algo": NAME} on every collective; ops
    /// without an algorithm of that name are skipped. `all`: one table per algorithm of each op,
    /// and `auto` last, then how auto compares with the best algorithm at each size.
    #[arg(long, value_name = "NAME")]
    pub(crate) algo: Option<String>,

    /// Time every size this many times (algorithms of `--algo all` interleaved) and report the
    /// best round: on a busy machine the best round is the least disturbed one.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) rounds: u32,

    /// Cap warm-up and timed iterations of a size so that iterations x size stays within
    /// BYTES (at least one of each); accepts K, M, G suffixes. Keeps large sizes quick.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub(crate) max_iter_bytes: Option<u64>,

    /// Raise timed iterations of a size so that iterations x size reaches BYTES (never past
    /// --max-iter-bytes); accepts K, M, G suffixes. With `--rounds`, a round of a few iterations
    /// of a mid-size message lasts about a millisecond and one lost time slice moves it by a
    /// quarter; longer rounds keep same-round ratios steady.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub(crate) min_iter_bytes: Option<u64>,

    /// Print every configuration variable (cvar) with its effective value and where it came
    /// from (default, the TORCHCOMMS_CONFIG file, the environment), then exit.
    #[arg(long)]
    pub(crate) print_cvars: bool,

    /// Measure what colltrace costs, within one run: time the one (op, dtype, redop, size) in
    /// blocks of --ab-block iterations with recording paused (off) and on in turn, in groups
    /// of four (off on on off, then on off off on), every rank switching at the same
    /// iterations; report per setting the median of the block means, and the median of the
    /// on/off ratios of the groups with a bootstrap 95% interval. --iters is the total, a
    /// multiple of 4 x --ab-block. Needs --backend ctran and TORCHCOMMS_TRACE_BUFFER_SIZE > 0.
    #[arg(long)]
    pub(crate) trace_ab: bool,

    /// Iterations per block of --trace-ab.
    #[arg(long, value_name = "ITERS", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) ab_block: u32,

    /// With --trace-ab: keep recording paused in both settings (an A/A run), so that the
    /// ratio it reports is the method's own bias and noise, the floor of what it can resolve.
    #[arg(long, requires = "trace_ab")]
    pub(crate) ab_control: bool,
}

/// `--print-cvars`: the effective configuration; an invalid value is an error naming it.
pub(crate) fn print_cvars() -> ExitCode {
    match torchcomms_cvars::Cvars::load() {
        Ok(cv) => {
            print!("{}", cv.table());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("torchcomms-perf: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The operations the benchmark measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OpArg {
    /// Every operation below.
    All,
    /// In-place all-reduce.
    #[value(name = "all_reduce", alias = "allreduce")]
    AllReduce,
    /// All-gather into one tensor.
    #[value(name = "all_gather", alias = "allgather")]
    AllGather,
    /// Reduce-scatter of one tensor.
    #[value(name = "reduce_scatter", alias = "reducescatter")]
    ReduceScatter,
    /// All-to-all of one tensor in equal blocks.
    #[value(name = "all_to_all", alias = "alltoall")]
    AllToAll,
    /// In-place broadcast from the root.
    Broadcast,
    /// In-place reduce onto the root.
    Reduce,
    /// Scatter from the root.
    Scatter,
    /// Gather onto the root.
    Gather,
    /// Ring exchange: every rank sends to the next and receives from the previous.
    #[value(name = "send_recv", alias = "sendrecv")]
    SendRecv,
}

/// One measured operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CollOp {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Broadcast,
    Reduce,
    Scatter,
    Gather,
    SendRecv,
}

impl CollOp {
    /// Every operation, in the order `--op all` runs them.
    pub(crate) const ALL: [CollOp; 9] = [
        CollOp::AllReduce,
        CollOp::AllGather,
        CollOp::ReduceScatter,
        CollOp::AllToAll,
        CollOp::Broadcast,
        CollOp::Reduce,
        CollOp::Scatter,
        CollOp::Gather,
        CollOp::SendRecv,
    ];

    /// The name used on the command line and in the output.
    pub(crate) fn name(self) -> &'static str {
        match self {
            CollOp::AllReduce => "all_reduce",
            CollOp::AllGather => "all_gather",
            CollOp::ReduceScatter => "reduce_scatter",
            CollOp::AllToAll => "all_to_all",
            CollOp::Broadcast => "broadcast",
            CollOp::Reduce => "reduce",
            CollOp::Scatter => "scatter",
            CollOp::Gather => "gather",
            CollOp::SendRecv => "send_recv",
        }
    }

    /// True for the operations that take a reduction.
    pub(crate) fn reduces(self) -> bool {
        matches!(
            self,
            CollOp::AllReduce | CollOp::Reduce | CollOp::ReduceScatter
        )
    }

    /// True for the operations that have a root.
    pub(crate) fn rooted(self) -> bool {
        matches!(
            self,
            CollOp::Broadcast | CollOp::Reduce | CollOp::Scatter | CollOp::Gather
        )
    }

    /// True when the size splits into one block per rank.
    pub(crate) fn splits(self) -> bool {
        matches!(
            self,
            CollOp::AllGather
                | CollOp::ReduceScatter
                | CollOp::AllToAll
                | CollOp::Scatter
                | CollOp::Gather
        )
    }

    /// The ctran algorithm names of this operation; `None` for point-to-point.
    pub(crate) fn algos(self) -> Option<Vec<&'static str>> {
        ctran::algos::names_for(self.name())
    }

    /// True when `name` is an algorithm of this operation.
    pub(crate) fn has_algo(self, name: &str) -> bool {
        self.algos().is_some_and(|v| v.contains(&name))
    }

    /// busbw / algbw for `n` ranks (nccl-tests' factors).
    pub(crate) fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            CollOp::AllReduce => 2.0 * (n - 1.0) / n,
            CollOp::AllGather | CollOp::ReduceScatter | CollOp::AllToAll => (n - 1.0) / n,
            CollOp::Broadcast
            | CollOp::Reduce
            | CollOp::Scatter
            | CollOp::Gather
            | CollOp::SendRecv => 1.0,
        }
    }
}

/// Parses a byte count with an optional K, M or G suffix (powers of 1024) and optional `B`.
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let (digits, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("expected a byte count such as 8, 512K, 64M or 1G, got `{s}`"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// The dtypes one `--dtype` value names (`all` names every one).
#[derive(Debug, Clone)]
pub(crate) struct DtypeList(Vec<DataType>);

/// The reductions one `--redop` value names (`all` names every one).
#[derive(Debug, Clone)]
pub(crate) struct RedopList(Vec<ReduceOp>);

fn parse_dtypes(s: &str) -> Result<DtypeList, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(DtypeList(DataType::ALL.to_vec()));
    }
    s.trim()
        .parse::<DataType>()
        .map(|d| DtypeList(vec![d]))
        .map_err(|_| "expected f16, bf16, f32, f64, i8, u8, i32, i64, bool or all".to_string())
}

fn parse_redops(s: &str) -> Result<RedopList, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(RedopList(
            ReduceOp::ALL
                .iter()
                .map(|&op| match op {
                    ReduceOp::PremulSum { .. } => ReduceOp::PremulSum {
                        factor: PREMUL_FACTOR,
                    },
                    op => op,
                })
                .collect(),
        ));
    }
    match s.trim().parse::<ReduceOp>() {
        Ok(ReduceOp::PremulSum { .. }) => Ok(RedopList(vec![ReduceOp::PremulSum {
            factor: PREMUL_FACTOR,
        }])),
        Ok(op) => Ok(RedopList(vec![op])),
        Err(_) => {
            Err("expected sum, prod, min, max, band, bor, bxor, avg, premul_sum or all".to_string())
        }
    }
}

fn parse_device(s: &str) -> Result<Device, String> {
    s.parse::<Device>()
        .map_err(|_| "expected cpu, cuda or cuda:N".to_string())
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| *v > 0.0)
        .and_then(|v| Duration::try_from_secs_f64(v).ok())
        .ok_or_else(|| format!("expected a positive number of seconds, got `{s}`"))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_suffixes() {
        assert_eq!(parse_bytes("8").unwrap(), 8);
        assert_eq!(parse_bytes("64K").unwrap(), 64 << 10);
        assert_eq!(parse_bytes("64m").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("1G").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("2MB").unwrap(), 2 << 20);
        assert_eq!(parse_bytes("16B").unwrap(), 16);
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("12X").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("99999999999999999G").is_err());
    }

    #[test]
    fn sizes_step_by_factor() {
        let a = Args::try_parse_from(["p", "-b", "8", "-e", "100", "-f", "3"]).unwrap();
        let s = Settings::from_args(a).unwrap();
        assert_eq!(s.sizes(), vec![8, 24, 72]);
        let a = Args::try_parse_from(["p", "-b", "1K", "-e", "1K"]).unwrap();
        assert_eq!(Settings::from_args(a).unwrap().sizes(), vec![1024]);
        let a = Args::try_parse_from(["p", "-b", "0", "-e", "4"]).unwrap();
        assert_eq!(Settings::from_args(a).unwrap().sizes(), vec![0, 1, 2, 4]);
    }

    #[test]
    fn lists_and_all() {
        let a = Args::try_parse_from([
            "p",
            "--op",
            "all_reduce,gather",
            "-d",
            "all",
            "-o",
            "sum,max",
        ])
        .unwrap();
        let s = Settings::from_args(a).unwrap();
        assert_eq!(s.ops, vec![CollOp::AllReduce, CollOp::Gather]);
        assert_eq!(s.dtypes.len(), DataType::ALL.len());
        assert_eq!(s.redops, vec![ReduceOp::Sum, ReduceOp::Max]);
        let s = Settings::from_args(Args::try_parse_from(["p"]).unwrap()).unwrap();
        assert_eq!(s.ops.len(), CollOp::ALL.len());
        assert_eq!(s.dtypes, vec![DataType::F32]);
    }

    #[test]
    fn algo_all_lists_every_algorithm_then_auto() {
        let a =
            Args::try_parse_from(["p", "--op", "broadcast,send_recv", "--algo", "all"]).unwrap();
        let s = Settings::from_args(a).unwrap();
        let names = |v: Vec<Option<String>>| -> Vec<String> {
            v.into_iter()
                .map(|x| x.unwrap_or_else(|| "-".into()))
                .collect()
        };
        assert_eq!(
            names(s.algos_for(CollOp::Broadcast).unwrap()),
            ["tree", "chain", "direct", "auto"]
        );
        assert_eq!(names(s.algos_for(CollOp::SendRecv).unwrap()), ["-"]);
        // One name: the ops that have it run with it, the others are skipped with the reason.
        let a = Args::try_parse_from(["p", "--algo", "Ring"]).unwrap();
        let s = Settings::from_args(a).unwrap();
        assert_eq!(names(s.algos_for(CollOp::AllGather).unwrap()), ["ring"]);
        let why = s.algos_for(CollOp::Broadcast).unwrap_err();
        assert!(why.contains("auto, tree, chain, direct"), "{why}");
        // A name no op has is an error that lists them.
        let a = Args::try_parse_from(["p", "--op", "broadcast", "--algo", "ring"]).unwrap();
        let e = Settings::from_args(a).unwrap_err().to_string();
        assert!(
            e.contains("--algo") && e.contains("broadcast: tree, chain, direct"),
            "{e}"
        );
        let a = Args::try_parse_from(["p", "--algo", "all", "--backend", "nccl"]).unwrap();
        assert!(Settings::from_args(a).is_err());
    }

    #[test]
    fn iterations_shrink_for_large_sizes() {
        let a =
            Args::try_parse_from(["p", "-w", "3", "-i", "20", "--max-iter-bytes", "64M"]).unwrap();
        let s = Settings::from_args(a).unwrap();
        assert_eq!(s.iterations(0), (3, 20));
        assert_eq!(s.iterations(1 << 20), (3, 20));
        assert_eq!(s.iterations(16 << 20), (3, 4));
        assert_eq!(s.iterations(64 << 20), (1, 1));
        assert_eq!(s.iterations(1 << 30), (1, 1));
        let a = Args::try_parse_from(["p", "-w", "0", "-i", "5"]).unwrap();
        assert_eq!(Settings::from_args(a).unwrap().iterations(1 << 30), (0, 5));
    }

    #[test]
    fn iterations_grow_to_the_floor_and_stay_under_the_cap() {
        let argv = [
            "p",
            "-w",
            "1",
            "-i",
            "8",
            "--min-iter-bytes",
            "64M",
            "--max-iter-bytes",
            "128M",
        ];
        let s = Settings::from_args(Args::try_parse_from(argv).unwrap()).unwrap();
        assert_eq!(s.iterations(0), (1, 8));
        assert_eq!(s.iterations(1 << 20), (1, 64));
        assert_eq!(s.iterations(4 << 20), (1, 16));
        assert_eq!(s.iterations(16 << 20), (1, 8));
        assert_eq!(s.iterations(32 << 20), (1, 4));
        assert_eq!(s.iterations(64 << 20), (1, 2));
        let a = Args::try_parse_from(["p", "-i", "5", "--min-iter-bytes", "1G"]).unwrap();
        assert_eq!(
            Settings::from_args(a).unwrap().iterations(1 << 20),
            (5, 1024)
        );
    }

    #[test]
    fn trace_ab_times_one_combination_in_groups_of_four_blocks() {
        let parse = |argv: &[&str]| {
            let base = ["p", "--op", "all_reduce", "-b", "8", "--trace-ab"];
            let args: Vec<&str> = base.iter().chain(argv).copied().collect();
            Settings::from_args(Args::try_parse_from(args).unwrap())
        };
        let s = parse(&["-e", "8", "--ab-block", "100", "-i", "800"]).unwrap();
        assert_eq!((s.trace_ab, s.iters), (Some(100), 800));
        for (argv, name) in [
            (
                &["-e", "8", "--ab-block", "100", "-i", "900"][..],
                "--iters",
            ),
            (
                &["-e", "8", "--ab-block", "100", "-i", "400"][..],
                "--iters",
            ),
            (&["-e", "16", "-i", "8000"][..], "sizes"),
            (&["-e", "8", "-i", "8000", "--rounds", "3"][..], "--rounds"),
            (
                &["-e", "8", "-i", "8000", "--min-iter-bytes", "64M"][..],
                "--min-iter-bytes",
            ),
            (
                &["-e", "8", "-i", "8000", "--op", "broadcast"][..],
                "operations",
            ),
            (
                &["-e", "8", "-i", "8000", "-d", "f32,f64"][..],
                "element types",
            ),
            (
                &["-e", "8", "-i", "8000", "-o", "sum,max"][..],
                "reductions",
            ),
            (
                &["-e", "8", "-i", "8000", "--backend", "nccl"][..],
                "--backend",
            ),
        ] {
            let e = parse(argv).unwrap_err().to_string();
            assert!(e.contains(name), "{argv:?}: {e}");
        }
        let s = Settings::from_args(Args::try_parse_from(["p"]).unwrap()).unwrap();
        assert_eq!(s.trace_ab, None);
        // The A/A control is a setting of --trace-ab only.
        let s = parse(&["-e", "8", "--ab-block", "100", "-i", "800", "--ab-control"]).unwrap();
        assert!(s.ab_control);
        let e = Args::try_parse_from(["p", "--ab-control"]).unwrap_err();
        assert!(e.to_string().contains("--trace-ab"), "{e}");
    }

    #[test]
    fn bad_values_name_the_argument() {
        for (argv, name) in [
            (["p", "--dtype", "f7"], "--dtype"),
            (["p", "-o", "mean"], "--redop"),
            (["p", "-e", "12X"], "--maxbytes"),
            (["p", "-f", "1"], "--stepfactor"),
            (["p", "-i", "0"], "--iters"),
            (["p", "-n", "0"], "--nranks"),
            (["p", "--op", "bogus"], "--op"),
            (["p", "--device", "tpu"], "--device"),
            (["p", "-c", "2"], "--check"),
            (["p", "--timeout", "0"], "--timeout"),
            (["p", "--rounds", "0"], "--rounds"),
            (["p", "--max-iter-bytes", "x"], "--max-iter-bytes"),
            (["p", "--min-iter-bytes", "x"], "--min-iter-bytes"),
        ] {
            let e = Args::try_parse_from(argv).unwrap_err().to_string();
            assert!(e.contains(name), "{argv:?}: {e}");
        }
        let a = Args::try_parse_from(["p", "-b", "1M", "-e", "1K"]).unwrap();
        let e = Settings::from_args(a).unwrap_err().to_string();
        assert!(e.contains("--minbytes"), "{e}");
    }
}
