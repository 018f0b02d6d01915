//! Algorithms, one folder per collective and one file per algorithm. Each is written against
//! [`OpCtx`] (and so the [`Transport`](crate::transport::Transport) trait) alone, so it runs over
//! every transport.

pub mod all_gather;
pub mod all_reduce;
pub mod all_to_all;
pub mod barrier;
pub mod broadcast;
pub mod ctx;
pub mod gather;
pub mod reduce;
pub mod reduce_scatter;
pub mod scatter;
pub mod staging;
pub mod tree;

use crate::comm::op::{Op, P2p};
use crate::error::Result;
use crate::transport::ReqId;
pub use ctx::OpCtx;

/// Runs a collective to completion.
pub fn run_collective(cx: &mut OpCtx<'_>, op: &Op) -> Result<()> {
    match op {
        Op::AllReduce { buf, dtype, op } => all_reduce::ring::run(cx, *buf, *dtype, *op),
        Op::Reduce {
            buf,
            dtype,
            op,
            root,
        } => reduce::tree::run(cx, *buf, *dtype, *op, *root),
        Op::Broadcast { buf, root } => broadcast::tree::run(cx, *buf, *root),
        Op::AllGather { input, outputs } => all_gather::ring::run(cx, *input, outputs),
        Op::ReduceScatter {
            inputs,
            output,
            dtype,
            op,
        } => reduce_scatter::ring::run(cx, inputs, *output, *dtype, *op),
        Op::AllToAll { inputs, outputs } => all_to_all::direct::run(cx, inputs, outputs),
        Op::Scatter {
            inputs,
            output,
            root,
        } => scatter::direct::run(cx, inputs, *output, *root),
        Op::Gather {
            input,
            outputs,
            root,
        } => gather::direct::run(cx, *input, outputs, *root),
        Op::Barrier => barrier::dissemination::run(cx),
        Op::Send { .. } | Op::Recv { .. } | Op::Batch { .. } => {
            let mut reqs = post_p2p(cx, op)?;
            cx.wait_all(&mut reqs)
        }
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
