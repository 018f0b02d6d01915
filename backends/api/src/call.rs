//! What a backend is asked to run: the canonical form of every operation. The API lowers each
//! operation of the table onto one of these (an `all_gather_single` becomes an [`Call::AllGather`]
//! over views of its output, say), after checking its arguments, so a backend implements each
//! collective once, in its most general form.

use torchcomms_core::ReduceOp;

use crate::tensor::Tensor;

/// One transfer of a batch.
#[derive(Debug, Clone)]
pub enum P2POp {
    /// Send `tensor` to `peer`.
    Send {
        /// Data.
        tensor: Tensor,
        /// Destination rank.
        peer: usize,
    },
    /// Receive into `tensor` from `peer`.
    Recv {
        /// Destination buffer.
        tensor: Tensor,
        /// Source rank.
        peer: usize,
    },
}

impl P2POp {
    /// The tensor involved.
    pub fn tensor(&self) -> &Tensor {
        match self {
            P2POp::Send { tensor, .. } | P2POp::Recv { tensor, .. } => tensor,
        }
    }

    /// The peer rank.
    pub fn peer(&self) -> usize {
        match self {
            P2POp::Send { peer, .. } | P2POp::Recv { peer, .. } => *peer,
        }
    }
}

/// An operation with checked arguments, in the form backends implement. Tensors hold their
/// owners, so a backend keeps the memory alive by keeping the call's tensors until it is done.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Call {
    /// In-place all-reduce of `tensor`.
    AllReduce {
        /// Input and output.
        tensor: Tensor,
        /// Reduction.
        op: ReduceOp,
    },
    /// Reduce of `tensor` onto `root`.
    Reduce {
        /// Input everywhere, output on `root`.
        tensor: Tensor,
        /// Destination rank.
        root: usize,
        /// Reduction.
        op: ReduceOp,
    },
    /// Broadcast of `root`'s `tensor`.
    Broadcast {
        /// Source on `root`, destination elsewhere.
        tensor: Tensor,
        /// Source rank.
        root: usize,
    },
    /// Every rank's `input` lands in `outputs[rank]` (sizes may differ per rank).
    AllGather {
        /// One tensor per rank.
        outputs: Vec<Tensor>,
        /// This rank's contribution.
        input: Tensor,
    },
    /// `inputs[r]` of every rank is reduced into rank `r`'s `output` (sizes may differ per rank).
    ReduceScatter {
        /// This rank's result.
        output: Tensor,
        /// One tensor per rank.
        inputs: Vec<Tensor>,
        /// Reduction.
        op: ReduceOp,
    },
    /// `inputs[j]` goes to rank `j`, arriving in its `outputs[rank]`.
    AllToAll {
        /// One tensor per source rank.
        outputs: Vec<Tensor>,
        /// One tensor per destination rank.
        inputs: Vec<Tensor>,
        /// Every rank passes blocks of one and the same size (`all_to_all_single`): engines may
        /// then take paths that need it, which ranks cannot check on their own.
        uniform: bool,
    },
    /// all_to_all_v whose row counts are tensors read when the operation runs: `input`'s blocks
    /// (by `input_split_sizes`) go to each rank, and what each rank sent lands packed in
    /// `output`, its row count in `output_split_sizes`.
    AllToAllDynamic {
        /// Received rows, packed by source rank; its rows are the capacity.
        output: Tensor,
        /// Rows to send, packed by destination rank.
        input: Tensor,
        /// int64 per source rank, written.
        output_split_sizes: Tensor,
        /// int64 per destination rank, read.
        input_split_sizes: Tensor,
    },
    /// `root`'s `inputs[r]` goes to rank `r`'s `output`.
    Scatter {
        /// This rank's piece.
        output: Tensor,
        /// One tensor per rank on `root`, empty elsewhere.
        inputs: Vec<Tensor>,
        /// Source rank.
        root: usize,
    },
    /// Rank `r`'s `input` goes to `root`'s `outputs[r]`.
    Gather {
        /// One tensor per rank on `root`, empty elsewhere.
        outputs: Vec<Tensor>,
        /// This rank's piece.
        input: Tensor,
        /// Destination rank.
        root: usize,
    },
    /// A persistent all-gather's execution: every rank's `input` lands in its block of the
    /// handle's output. [`crate::TorchComm`] runs it (on the handle's window, or as an
    /// [`Call::AllGather`]); backends do not see it.
    AllGatherP {
        /// What `all_gather_p_init` bound.
        handle: crate::persistent::AllGatherP,
        /// This rank's contribution.
        input: Tensor,
    },
    /// Returns once every rank has entered.
    Barrier,
    /// Point-to-point send.
    Send {
        /// Data.
        tensor: Tensor,
        /// Destination rank.
        peer: usize,
    },
    /// Point-to-point receive.
    Recv {
        /// Destination buffer.
        tensor: Tensor,
        /// Source rank.
        peer: usize,
    },
    /// Sends and receives that run concurrently.
    Batch {
        /// The transfers.
        ops: Vec<P2POp>,
    },
}

impl Call {
    /// The name of the canonical operation (`all_gather` also for `all_gather_single`).
    pub fn name(&self) -> &'static str {
        match self {
            Call::AllReduce { .. } => "all_reduce",
            Call::Reduce { .. } => "reduce",
            Call::Broadcast { .. } => "broadcast",
            Call::AllGather { .. } => "all_gather",
            Call::ReduceScatter { .. } => "reduce_scatter",
            Call::AllToAll { .. } => "all_to_all",
            Call::AllToAllDynamic { .. } => "device_alltoallv_single",
            Call::Scatter { .. } => "scatter",
            Call::Gather { .. } => "gather",
            Call::AllGatherP { .. } => "all_gather_p_exec",
            Call::Barrier => "barrier",
            Call::Send { .. } => "send",
            Call::Recv { .. } => "recv",
            Call::Batch { .. } => "batch_op_issue",
        }
    }

    /// Every tensor of the call.
    pub fn tensors(&self) -> Vec<&Tensor> {
        match self {
            Call::AllReduce { tensor, .. }
            | Call::Reduce { tensor, .. }
            | Call::Broadcast { tensor, .. }
            | Call::Send { tensor, .. }
            | Call::Recv { tensor, .. } => vec![tensor],
            Call::AllGather { outputs, input } | Call::Gather { outputs, input, .. } => {
                outputs.iter().chain([input]).collect()
            }
            Call::ReduceScatter { output, inputs, .. } | Call::Scatter { output, inputs, .. } => {
                inputs.iter().chain([output]).collect()
            }
            Call::AllToAll {
                outputs, inputs, ..
            } => inputs.iter().chain(outputs).collect(),
            Call::AllToAllDynamic {
                output,
                input,
                output_split_sizes,
                input_split_sizes,
            } => vec![input, input_split_sizes, output, output_split_sizes],
            Call::AllGatherP { handle, input } => vec![handle.output(), input],
            Call::Barrier => Vec::new(),
            Call::Batch { ops } => ops.iter().map(P2POp::tensor).collect(),
        }
    }
}
