//! One rank of the colltrace/analyzer multi-process tests (`analyzer/tests/hang.rs`). Rank and
//! size come from the launcher environment (TORCHCOMM_RANK/SIZE, MASTER_ADDR/PORT), the trace
//! settings from the cvars (TORCHCOMMS_TRACE_*); the scenario from the command line:
//!
//! - `skip --iters N --rank R --at I`: rank R skips the I-th all_reduce, then every rank calls a
//!   barrier: the ranks disagree at one sequence number and time out.
//! - `mismatch --iters N --rank R --at I`: rank R passes 64 elements instead of 2 to the I-th
//!   all_reduce; then every rank dumps through the API.
//! - `slow --iters N --rank R --delay-ms D`: rank R sleeps D ms before every all_reduce; then
//!   every rank dumps through the API.
//! - `absent --rank R`: rank R exits without creating the communicator; the others time out
//!   creating it.
//!
//! `--hold-ms H` keeps every rank (and its live endpoint) up for H ms after its last operation
//! and before it dumps, so that `comms-analyzer watch` sees the live state of a job that ran to
//! its end.
//!
//! Prints `RESULT ok` or `RESULT error: ...` and exits 0 unless the scenario itself broke.

use std::time::Duration;

use anyhow::{Context, Result};
use torchcomms::{new_comm, CommOptions, Device, OpOptions, ReduceOp, Tensor, TorchComm};
use torchcomms_ctran as _;

fn arg(args: &[String], flag: &str, default: usize) -> Result<usize> {
    match args.iter().position(|a| a == flag) {
        Some(i) => args
            .get(i + 1)
            .context("missing value")
            .and_then(|v| v.parse().context("not a number"))
            .with_context(|| format!("{flag} N")),
        None => Ok(default),
    }
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

fn run(scenario: &str, args: &[String]) -> Result<()> {
    let iters = arg(args, "--iters", 5)?;
    let odd = arg(args, "--rank", 2)?;
    let at = arg(args, "--at", 2)?;
    let delay = arg(args, "--delay-ms", 100)?;
    let hold = arg(args, "--hold-ms", 0)?;
    // The rank the launcher gave this process (an input, not a tunable).
    if scenario == "absent" && std::env::var("TORCHCOMM_RANK").ok() == Some(odd.to_string()) {
        println!("RESULT absent");
        return Ok(());
    }
    let comm = new_comm("ctran", Device::Cpu, "world", CommOptions::from_env()?)?;
    let me = comm.get_rank();
    let mut result: torchcomms::Result<()> = Ok(());
    for i in 0..iters {
        let count = match scenario {
            "skip" if me == odd && i == at => continue,
            "mismatch" if me == odd && i == at => 64,
            _ => 2,
        };
        if scenario == "slow" && me == odd {
            std::thread::sleep(Duration::from_millis(delay as u64));
        }
        result = all_reduce(&comm, count, i % 2 == 1);
        if result.is_err() {
            break;
        }
    }
    if result.is_ok() {
        result = comm.barrier(&OpOptions::sync()).and_then(|w| w.wait());
    }
    if hold > 0 {
        std::thread::sleep(Duration::from_millis(hold as u64));
    }
    if scenario != "skip" {
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
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().map(String::as_str).unwrap_or("");
    let r = match scenario {
        "skip" | "mismatch" | "slow" => run(scenario, &args),
        "absent" => match run(scenario, &args) {
            // The communicator cannot be created without the absent rank: that is the point.
            Err(e) => {
                println!("RESULT error: {e:#}");
                Ok(())
            }
            ok => ok,
        },
        other => Err(anyhow::anyhow!(
            "unknown scenario {other:?}: expected skip, mismatch, slow or absent"
        )),
    };
    if let Err(e) = r {
        eprintln!("colltrace-worker {scenario}: {e:#}");
        std::process::exit(1);
    }
}
