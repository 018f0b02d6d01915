//! The operations of the `nccl` backend, each in its most general form (a [`Call`](torchcomms::Call)):
//! NCCL's own collective where the layout allows it, else grouped point-to-point or broadcasts,
//! and the project's kernels for the reductions NCCL lacks.

use std::ffi::c_void;
use std::sync::Arc;

use torchcomms::{OpOptions, P2POp, Result, Tensor, Work};
use torchcomms_core::ReduceOp;

use crate::backend::NcclBackend;
use crate::enqueue::{adjacent, nccl_dtype, owners, ptr, red, Red};
use crate::sys;
use crate::work::KeepAlive;

impl NcclBackend {
    pub(crate) fn all_reduce(&self, t: &Tensor, op: ReduceOp, opts: &OpOptions) -> Result<Work> {
        let r = red(t.dtype(), op)?;
        self.launch("all_reduce", opts, owners([t]), false, |e| match r {
            Red::Kernel => self.bitwise_all_reduce(e, t, op, None),
            _ => e.with_op(t.dtype(), r, |o| e.all_reduce(t, o)),
        })
    }

    pub(crate) fn reduce(
        &self,
        t: &Tensor,
        root: usize,
        op: ReduceOp,
        opts: &OpOptions,
    ) -> Result<Work> {
        let r = red(t.dtype(), op)?;
        self.launch("reduce", opts, owners([t]), false, |e| match r {
            Red::Kernel => self.bitwise_all_reduce(e, t, op, Some(root)),
            _ => e.with_op(t.dtype(), r, |o| {
                e.reduce(ptr(t), ptr(t), t.numel(), t.dtype(), o, root)
            }),
        })
    }

    pub(crate) fn broadcast(&self, t: &Tensor, root: usize, opts: &OpOptions) -> Result<Work> {
        self.launch("broadcast", opts, owners([t]), false, |e| {
            e.broadcast(ptr(t), ptr(t), t.numel(), t.dtype(), root)
        })
    }

    pub(crate) fn all_gather(
        &self,
        outputs: &[Tensor],
        input: &Tensor,
        opts: &OpOptions,
    ) -> Result<Work> {
        let keep = owners(outputs.iter().chain([input]));
        let uniform = adjacent(outputs) && outputs.iter().all(|o| o.numel() == input.numel());
        self.launch("all_gather", opts, keep, false, |e| {
            if uniform && !outputs.is_empty() {
                return e.all_gather_raw(
                    ptr(input),
                    ptr(&outputs[0]),
                    input.numel(),
                    input.dtype(),
                );
            }
            // all_gather_v: one broadcast per rank, grouped.
            let me = self.shared.rank;
            e.group(|e| {
                for (r, out) in outputs.iter().enumerate() {
                    let send = if r == me { ptr(input) } else { ptr(out) };
                    e.broadcast(send, ptr(out), out.numel(), out.dtype(), r)?;
                }
                Ok(())
            })
        })
    }

    pub(crate) fn reduce_scatter(
        &self,
        output: &Tensor,
        inputs: &[Tensor],
        op: ReduceOp,
        opts: &OpOptions,
    ) -> Result<Work> {
        let r = red(output.dtype(), op)?;
        let keep = owners(inputs.iter().chain([output]));
        let uniform = adjacent(inputs) && inputs.iter().all(|i| i.numel() == output.numel());
        let me = self.shared.rank;
        let dt = output.dtype();
        self.launch("reduce_scatter", opts, keep, false, |e| match r {
            Red::Kernel => {
                // Every rank's block for us lands in scratch, then the kernels combine them.
                let n = output.numel();
                let bytes = output.nbytes();
                let tmp = e.scratch(bytes * self.shared.size)?;
                e.group(|e| {
                    for (p, inp) in inputs.iter().enumerate() {
                        e.send(inp, p)?;
                        e.recv_raw(tmp + (p * bytes) as u64, n, dt, p)?;
                    }
                    Ok(())
                })?;
                let blocks: Vec<u64> = (0..self.shared.size)
                    .map(|p| tmp + (p * bytes) as u64)
                    .collect();
                e.combine_blocks(dt, op, output.addr() as u64, &blocks, n)
            }
            _ if uniform && !inputs.is_empty() => e.with_op(dt, r, |o| {
                // SAFETY: inputs are size blocks of output.numel() elements, back to back.
                let rc = unsafe {
                    (e.nccl().reduce_scatter)(
                        ptr(&inputs[0]),
                        ptr(output),
                        output.numel(),
                        nccl_dtype(dt)?,
                        o,
                        e.comm,
                        e.stream,
                    )
                };
                e.s.check("ncclReduceScatter", rc)
            }),
            // reduce_scatter_v: one reduce per rank, grouped.
            _ => e.with_op(dt, r, |o| {
                e.group(|e| {
                    for (p, inp) in inputs.iter().enumerate() {
                        let recv = if p == me { ptr(output) } else { ptr(inp) };
                        e.reduce(ptr(inp), recv, inp.numel(), dt, o, p)?;
                    }
                    Ok(())
                })
            }),
        })
    }

