//! What a communicator can be asked to do. Buffers are raw [`Span`]s whose owners keep them alive
//! until the operation completes; arguments were validated by the API layer, and the engine
//! re-checks only what it relies on for memory safety.

use std::fmt;

use crate::span::Span;
use crate::transport::tag::{OpTag, TagKind};
use crate::types::{DataType, ReduceOp};

/// One point-to-point transfer inside a batch.
#[derive(Debug, Clone, Copy)]
pub enum P2p {
    /// Send `buf` to `peer`.
    Send {
        /// Data to send.
        buf: Span,
        /// Destination rank.
        peer: usize,
    },
    /// Receive into `buf` from `peer`.
    Recv {
        /// Where the data lands.
        buf: Span,
        /// Source rank.
        peer: usize,
    },
}

/// An operation with its buffers.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Op {
    /// In-place all-reduce of `buf`.
    AllReduce {
        /// Input and output.
        buf: Span,
        /// Element type.
        dtype: DataType,
        /// Reduction.
        op: ReduceOp,
    },
    /// Reduce into `buf` on `root`; other ranks' `buf` is only read.
    Reduce {
        /// Input everywhere, output on root.
        buf: Span,
        /// Element type.
        dtype: DataType,
        /// Reduction.
        op: ReduceOp,
        /// Destination rank.
        root: usize,
    },
    /// Copy `buf` of `root` into `buf` of every rank.
    Broadcast {
        /// Source on root, destination elsewhere.
        buf: Span,
        /// Source rank.
        root: usize,
    },
    /// Every rank's `input` lands in `outputs[rank]` of every rank (sizes may differ per rank).
    AllGather {
        /// This rank's contribution.
        input: Span,
        /// One span per rank.
        outputs: Vec<Span>,
    },
    /// `inputs[r]` of all ranks is reduced into `output` of rank `r`.
    ReduceScatter {
        /// One span per rank.
        inputs: Vec<Span>,
        /// This rank's result.
        output: Span,
        /// Element type.
        dtype: DataType,
        /// Reduction.
        op: ReduceOp,
    },
    /// `inputs[r]` goes to rank `r`, arriving in its `outputs[self]`.
    AllToAll {
        /// One span per destination.
        inputs: Vec<Span>,
        /// One span per source.
        outputs: Vec<Span>,
    },
    /// `inputs[r]` of root goes to `output` of rank `r`.
    Scatter {
        /// One span per rank on root; empty elsewhere.
        inputs: Vec<Span>,
        /// This rank's piece.
        output: Span,
        /// Source rank.
        root: usize,
    },
    /// `input` of rank `r` goes to `outputs[r]` of root.
    Gather {
        /// This rank's piece.
        input: Span,
        /// One span per rank on root; empty elsewhere.
        outputs: Vec<Span>,
        /// Destination rank.
        root: usize,
    },
    /// Returns once every rank has entered.
    Barrier,
    /// Point-to-point send.
    Send {
        /// Data.
        buf: Span,
        /// Destination.
        peer: usize,
    },
    /// Point-to-point receive.
    Recv {
        /// Destination buffer.
        buf: Span,
        /// Source.
        peer: usize,
    },
    /// Sends and receives that run concurrently; completes when all have.
    Batch {
        /// The transfers.
        ops: Vec<P2p>,
    },
    /// all_to_all_v with split sizes read from memory when it runs
    /// ([`crate::algos::all_to_all::dynamic`]).
    AllToAllDynamic(crate::algos::all_to_all::dynamic::DynamicAllToAll),
    /// A one-sided window operation ([`crate::window`]).
    Window(crate::window::WindowOp),
}

impl Op {
    /// The name used in errors and traces (torchcomms' `OpName`).
    pub fn name(&self) -> &'static str {
        match self {
            Op::AllReduce { .. } => "all_reduce",
            Op::Reduce { .. } => "reduce",
            Op::Broadcast { .. } => "broadcast",
            Op::AllGather { .. } => "all_gather",
            Op::ReduceScatter { .. } => "reduce_scatter",
            Op::AllToAll { .. } => "all_to_all",
            Op::AllToAllDynamic(_) => "device_alltoallv_single",
            Op::Scatter { .. } => "scatter",
            Op::Gather { .. } => "gather",
            Op::Barrier => "barrier",
            Op::Send { .. } => "send",
            Op::Recv { .. } => "recv",
            Op::Batch { .. } => "batch_op_issue",
            Op::Window(w) => w.name(),
        }
    }

    /// What peers compare before using this operation's messages (see [`OpTag`]): for a
    /// collective its kind, sequence number `seq`, element type, reduce op and root.
    pub fn tag(&self, seq: u64) -> OpTag {
        let c = |kind, dtype, op, root| OpTag::collective(kind, seq, dtype, op, root);
        match self {
            Op::AllReduce { dtype, op, .. } => c(TagKind::AllReduce, Some(*dtype), Some(*op), None),
            Op::Reduce {
                dtype, op, root, ..
            } => c(TagKind::Reduce, Some(*dtype), Some(*op), Some(*root)),
            Op::Broadcast { root, .. } => c(TagKind::Broadcast, None, None, Some(*root)),
            Op::AllGather { .. } => c(TagKind::AllGather, None, None, None),
            Op::ReduceScatter { dtype, op, .. } => {
                c(TagKind::ReduceScatter, Some(*dtype), Some(*op), None)
            }
            Op::AllToAll { .. } => c(TagKind::AllToAll, None, None, None),
            Op::AllToAllDynamic(_) => c(TagKind::AllToAllDynamic, None, None, None),
            Op::Scatter { root, .. } => c(TagKind::Scatter, None, None, Some(*root)),
            Op::Gather { root, .. } => c(TagKind::Gather, None, None, Some(*root)),
            Op::Barrier => c(TagKind::Barrier, None, None, None),
            Op::Send { .. } | Op::Recv { .. } | Op::Batch { .. } | Op::Window(_) => OpTag::P2P,
        }
    }

    /// Point-to-point operations are numbered apart from collectives (like NCCL's p2p seq).
    pub fn is_p2p(&self) -> bool {
        matches!(
            self,
            Op::Send { .. } | Op::Recv { .. } | Op::Batch { .. } | Op::Window(_)
        )
    }

    /// True for collectives that move no byte on any rank, judged from sizes every rank agrees
    /// on (so every rank skips them alike, as NCCL does for a count of 0). An all_to_all counts
    /// only where the caller declared that every rank passes equal blocks (`uniform`): a rank's
    /// own blocks being empty says nothing about the others' otherwise.
    pub fn moves_nothing_anywhere(&self, uniform: bool) -> bool {
        match self {
            Op::AllToAll { inputs, outputs } => {
                uniform && inputs.iter().chain(outputs).all(|b| b.is_empty())
            }
            Op::AllReduce { buf, .. } | Op::Reduce { buf, .. } | Op::Broadcast { buf, .. } => {
                buf.is_empty()
            }
            Op::AllGather { outputs, .. } => outputs.iter().all(|o| o.is_empty()),
            Op::ReduceScatter { inputs, .. } => inputs.iter().all(|i| i.is_empty()),
            Op::Scatter { output, .. } => output.is_empty(),
            Op::Gather { input, .. } => input.is_empty(),
            _ => false,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
