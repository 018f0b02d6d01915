//! One rank of a multi-process test job. The scenario comes from the command line, rank and
//! size from the launcher environment; the outcome is printed and signalled by the exit code.

mod bad_input;
mod faults;
mod moe;
mod p2p;
mod rdma;
mod suite;
mod threads;
mod window;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};
use torchcomms::{new_comm, CommOptions, Device, OpOptions, ReduceOp, Tensor, TorchComm};
use torchcomms_ctran as _;

/// One rank of a multi-process test job of torchcomms-tests.
#[derive(Debug, Parser)]
#[command(name = "tc-worker")]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

/// What the job does.
#[derive(Debug, Subcommand)]
enum Scenario {
    /// Every collective, dtype and reduction on sizes 0 to `--large`, checked.
    Suite {
        /// Bytes of the large sizes (0: none).
        #[arg(long, default_value_t = 0)]
        large: usize,
        /// Run every collective with the K-th of its algorithms (modulo their number).
        #[arg(long = "algo-set", value_name = "K")]
        algo_set: Option<usize>,
    },
    /// The victim dies during a large all_reduce; the survivors report their error.
    KillAllreduce(Victim),
    /// The victim dies during a large all_to_all; the survivors report their error.
    KillAlltoall(Victim),
    /// The victim dies while receiving a stream of sends; its sender reports its error.
    KillSendrecv(Victim),
    /// The victim sleeps through an all_reduce; the others time out.
    Stall(Victim),
    /// Communicators created back to back, each used once.
    BackToBack {
        /// How many.
        #[arg(long, default_value_t = 3)]
        count: usize,
    },
    /// One checked all_reduce.
    Simple,
    /// Every window call, a ring of puts and signals, disjoint slots, bad input.
    Window {
        /// Iterations of the ring.
        #[arg(long, default_value_t = 1000)]
        iters: usize,
    },
    /// The RDMA transfer API between pairs of ranks (another host's, then its own host's).
    Rdma,
    /// Bad input fails with errors naming the argument and leaves the communicator usable.
    Errors,
    /// Rounds of MoE dispatch and combine, checked bit for bit.
    Moe {
        /// high_throughput or low_latency.
        #[arg(long, default_value = "high_throughput")]
        mode: String,
        /// Dispatch in FP8.
        #[arg(long)]
        fp8: bool,
        /// random, or one (every token to expert 0).
        #[arg(long, default_value = "random")]
        routing: String,
    },
    /// device_alltoallv_single with counts that overflow rank 0's output or are negative.
    DynamicCounts {
        /// overflow or negative.
        #[arg(long)]
        what: String,
    },
    /// Rank 0 disagrees with the others about the reduce op, the dtype, the root, the
    /// collective or the order of collectives.
    Disagree {
        /// redop, dtype, root, collective or order.
        #[arg(long)]
        what: String,
    },
    /// A thread issues while another thread's operations are in flight.
    ThreadsTakingTurns,
    /// Point-to-point orders where a waiting sender's acknowledgement follows data its
    /// receiver has not asked for yet.
    P2pOrder,
    /// The last rank never joins a split.
    SplitWithoutAPeer,
    /// One rank's arguments are refused where another rank's part is only sending.
    Lopsided {
        /// bcast-size, a2av-splits, gather-list or send-size.
        #[arg(long)]
        what: String,
    },
    /// Ranks disagree about the size of a collective.
    Mismatch {
        /// The collective: all_reduce, broadcast, all_gather or reduce_scatter.
        #[arg(long, default_value = "all_reduce")]
        op: String,
        /// small, mixed or large.
        #[arg(long, default_value = "small")]
        size: String,
    },
}

/// The rank that fails in a fault scenario.
#[derive(Debug, Args)]
struct Victim {
    /// Its rank.
    #[arg(long, default_value_t = 1)]
    victim: usize,
}

pub(crate) fn comm_from_env(name: &str) -> Result<TorchComm> {
    Ok(new_comm(
        "ctran",
        Device::Cpu,
        name,
        CommOptions::from_env()?,
    )?)
}

/// Creates communicators back to back without a store (the MASTER_PORT store must be
/// released after each init) and uses each.
fn back_to_back(count: usize) -> Result<()> {
    for k in 0..count {
        let comm = comm_from_env(&format!("b2b{k}"))?;
        let t = Tensor::from_vec(vec![1i32; 5]);
        comm.all_reduce(&t, ReduceOp::Sum, &OpOptions::sync())?
            .wait()?;
        comm.finalize()?;
        let n = comm.get_size() as i32;
        if t.to_vec::<i32>()? != vec![n; 5] {
            bail!("comm {k}: wrong all_reduce result");
        }
    }
    println!("BACK_TO_BACK OK {count}");
    Ok(())
}

/// Simple job used by the forged-connection test: one checked all_reduce.
fn simple() -> Result<()> {
    let comm = comm_from_env("simple")?;
    let t = Tensor::from_vec(vec![comm.get_rank() as i64 + 1; 100]);
    comm.all_reduce(&t, ReduceOp::Sum, &OpOptions::sync())?
        .wait()?;
    let n = comm.get_size() as i64;
    if t.to_vec::<i64>()? != vec![n * (n + 1) / 2; 100] {
        bail!("wrong all_reduce result");
    }
    comm.finalize()?;
    println!("SIMPLE OK rank {}", comm.get_rank());
    Ok(())
}

fn main() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TORCHCOMMS_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let cli = Cli::parse();
    let (name, result) = match cli.scenario {
        Scenario::Suite { large, algo_set } => ("suite", suite::suite(large, algo_set)),
        Scenario::KillAllreduce(v) => ("kill-allreduce", faults::fault(v.victim, "kill-allreduce")),
        Scenario::KillAlltoall(v) => ("kill-alltoall", faults::fault(v.victim, "kill-alltoall")),
        Scenario::KillSendrecv(v) => ("kill-sendrecv", faults::fault(v.victim, "kill-sendrecv")),
        Scenario::Stall(v) => ("stall", faults::fault(v.victim, "stall")),
        Scenario::BackToBack { count } => ("back-to-back", back_to_back(count)),
        Scenario::Simple => ("simple", simple()),
        Scenario::Window { iters } => ("window", window::window(iters)),
        Scenario::Rdma => ("rdma", rdma::rdma()),
        Scenario::Errors => ("errors", bad_input::errors()),
        Scenario::Mismatch { op, size } => ("mismatch", bad_input::mismatch(&op, &size)),
        Scenario::Disagree { what } => ("disagree", bad_input::disagree(&what)),
        Scenario::Moe { mode, fp8, routing } => ("moe", moe::moe(&mode, fp8, &routing)),
        Scenario::DynamicCounts { what } => ("dynamic-counts", bad_input::dynamic_counts(&what)),
        Scenario::ThreadsTakingTurns => ("threads-taking-turns", threads::threads_taking_turns()),
        Scenario::P2pOrder => ("p2p-order", p2p::p2p_order()),
        Scenario::Lopsided { what } => ("lopsided", bad_input::lopsided(&what)),
        Scenario::SplitWithoutAPeer => ("split-without-a-peer", bad_input::split_without_a_peer()),
    };
    if let Err(e) = result {
        eprintln!("tc-worker {name}: {e:#}");
        std::process::exit(1);
    }
}