    pub(crate) fn all_to_all(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        opts: &OpOptions,
    ) -> Result<Work> {
        let keep = owners(inputs.iter().chain(outputs));
        self.launch("all_to_all", opts, keep, false, |e| {
            e.group(|e| {
                for (p, (out, inp)) in outputs.iter().zip(inputs).enumerate() {
                    e.send(inp, p)?;
                    e.recv(out, p)?;
                }
                Ok(())
            })
        })
    }

    pub(crate) fn scatter(
        &self,
        output: &Tensor,
        inputs: &[Tensor],
        root: usize,
        opts: &OpOptions,
    ) -> Result<Work> {
        let keep = owners(inputs.iter().chain([output]));
        let me = self.shared.rank;
        self.launch("scatter", opts, keep, false, |e| {
            e.group(|e| {
                if me == root {
                    for (p, inp) in inputs.iter().enumerate() {
                        e.send(inp, p)?;
                    }
                }
                e.recv(output, root)
            })
        })
    }

    pub(crate) fn gather(
        &self,
        outputs: &[Tensor],
        input: &Tensor,
        root: usize,
        opts: &OpOptions,
    ) -> Result<Work> {
        let keep = owners(outputs.iter().chain([input]));
        let me = self.shared.rank;
        self.launch("gather", opts, keep, false, |e| {
            e.group(|e| {
                e.send(input, root)?;
                if me == root {
                    for (p, out) in outputs.iter().enumerate() {
                        e.recv(out, p)?;
                    }
                }
                Ok(())
            })
        })
    }

    pub(crate) fn barrier(&self, opts: &OpOptions) -> Result<Work> {
        let b = Arc::clone(&self.barrier_buf);
        let keep: KeepAlive = vec![b.clone()];
        self.launch("barrier", opts, keep, true, |e| {
            // SAFETY: the barrier buffer holds one i32 and lives as long as the backend.
            let rc = unsafe {
                (e.nccl().all_reduce)(
                    b.as_ptr() as *const c_void,
                    b.as_ptr() as *mut c_void,
                    1,
                    sys::NCCL_INT32,
                    sys::NCCL_SUM,
                    e.comm,
                    e.stream,
                )
            };
            e.s.check("ncclAllReduce", rc)
        })
    }

    pub(crate) fn send(&self, t: &Tensor, peer: usize, opts: &OpOptions) -> Result<Work> {
        self.launch("send", opts, owners([t]), false, |e| e.send(t, peer))
    }

    pub(crate) fn recv(&self, t: &Tensor, peer: usize, opts: &OpOptions) -> Result<Work> {
        self.launch("recv", opts, owners([t]), false, |e| e.recv(t, peer))
    }

    pub(crate) fn batch_p2p(&self, ops: &[P2POp], opts: &OpOptions) -> Result<Work> {
        let keep = owners(ops.iter().map(P2POp::tensor));
        self.launch("batch_p2p", opts, keep, false, |e| {
            e.group(|e| {
                for o in ops {
                    match o {
                        P2POp::Send { tensor, peer } => e.send(tensor, *peer)?,
                        P2POp::Recv { tensor, peer } => e.recv(tensor, *peer)?,
                    }
                }
                Ok(())
            })
        })
    }
}
