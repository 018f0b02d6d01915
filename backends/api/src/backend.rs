//! The seam between the API and an engine: one method per operation. [`TorchComm`](crate::TorchComm)
//! validates every argument before calling a backend, so backends may assume consistent sizes,
//! ranks in range and matching dtypes.

use std::fmt::Debug;

use ctran::{Device, ReduceOp};

use crate::error::{Error, Result};
use crate::options::{CommOptions, OpOptions};
use crate::tensor::Tensor;
use crate::work::Work;

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

/// What a backend gets to create a communicator.
#[derive(Debug, Clone)]
pub struct InitArgs {
    /// Device the communicator serves.
    pub device: Device,
    /// Communicator name.
    pub name: String,
    /// Options (store, timeout, hints, explicit rank/size).
    pub options: CommOptions,
}

/// An engine behind the TorchComm API.
pub trait Backend: Send + Sync + Debug {
    /// Backend name (`ctran`, `nccl`).
    fn backend_name(&self) -> &str;
    /// Version string of the engine or library behind the backend.
    fn version(&self) -> Result<String>;
    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Communicator name.
    fn comm_name(&self) -> &str;
    /// Device served.
    fn device(&self) -> Device;

    /// In-place all-reduce.
    fn all_reduce(&self, tensor: &Tensor, op: ReduceOp, opts: &OpOptions) -> Result<Work>;
    /// Reduce onto `root`.
    fn reduce(&self, tensor: &Tensor, root: usize, op: ReduceOp, opts: &OpOptions) -> Result<Work>;
    /// Broadcast from `root`.
    fn broadcast(&self, tensor: &Tensor, root: usize, opts: &OpOptions) -> Result<Work>;
    /// All-gather into one tensor per rank (sizes may differ: all_gather_v).
    fn all_gather(&self, outputs: &[Tensor], input: &Tensor, opts: &OpOptions) -> Result<Work>;
    /// All-gather into one tensor of `size` equal blocks.
    fn all_gather_single(&self, output: &Tensor, input: &Tensor, opts: &OpOptions) -> Result<Work> {
        let n = input.numel();
        let outs: Vec<Tensor> = (0..self.size()).map(|r| output.narrow(r * n, n)).collect();
        self.all_gather(&outs, input, opts)
    }
    /// Reduce-scatter from one tensor per rank (sizes may differ: reduce_scatter_v).
    fn reduce_scatter(
        &self,
        output: &Tensor,
        inputs: &[Tensor],
        op: ReduceOp,
        opts: &OpOptions,
    ) -> Result<Work>;
    /// Reduce-scatter from one tensor of `size` equal blocks.
    fn reduce_scatter_single(
        &self,
        output: &Tensor,
        input: &Tensor,
        op: ReduceOp,
        opts: &OpOptions,
    ) -> Result<Work> {
        let n = output.numel();
        let ins: Vec<Tensor> = (0..self.size()).map(|r| input.narrow(r * n, n)).collect();
        self.reduce_scatter(output, &ins, op, opts)
    }
    /// All-to-all between lists of tensors (block sizes may differ).
    fn all_to_all(&self, outputs: &[Tensor], inputs: &[Tensor], opts: &OpOptions) -> Result<Work>;
    /// All-to-all with explicit split sizes in elements.
    fn all_to_all_v_single(
        &self,
        output: &Tensor,
        input: &Tensor,
        output_splits: &[usize],
        input_splits: &[usize],
        opts: &OpOptions,
    ) -> Result<Work> {
        let cut = |t: &Tensor, splits: &[usize]| {
            let mut off = 0;
            splits
                .iter()
                .map(|&n| {
                    let v = t.narrow(off, n);
                    off += n;
                    v
                })
                .collect::<Vec<_>>()
        };
        self.all_to_all(&cut(output, output_splits), &cut(input, input_splits), opts)
    }
    /// Scatter from `root` (inputs empty on other ranks).
    fn scatter(
        &self,
        output: &Tensor,
        inputs: &[Tensor],
        root: usize,
        opts: &OpOptions,
    ) -> Result<Work>;
    /// Gather onto `root` (outputs empty on other ranks).
    fn gather(
        &self,
        outputs: &[Tensor],
        input: &Tensor,
        root: usize,
        opts: &OpOptions,
    ) -> Result<Work>;
    /// Barrier.
    fn barrier(&self, opts: &OpOptions) -> Result<Work>;
    /// Send to `peer`.
    fn send(&self, tensor: &Tensor, peer: usize, opts: &OpOptions) -> Result<Work>;
    /// Receive from `peer`.
    fn recv(&self, tensor: &Tensor, peer: usize, opts: &OpOptions) -> Result<Work>;
    /// Sends and receives that run concurrently.
    fn batch_p2p(&self, ops: &[P2POp], opts: &OpOptions) -> Result<Work>;
    /// A sub-communicator of `ranks`; `None` on ranks that pass an empty list.
    fn split(
        &self,
        ranks: &[usize],
        name: &str,
        options: CommOptions,
    ) -> Result<Option<Box<dyn Backend>>>;
    /// Waits for outstanding work and releases resources.
    fn finalize(&self) -> Result<()>;
    /// Whether [`Backend::abort`] is implemented.
    fn supports_abort(&self) -> bool {
        false
    }
    /// Fails outstanding and future work and drops connections.
    fn abort(&self) -> Result<()> {
        Err(Error::NotImplemented {
            what: "abort".into(),
            comm: self.comm_name().into(),
        })
    }
    /// True once aborted.
    fn is_aborted(&self) -> bool {
        false
    }
}
