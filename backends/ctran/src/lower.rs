//! Calls of the TorchComm API as operations of the engine: tensors become spans, and their
//! owners what the engine holds until the operation finished.

use ctran::algos::all_to_all::dynamic::DynamicAllToAll;
use ctran::comm::KeepAlive;
use ctran::{Op, P2p, Span};
use torchcomms::{Call, Error, P2POp, Result, Tensor};

/// The owners of `tensors`' memory.
pub(crate) fn owners<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> KeepAlive {
    tensors
        .into_iter()
        .filter_map(|t| t.owner().cloned())
        .collect()
}

fn spans(tensors: &[Tensor]) -> Vec<Span> {
    tensors.iter().map(Tensor::span).collect()
}

/// The engine operation of `call`, and the owners of its buffers.
pub(crate) fn lower(call: Call, comm: &str) -> Result<(Op, KeepAlive)> {
    let keep = owners(call.tensors());
    let op = match call {
        Call::AllReduce { tensor, op } => Op::AllReduce {
            buf: tensor.span(),
            dtype: tensor.dtype(),
            op,
        },
        Call::Reduce { tensor, root, op } => Op::Reduce {
            buf: tensor.span(),
            dtype: tensor.dtype(),
            op,
            root,
        },
        Call::Broadcast { tensor, root } => Op::Broadcast {
            buf: tensor.span(),
            root,
        },
        Call::AllGather { outputs, input } => Op::AllGather {
            input: input.span(),
            outputs: spans(&outputs),
        },
        Call::ReduceScatter { output, inputs, op } => Op::ReduceScatter {
            inputs: spans(&inputs),
            output: output.span(),
            dtype: output.dtype(),
            op,
        },
        Call::AllToAll {
            outputs, inputs, ..
        } => Op::AllToAll {
            inputs: spans(&inputs),
            outputs: spans(&outputs),
        },
        Call::AllToAllDynamic {
            output,
            input,
            output_split_sizes,
            input_split_sizes,
        } => Op::AllToAllDynamic(DynamicAllToAll {
            input_row_bytes: input.row_numel() * input.dtype().size_bytes(),
            output_row_bytes: output.row_numel() * output.dtype().size_bytes(),
            input: input.span(),
            output: output.span(),
            input_counts: input_split_sizes.span(),
            output_counts: output_split_sizes.span(),
        }),
        Call::Scatter {
            output,
            inputs,
            root,
        } => Op::Scatter {
            inputs: spans(&inputs),
            output: output.span(),
            root,
        },
        Call::Gather {
            outputs,
            input,
            root,
        } => Op::Gather {
            input: input.span(),
            outputs: spans(&outputs),
            root,
        },
        // The API runs persistent all-gathers itself; as a plain all-gather if one arrives.
        Call::AllGatherP { handle, input } => Op::AllGather {
            outputs: spans(&handle.output().blocks(handle.size(), input.numel())),
            input: input.span(),
        },
        Call::Barrier => Op::Barrier,
        Call::Send { tensor, peer } => Op::Send {
            buf: tensor.span(),
            peer,
        },
        Call::Recv { tensor, peer } => Op::Recv {
            buf: tensor.span(),
            peer,
        },
        Call::Batch { ops } => Op::Batch {
            ops: ops
                .iter()
                .map(|o| match o {
                    P2POp::Send { tensor, peer } => P2p::Send {
                        buf: tensor.span(),
                        peer: *peer,
                    },
                    P2POp::Recv { tensor, peer } => P2p::Recv {
                        buf: tensor.span(),
                        peer: *peer,
                    },
                })
                .collect(),
        },
        other => {
            return Err(Error::NotImplemented {
                what: other.name().into(),
                comm: comm.into(),
            })
        }
    };
    Ok((op, keep))
}
