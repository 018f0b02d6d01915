//! Batched point-to-point operations (torchcomms' `BatchSendRecv`).

use crate::call::P2POp;
use crate::comm::TorchComm;
use crate::error::Result;
use crate::options::OpOptions;
use crate::tensor::Tensor;
use crate::work::Work;

/// Collects sends and receives and issues them together; they run concurrently.
#[derive(Debug)]
pub struct BatchSendRecv<'a> {
    comm: &'a TorchComm,
    /// The queued operations, in order.
    pub ops: Vec<P2POp>,
}

impl<'a> BatchSendRecv<'a> {
    pub(crate) fn new(comm: &'a TorchComm) -> Self {
        BatchSendRecv {
            comm,
            ops: Vec::new(),
        }
    }

    /// Queues a send.
    pub fn send(&mut self, tensor: Tensor, dst: usize) -> &mut Self {
        self.ops.push(P2POp::Send { tensor, peer: dst });
        self
    }

    /// Queues a receive.
    pub fn recv(&mut self, tensor: Tensor, src: usize) -> &mut Self {
        self.ops.push(P2POp::Recv { tensor, peer: src });
        self
    }

    /// Issues every queued operation.
    pub fn issue(&self, opts: &OpOptions) -> Result<Work> {
        self.comm.batch_p2p(&self.ops, opts)
    }
}
