//! One rank of the colltrace/analyzer multi-process tests (`tests/tests/hang.rs`). Rank and
//! size come from the launcher environment (TORCHCOMM_RANK/SIZE, MASTER_ADDR/PORT), the trace
//! settings from the cvars (TORCHCOMMS_TRACE_*); the scenario from the command line:
//!
//! - `skip --iters N --rank R --at I`: rank R skips the I-th all_reduce, then every rank calls a
//!   barrier: the ranks disagree at one sequence number and time out.
//! - `mismatch --iters N --rank R --at I`: rank R passes 64 elements instead of 2 to the I-th
//!   all_reduce; then every rank dumps through the API.
//! - `slow --iters N --rank R --delay-ms D`: rank R sleeps D ms before every all_reduce; then
//!   every rank dumps through the API.
//! - `stall --iters N --rank R --at I --delay-ms D`: rank R sleeps D ms before the I-th
//!   all_reduce, the others wait in it: a live hang whose cause is a rank that never arrives.
//! - `absent --rank R`: rank R exits without creating the communicator; the others time out
//!   creating it.
//!
//! `--hold-ms H` keeps every rank (and its live endpoint) up for H ms after its last operation
//! and before it dumps, so that `comms-analyzer watch` sees the live state of a job that ran to
//! its end.
//!
//! Prints `RESULT ok` or `RESULT error: ...` and exits 0 unless the scenario itself broke.

use std::time::Duration;

use anyhow::Result;
use clap::{Parser, ValueEnum};
use torchcomms::{new_comm, CommOptions, Device, OpOptions, ReduceOp, Tensor, TorchComm};
use torchcomms_ctran as _;

/// What goes wrong in the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// Rank `--rank` skips the `--at`-th all_reduce.
    Skip,
    /// Rank `--rank` passes 64 elements instead of 2 to the `--at`-th all_reduce.
    Mismatch,
    /// Rank `--rank` sleeps `--delay-ms` before every all_reduce.
    Slow,
    /// Rank `--rank` sleeps `--delay-ms` before the `--at`-th all_reduce.
    Stall,
    /// Rank `--rank` exits without creating the communicator.
    Absent,
}

/// One rank of the colltrace/analyzer multi-process tests.
#[derive(Debug, Parser)]
#[command(name = "colltrace-worker")]
struct Args {
    /// The scenario.
    #[arg(value_enum)]
    scenario: Scenario,
    /// All-reduces to run.
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// The rank that misbehaves.
    #[arg(long, default_value_t = 2)]
    rank: usize,
    /// Which all_reduce it misbehaves in (0-based).
    #[arg(long, default_value_t = 2)]
    at: usize,
    /// Delay of the slow rank, in ms.
    #[arg(long = "delay-ms", default_value_t = 100)]
    delay_ms: u64,
    /// How long every rank stays up after its last operation, in ms.
    #[arg(long = "hold-ms", default_value_t = 0)]
    hold_ms: u64,
}

fn all_reduce(comm: &TorchComm, count: usize, async_op: bool) -> torchcomms::Result<()> {
    let t = Tensor::from_vec(vec![1.0f32; count]);
    let opts = if async_op {
        OpOptions::async_op()
    } else {
        OpOptions::sync()
    };
    comm.all_reduce(&t, ReduceOp::Sum, &opts)?.wait()
}

fn run(args: &Args) -> Result<()> {
    let scenario = args.scenario;
    let odd = args.rank;
    // The rank the launcher gave this process (an input, not a tunable).
    if scenario == Scenario::Absent && std::env::var("TORCHCOMM_RANK").ok() == Some(odd.to_string())
    {
        println!("RESULT absent");
        return Ok(());
    }
    let comm = new_comm("ctran", Device::Cpu, "world", CommOptions::from_env()?)?;
    let me = comm.get_rank();
    let mut result: torchcomms::Result<()> = Ok(());
    for i in 0..args.iters {
        let count = match scenario {
            Scenario::Skip if me == odd && i == args.at => continue,
            Scenario::Mismatch if me == odd && i == args.at => 64,
            _ => 2,
        };
        let stalls = scenario == Scenario::Stall && i == args.at;
        if (scenario == Scenario::Slow || stalls) && me == odd {
            std::thread::sleep(Duration::from_millis(args.delay_ms));
        }
        result = all_reduce(&comm, count, i % 2 == 1);
        if result.is_err() {
            break;
        }
    }
    if result.is_ok() {
        result = comm.barrier(&OpOptions::sync()).and_then(|w| w.wait());
    }
    if args.hold_ms > 0 {
        std::thread::sleep(Duration::from_millis(args.hold_ms));
    }
    if !matches!(scenario, Scenario::Skip | Scenario::Stall) {
        let files = colltrace::dump_all(&colltrace::trace_dir())?;
        println!("DUMPED {files:?}");
    }
    match &result {
        Ok(()) => {
            println!("RESULT ok");
            comm.finalize()?;
        }
        Err(e) => println!("RESULT error: {e}"),
    }
    Ok(())
}

fn main() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TORCHCOMMS_LOG")
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let args = Args::parse();
    let r = match run(&args) {
        // The communicator cannot be created without the absent rank: that is the point.
        Err(e) if args.scenario == Scenario::Absent => {
            println!("RESULT error: {e:#}");
            Ok(())
        }
        r => r,
    };
    if let Err(e) = r {
        let scenario = args
            .scenario
            .to_possible_value()
            .expect("no skipped variant");
        eprintln!("colltrace-worker {}: {e:#}", scenario.get_name());
        std::process::exit(1);
    }
}
