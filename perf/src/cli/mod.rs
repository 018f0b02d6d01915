//! Command line: the options, their parsers, and the validated [`Settings`] the ranks run with.

mod op;
mod settings;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use ctran::{DataType, Device, ReduceOp};

pub(crate) use op::{CollOp, OpArg};
pub(crate) use settings::Settings;

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
