//! Collectives that read peers' shared-memory buffers directly, for communicators whose ranks
//! all share one host. Each rank owns two collective buffers; successive rounds alternate
//! between them, so a rank can fill round `k+1` while slower peers still read round `k`, and one
//! arrival barrier per round (two for all_reduce) is all the synchronisation needed.
//!
//! all_reduce: every rank copies its chunk in (prescaled), then reduces one slice of the chunk
//! straight from every peer's buffer in rank order, then copies every reduced slice out. Each
//! slice is reduced by exactly one rank, so all ranks end with bitwise the same result.
//!
//! Large messages skip the shared buffers when every local rank can read the others' memory
//! (cross-memory attach, probed at init; see [`crate::transport::shm::cma`]): ranks publish their buffers'
//! addresses with the first barrier and copy straight from each other's buffers, one copy
//! instead of two. all_reduce then reduces its own slice in place, reading the peers' pieces of
//! it through a small cache-resident buffer, and reads every other reduced slice from its owner;
//! a closing barrier keeps every buffer valid until all peers finished reading it.
//!
//! Every rank publishes what it is about to do (sequence number, collective, its size, a hash of
//! the rest) with the first barrier, and checks everyone's against its own, so ranks that
//! disagree fail with a [`ShmFail::Mismatch`] naming the peer and the sizes rather than reading
//! past a buffer or waiting for rounds that never come.

use crate::comm::stable_hash::StableHasher;
use crate::comm::Op;
use crate::error::{Error, Result};
use crate::kernels::Reducer;
use crate::span::Span;
use crate::transport::TransportError;

mod ctx;
mod lane;
mod moves;
mod reduce;
mod team;

pub use ctx::{ShmCtx, Waiting, LONG_WAIT};
pub use lane::Lane;
pub use moves::{all_gather, all_to_all, broadcast};
pub use reduce::{all_reduce, reduce, reduce_scatter};
pub use team::{laned_operations, Team};

/// Whether `op` has a shared-memory form (all_to_all copies through the shared buffers where
/// ranks cannot read each other's memory).
pub fn runs(op: &Op) -> bool {
    matches!(
        op,
        Op::AllReduce { .. }
            | Op::Reduce { .. }
            | Op::ReduceScatter { .. }
            | Op::AllGather { .. }
            | Op::Broadcast { .. }
            | Op::AllToAll { .. }
    )
}

/// Runs `op` (one [`runs`] accepts) over shared memory among `nranks` ranks, cut into lanes
/// when the rank has a `team` of helpers and the operation is large enough. The outer error:
/// its arguments were refused before anything moved.
pub fn run(
    cx: &mut ShmCtx<'_>,
    team: Option<&Team>,
    op: &Op,
    nranks: usize,
) -> Result<Result<(), ShmFail>> {
    let Some(team) = team else {
        return run_one(cx, op, nranks);
    };
    // Arguments a lane refuses (a reduction's element type or op) are refused by every lane,
    // each before it touches the segment, so a refused operation moves nothing on any lane.
    if let Op::AllToAll { inputs, outputs } = op {
        return all_to_all_on(cx, team, op, inputs, outputs, nranks);
    }
    match team.cuts(op) {
        Some(whole) => team.run(cx, op, whole, nranks, |cx, part| run_one(cx, part, nranks)),
        None => run_one(cx, op, nranks),
    }
}

/// all_to_all with a team: the ranks' totals, published with the first barrier, decide the
/// cut; cut, this lane reads the first part of every block from what it published already.
fn all_to_all_on(
    cx: &mut ShmCtx<'_>,
    team: &Team,
    op: &Op,
    inputs: &[Span],
    outputs: &[Span],
    nranks: usize,
) -> Result<Result<(), ShmFail>> {
    let total = match moves::all_to_all_publish(cx, inputs) {
        Ok(total) => total,
        Err(fail) => return Ok(Err(fail)),
    };
    let slots = cx.lane.all_to_all_copies;
    if !team.cuts_all_to_all(total, nranks) {
        if slots {
            return Ok(moves::all_to_all_slots(cx, inputs, outputs));
        }
        return Ok(moves::all_to_all_read(cx, inputs, outputs, outputs));
    }
    let first = |cx: &mut ShmCtx<'_>, part: &Op| {
        let Op::AllToAll {
            inputs: ins,
            outputs: parts,
        } = part
        else {
            unreachable!("a part of an all_to_all is an all_to_all")
        };
        if slots {
            return Ok(moves::all_to_all_slots(cx, ins, parts));
        }
        Ok(moves::all_to_all_read(cx, inputs, outputs, parts))
    };
    team.run(cx, op, total, nranks, first)
}

/// Runs `op` on one lane (`cx`'s).
fn run_one(cx: &mut ShmCtx<'_>, op: &Op, nranks: usize) -> Result<Result<(), ShmFail>> {
    let reducer = |dtype, op| Reducer::new(dtype, op, nranks);
    Ok(match op {
        Op::AllReduce { buf, dtype, op } => all_reduce(cx, *buf, &reducer(*dtype, *op)?),
        Op::Reduce {
            buf,
            dtype,
            op,
            root,
        } => reduce(cx, *buf, &reducer(*dtype, *op)?, *root),
        Op::ReduceScatter {
            inputs,
            output,
            dtype,
            op,
        } => reduce_scatter(cx, inputs, *output, &reducer(*dtype, *op)?),
        Op::AllGather { input, outputs } => all_gather(cx, *input, outputs),
        Op::Broadcast { buf, root } => broadcast(cx, *buf, *root),
        Op::AllToAll { inputs, outputs } if !cx.lane.all_to_all_copies => {
            all_to_all(cx, inputs, outputs)
        }
        Op::AllToAll { inputs, outputs } => moves::all_to_all_slots(cx, inputs, outputs),
        other => {
            return Err(Error::NotSupported(format!(
                "{} as a shared-memory collective",
                other.name()
            )))
        }
    })
}

/// Why a shared-memory collective stopped.
#[derive(Debug)]
pub enum ShmFail {
    /// The deadline passed while waiting for `waiting_for`.
    Deadline {
        /// The first rank that had not arrived.
        waiting_for: Option<usize>,
    },
    /// A peer failed.
    Peer(TransportError),
    /// Ranks disagree about the operation (sizes, element type, reduce op, root, or which
    /// operation it is).
    Mismatch {
        /// The (global) rank whose description differs from this rank's.
        peer: usize,
        /// What differs.
        detail: String,
    },
}

/// Which collective a published descriptor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
enum Kind {
    AllReduce = 1,
    Reduce = 2,
    ReduceScatter = 3,
    AllGather = 4,
    Broadcast = 5,
    AllToAll = 6,
}

impl Kind {
    fn name(code: u64) -> &'static str {
        match code {
            1 => "all_reduce",
            2 => "reduce",
            3 => "reduce_scatter",
            4 => "all_gather",
            5 => "broadcast",
            6 => "all_to_all",
            _ => "nothing",
        }
    }
}

/// Element type and reduce op, which every rank of a reduction must agree on.
pub(super) fn red_args(red: &Reducer) -> StableHasher {
    StableHasher::new().str(&format!("{:?}/{:?}", red.dtype(), red.op()))
}

/// What this rank is about to do, as it publishes it.
#[derive(Debug, Clone, Copy)]
struct Desc {
    kind: Kind,
    bytes: usize,
    args: u64,
}
