//! # torchcomms-perf
//!
//! Bandwidth and correctness benchmark of the TorchComm collectives, modelled on
//! [nccl-tests](https://github.com/NVIDIA/nccl-tests): for every operation, element type,
//! reduction and size it times `--iters` iterations after `--warmup`, reports the time of the
//! slowest rank with algorithm and bus bandwidth, and checks every element of the result.
//!
//! ```text
//! torchcomms-perf -n 4 -b 8 -e 64M                 # 4 local ranks, every op, f32
//! torchcomms-perf -n 3 --op all_reduce -d all -o all -e 1M --json rows.json
//! TORCHCOMM_RANK=0 TORCHCOMM_SIZE=2 MASTER_ADDR=host MASTER_PORT=29500 torchcomms-perf
//! ```
//!
//! Run under a launcher (torchrun, srun, mpirun, or `TORCHCOMM_RANK`/`TORCHCOMM_SIZE`) each
//! process joins as its rank; run by hand it launches `-n` local ranks itself. `--help` lists
//! every option; the exit status is 0 when all went well, 3 when a result was wrong, 1 on
//! errors.

mod ab;
mod bench;
mod bind;
mod check;
mod cli;
mod device;
mod launch;

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;

// Links the backends so that `--backend ctran|nccl` resolves.
use torchcomms_ctran as _;
use torchcomms_nccl as _;

fn main() -> ExitCode {
    let args = cli::Args::parse();
    if args.print_cvars {
        return cli::print_cvars();
    }
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A closed stderr (`2>&1 | head`) must not turn into a panic while reporting it.
        .log_internal_errors(false)
        .init();
    let result = cli::Settings::from_args(args).and_then(|s| {
        let info = ctran::bootstrap::env::discover()
            .context("reading the launcher's rank and size from the environment")?;
        match info {
            Some(info) => {
                bind::apply_from_env()?;
                let rank = info.rank;
                bench::run_rank(&s, &info).with_context(|| format!("rank {rank}"))
            }
            None => launch::launch(&s),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("torchcomms-perf: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
