//! Algorithms, one folder per collective and one file per algorithm. Each is written against
//! [`OpCtx`] (and so the [`Transport`](crate::transport::Transport) trait) alone, so it runs over
//! every transport. [`select`] chooses among them: explicitly (configuration or per-call hint)
//! or with a calibrated cost model.
//!
//! | collective | algorithms (hint / `CTRAN_<COLL>_ALGO` names) |
//! |---|---|
//! | all_reduce | `ring`, `halving_doubling`, `direct`, `tree` |
//! | all_gather (_single, _v) | `ring`, `recursive_doubling`, `bruck`, `direct` |
//! | reduce_scatter (_single, _v) | `ring`, `recursive_halving`, `direct` |
//! | broadcast | `tree`, `chain`, `direct` |
//! | reduce | `tree`, `direct` |
//! | all_to_all (_single, _v_single) | `pairwise`, `direct`, `bruck` |
//! | scatter, gather | `tree`, `direct` |
//! | barrier | `dissemination` |

pub mod all_gather;
pub mod all_reduce;
pub mod all_to_all;
pub mod barrier;
pub mod broadcast;
pub mod ctx;
pub mod gather;
pub mod pipe;
pub mod reduce;
pub mod reduce_scatter;
pub mod scatter;
pub mod select;
pub mod staging;
pub mod tree;

use crate::comm::op::{Op, P2p};
use crate::error::{Error, Result};
use crate::transport::ReqId;
pub use ctx::OpCtx;
pub use select::{names, names_for, Algo, Collective};

/// The algorithm each collective runs when none was chosen.
pub fn default_algo(c: Collective) -> Algo {
    match c {
        Collective::AllReduce => Algo::AllReduceRing,
        Collective::AllGather => Algo::AllGatherRing,
        Collective::ReduceScatter => Algo::ReduceScatterRing,
        Collective::Broadcast => Algo::BroadcastTree,
        Collective::Reduce => Algo::ReduceTree,
        Collective::AllToAll => Algo::AllToAllDirect,
        Collective::Scatter => Algo::ScatterDirect,
        Collective::Gather => Algo::GatherDirect,
        Collective::Barrier => Algo::BarrierDissemination,
    }
}

/// Runs a collective to completion with `algo` (the collective's [`default_algo`] when `None`;
/// ignored for point-to-point operations). An algorithm of another collective is refused.
pub fn run_collective(cx: &mut OpCtx<'_>, op: &Op, algo: Option<Algo>) -> Result<()> {
    use Algo::*;
    if let Op::AllToAllDynamic(a) = op {
        return all_to_all::dynamic::run(cx, a);
    }
    let Some(coll) = Collective::of(op) else {
        let mut reqs = post_p2p(cx, op)?;
        return cx.wait_all(&mut reqs);
    };
    let algo = algo.unwrap_or_else(|| default_algo(coll));
    if algo.collective() != coll {
        return Err(Error::invalid(
            "algo",
            format!("an algorithm of {coll}"),
            algo.to_string(),
        ));
    }
    match (op, algo) {
        (Op::AllReduce { buf, dtype, op }, a) => match a {
            AllReduceHalvingDoubling => all_reduce::halving_doubling::run(cx, *buf, *dtype, *op),
            AllReduceDirect => all_reduce::direct::run(cx, *buf, *dtype, *op),
            AllReduceTree => all_reduce::tree::run(cx, *buf, *dtype, *op),
            _ => all_reduce::ring::run(cx, *buf, *dtype, *op),
        },
        (
            Op::Reduce {
                buf,
                dtype,
                op,
                root,
            },
            a,
        ) => match a {
            ReduceDirect => reduce::direct::run(cx, *buf, *dtype, *op, *root),
            _ => reduce::tree::run(cx, *buf, *dtype, *op, *root),
        },
        (Op::Broadcast { buf, root }, a) => match a {
            BroadcastChain => broadcast::chain::run(cx, *buf, *root),
            BroadcastDirect => broadcast::direct::run(cx, *buf, *root),
            _ => broadcast::tree::run(cx, *buf, *root),
        },
        (Op::AllGather { input, outputs }, a) => match a {
            AllGatherRecursiveDoubling => all_gather::recursive_doubling::run(cx, *input, outputs),
            AllGatherBruck => all_gather::bruck::run(cx, *input, outputs),
            AllGatherDirect => all_gather::direct::run(cx, *input, outputs),
            _ => all_gather::ring::run(cx, *input, outputs),
        },
        (
            Op::ReduceScatter {
                inputs,
                output,
                dtype,
                op,
            },
            a,
        ) => match a {
            ReduceScatterRecursiveHalving => {
                reduce_scatter::recursive_halving::run(cx, inputs, *output, *dtype, *op)
            }
            ReduceScatterDirect => reduce_scatter::direct::run(cx, inputs, *output, *dtype, *op),
            _ => reduce_scatter::ring::run(cx, inputs, *output, *dtype, *op),
        },
        (Op::AllToAll { inputs, outputs }, a) => match a {
            AllToAllPairwise => all_to_all::pairwise::run(cx, inputs, outputs),
            AllToAllBruck => all_to_all::bruck::run(cx, inputs, outputs),
            _ => all_to_all::direct::run(cx, inputs, outputs),
        },
        (
            Op::Scatter {
                inputs,
                output,
                root,
            },
            a,
        ) => match a {
            ScatterTree => scatter::tree::run(cx, inputs, *output, *root),
            _ => scatter::direct::run(cx, inputs, *output, *root),
        },
        (
            Op::Gather {
                input,
                outputs,
                root,
            },
            a,
        ) => match a {
            GatherTree => gather::tree::run(cx, *input, outputs, *root),
            _ => gather::direct::run(cx, *input, outputs, *root),
        },
        (Op::Barrier, _) => barrier::dissemination::run(cx),
        _ => unreachable!("Collective::of covers every collective"),
    }
}

/// Posts the transfers of a point-to-point operation without waiting for them.
pub fn post_p2p(cx: &mut OpCtx<'_>, op: &Op) -> Result<Vec<ReqId>> {
    let one;
    let ops: &[P2p] = match op {
        Op::Send { buf, peer } => {
            one = [P2p::Send {
                buf: *buf,
                peer: *peer,
            }];
            &one
        }
        Op::Recv { buf, peer } => {
            one = [P2p::Recv {
                buf: *buf,
                peer: *peer,
            }];
            &one
        }
        Op::Batch { ops } => ops,
        _ => return Ok(Vec::new()),
    };
    // Receives first: a batch that sends to and receives from the same peer then never waits on
    // itself.
    let mut reqs = Vec::with_capacity(ops.len());
    for p in ops {
        if let P2p::Recv { buf, peer } = p {
            reqs.push(cx.recv(*peer, *buf)?);
        }
    }
    for p in ops {
        if let P2p::Send { buf, peer } = p {
            reqs.push(cx.send(*peer, *buf)?);
        }
    }
    Ok(reqs)
}
