//! Enqueuing NCCL calls on a communicator's stream: dtype and reduce-op mapping, and the
//! [`Enq`] helper every operation uses under the enqueue lock.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use torchcomms::Tensor;
use torchcomms_core::{DataType, ReduceOp};
use torchcomms_cuda::RawStream;

use crate::comm::Shared;
use crate::error::NcclError;
use crate::sys::{self, ncclComm_t, ncclDataType_t, ncclRedOp_t, Nccl};
use crate::work::KeepAlive;

pub(crate) fn invalid(arg: &str, expected: &str, got: impl ToString) -> NcclError {
    NcclError::InvalidArgument {
        arg: arg.into(),
        expected: expected.into(),
        got: got.to_string(),
    }
}

/// The NCCL type of a dtype (bool travels as uint8).
pub(crate) fn nccl_dtype(d: DataType) -> Result<ncclDataType_t, NcclError> {
    Ok(match d {
        DataType::I8 => sys::NCCL_INT8,
        DataType::U8 | DataType::Bool => sys::NCCL_UINT8,
        DataType::I32 => sys::NCCL_INT32,
        DataType::I64 => sys::NCCL_INT64,
        DataType::F16 => sys::NCCL_FLOAT16,
        DataType::F32 => sys::NCCL_FLOAT32,
        DataType::F64 => sys::NCCL_FLOAT64,
        DataType::BF16 => sys::NCCL_BFLOAT16,
    })
}

/// How a (dtype, op) pair runs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Red {
    /// A built-in NCCL operator.
    Native(ncclRedOp_t),
    /// `ncclRedOpCreatePreMulSum` with this factor.
    PreMul(f64),
    /// NCCL has no such operator (bitwise ops, xor on bool): gather every contribution and
    /// combine them with the project's CUDA kernels (`torchcomms_cuda`).
    Kernel,
}

pub(crate) fn red(dtype: DataType, op: ReduceOp) -> Result<Red, NcclError> {
    op.check_dtype(dtype)
        .map_err(|e| invalid("op", "a reduce op that applies to the dtype", e))?;
    let bool_ = dtype == DataType::Bool;
    Ok(match op {
        // On 0/1 bytes: or is max, and is min.
        ReduceOp::Sum | ReduceOp::Max | ReduceOp::BOr if bool_ => Red::Native(sys::NCCL_MAX),
        ReduceOp::Product | ReduceOp::Min | ReduceOp::BAnd if bool_ => Red::Native(sys::NCCL_MIN),
        ReduceOp::Avg | ReduceOp::PremulSum { .. } if bool_ => {
            return Err(invalid(
                "op",
                "sum, prod, min, max, band, bor or bxor on bool",
                op,
            ))
        }
        ReduceOp::Sum => Red::Native(sys::NCCL_SUM),
        ReduceOp::Product => Red::Native(sys::NCCL_PROD),
        ReduceOp::Min => Red::Native(sys::NCCL_MIN),
        ReduceOp::Max => Red::Native(sys::NCCL_MAX),
        ReduceOp::Avg => Red::Native(sys::NCCL_AVG),
        ReduceOp::PremulSum { factor } => Red::PreMul(factor),
        ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => Red::Kernel,
    })
}

/// The PREMUL_SUM scalar in the element type, as NCCL reads it from the host.
pub(crate) fn premul_scalar(dtype: DataType, factor: f64) -> [u8; 8] {
    let mut b = [0u8; 8];
    match dtype {
        DataType::F16 => b[..2].copy_from_slice(&half::f16::from_f64(factor).to_le_bytes()),
        DataType::BF16 => b[..2].copy_from_slice(&half::bf16::from_f64(factor).to_le_bytes()),
        DataType::F32 => b[..4].copy_from_slice(&(factor as f32).to_le_bytes()),
        DataType::F64 => b.copy_from_slice(&factor.to_le_bytes()),
        DataType::I8 => b[0] = factor as i8 as u8,
        DataType::U8 | DataType::Bool => b[0] = factor as u8,
        DataType::I32 => b[..4].copy_from_slice(&(factor as i32).to_le_bytes()),
        _ => b.copy_from_slice(&(factor as i64).to_le_bytes()),
    }
    b
}

pub(crate) fn ptr(t: &Tensor) -> *mut c_void {
    t.addr() as *mut c_void
}

pub(crate) fn owners<'a>(ts: impl IntoIterator<Item = &'a Tensor>) -> KeepAlive {
    ts.into_iter().filter_map(|t| t.owner().cloned()).collect()
}

/// True when `ts` are equal-sized blocks laid out back to back.
pub(crate) fn adjacent(ts: &[Tensor]) -> bool {
    let Some(first) = ts.first() else {
        return true;
    };
    ts.iter()
        .enumerate()
        .all(|(i, t)| t.numel() == first.numel() && t.addr() == first.addr() + i * first.nbytes())
}

/// Enqueues NCCL calls on the communicator's stream (under the enqueue lock).
pub(crate) struct Enq<'a> {
    pub(crate) s: &'a Shared,
    pub(crate) comm: ncclComm_t,
    pub(crate) stream: *mut c_void,
    pub(crate) keep: KeepAlive,
}

impl Enq<'_> {
    pub(crate) fn nccl(&self) -> &'static Nccl {
        self.s.nccl
    }

    pub(crate) fn group<R>(
        &self,
        body: impl FnOnce(&Self) -> Result<R, NcclError>,
    ) -> Result<R, NcclError> {
        // SAFETY: group calls take no arguments.
        let rc = unsafe { (self.nccl().group_start)() };
        self.s.check("ncclGroupStart", rc)?;
        let r = body(self);
        // SAFETY: as above; always closes the group opened above.
        let rc = unsafe { (self.nccl().group_end)() };
        let end = self.s.check("ncclGroupEnd", rc);
        let r = r?;
        end?;
        Ok(r)
    }

    /// Runs `f` with the NCCL operator for `red`, creating and destroying a PREMUL_SUM one.
    pub(crate) fn with_op(
        &self,
        dtype: DataType,
        red: Red,
        f: impl FnOnce(ncclRedOp_t) -> Result<(), NcclError>,
    ) -> Result<(), NcclError> {
        match red {
            Red::Native(op) => f(op),
            Red::PreMul(factor) => {
                let mut scalar = premul_scalar(dtype, factor);
                let mut op: ncclRedOp_t = 0;
                // SAFETY: the scalar is read during the call (host immediate); the comm is live.
                let rc = unsafe {
                    (self.nccl().red_op_create_pre_mul_sum)(
                        &mut op,
                        scalar.as_mut_ptr().cast(),
                        nccl_dtype(dtype)?,
                        sys::NCCL_SCALAR_HOST_IMMEDIATE,
                        self.comm,
                    )
                };
                self.s.check("ncclRedOpCreatePreMulSum", rc)?;
                let r = f(op);
                // SAFETY: NCCL allows destroying an operator once the calls using it returned.
                let rc = unsafe { (self.nccl().red_op_destroy)(op, self.comm) };
                r.and(self.s.check("ncclRedOpDestroy", rc))
            }
            Red::Kernel => Err(NcclError::NotSupported("kernel reductions here".into())),
        }
    }

    pub(crate) fn all_reduce(&self, buf: &Tensor, op: ncclRedOp_t) -> Result<(), NcclError> {
        // SAFETY: `buf` is device memory of this comm's device holding numel elements, kept
        // alive by the watchdog until the operation completes.
        let rc = unsafe {
            (self.nccl().all_reduce)(
                ptr(buf),
                ptr(buf),
                buf.numel(),
                nccl_dtype(buf.dtype())?,
                op,
                self.comm,
                self.stream,
            )
        };
        self.s.check("ncclAllReduce", rc)
    }

    pub(crate) fn all_gather_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: DataType,
    ) -> Result<(), NcclError> {
        // SAFETY: as for all_reduce; recv holds size * count elements.
        let rc = unsafe {
            (self.nccl().all_gather)(send, recv, count, nccl_dtype(dt)?, self.comm, self.stream)
        };
        self.s.check("ncclAllGather", rc)
    }

    pub(crate) fn broadcast(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: DataType,
        root: usize,
    ) -> Result<(), NcclError> {
        // SAFETY: as for all_reduce.
        let rc = unsafe {
            (self.nccl().broadcast)(
                send,
                recv,
                count,
                nccl_dtype(dt)?,
                root as c_int,
                self.comm,
                self.stream,
            )
        };
        self.s.check("ncclBroadcast", rc)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: DataType,
        op: ncclRedOp_t,
        root: usize,
    ) -> Result<(), NcclError> {
        // SAFETY: as for all_reduce.
        let rc = unsafe {
            (self.nccl().reduce)(
                send,
                recv,
                count,
                nccl_dtype(dt)?,
                op,
                root as c_int,
                self.comm,
                self.stream,
            )
        };
        self.s.check("ncclReduce", rc)
    }

    pub(crate) fn send_raw(
        &self,
        p: u64,
        count: usize,
        dt: DataType,
        peer: usize,
    ) -> Result<(), NcclError> {
        if count == 0 {
            return Ok(());
        }
        // SAFETY: as for all_reduce.
        let rc = unsafe {
            (self.nccl().send)(
                p as *const c_void,
                count,
                nccl_dtype(dt)?,
                peer as c_int,
                self.comm,
                self.stream,
            )
        };
        self.s.check("ncclSend", rc)
    }

    pub(crate) fn recv_raw(
        &self,
        p: u64,
        count: usize,
        dt: DataType,
        peer: usize,
    ) -> Result<(), NcclError> {
        if count == 0 {
            return Ok(());
        }
        // SAFETY: as for all_reduce.
        let rc = unsafe {
            (self.nccl().recv)(
                p as *mut c_void,
                count,
                nccl_dtype(dt)?,
                peer as c_int,
                self.comm,
                self.stream,
            )
        };
        self.s.check("ncclRecv", rc)
    }

    pub(crate) fn send(&self, t: &Tensor, peer: usize) -> Result<(), NcclError> {
        self.send_raw(t.addr() as u64, t.numel(), t.dtype(), peer)
    }

    pub(crate) fn recv(&self, t: &Tensor, peer: usize) -> Result<(), NcclError> {
        self.recv_raw(t.addr() as u64, t.numel(), t.dtype(), peer)
    }

    /// A scratch buffer kept alive until the operation completes.
    pub(crate) fn scratch(&mut self, bytes: usize) -> Result<u64, NcclError> {
        let b = self
            .s
            .gpu
            .alloc(bytes)
            .map_err(|e| self.s.gpu_err("allocating scratch memory", e))?;
        let p = b.as_ptr();
        self.keep.push(Arc::new(b));
        Ok(p)
    }

    /// `dst = c[0] ⊕ c[1] ⊕ ...` over `n` elements with the project's kernels, on our stream.
    pub(crate) fn combine_blocks(
        &self,
        dtype: DataType,
        op: ReduceOp,
        dst: u64,
        blocks: &[u64],
        n: usize,
    ) -> Result<(), NcclError> {
        let st = RawStream(self.stream as u64);
        let gpu = &self.s.gpu;
        let err = |e| self.s.gpu_err("combine", e);
        match blocks {
            [] => Ok(()),
            [only] => {
                // SAFETY: scratch and tensors are alive until the op completes (keep/owners).
                unsafe { gpu.copy_async(dst, *only, n * dtype.size_bytes(), st) }.map_err(err)
            }
            [a, b, rest @ ..] => {
                // SAFETY: as above; every block holds n elements.
                unsafe { gpu.combine(dtype, op, dst, *a, *b, n, st) }.map_err(err)?;
                for c in rest {
                    // SAFETY: as above.
                    unsafe { gpu.combine(dtype, op, dst, dst, *c, n, st) }.map_err(err)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions_map_onto_nccl_or_kernels() {
        let native = |d, o| match red(d, o) {
            Ok(Red::Native(x)) => Some(x),
            _ => None,
        };
        assert_eq!(native(DataType::F32, ReduceOp::Sum), Some(sys::NCCL_SUM));
        assert_eq!(native(DataType::I8, ReduceOp::Avg), Some(sys::NCCL_AVG));
        // bool: or is max, and is min; xor needs the kernels.
        assert_eq!(native(DataType::Bool, ReduceOp::Sum), Some(sys::NCCL_MAX));
        assert_eq!(native(DataType::Bool, ReduceOp::BAnd), Some(sys::NCCL_MIN));
        assert!(matches!(
            red(DataType::Bool, ReduceOp::BXor),
            Ok(Red::Kernel)
        ));
        assert!(matches!(red(DataType::I32, ReduceOp::BOr), Ok(Red::Kernel)));
        assert!(matches!(
            red(DataType::BF16, ReduceOp::PremulSum { factor: 0.5 }),
            Ok(Red::PreMul(f)) if f == 0.5
        ));
        assert!(red(DataType::F16, ReduceOp::BXor).is_err());
        assert!(red(DataType::Bool, ReduceOp::Avg).is_err());
    }

    #[test]
    fn premul_scalars_are_in_the_element_type() {
        assert_eq!(
            &premul_scalar(DataType::F16, 2.0)[..2],
            &half::f16::from_f64(2.0).to_le_bytes()
        );
        assert_eq!(
            &premul_scalar(DataType::F32, 0.5)[..4],
            &0.5f32.to_le_bytes()
        );
        assert_eq!(premul_scalar(DataType::I64, 3.0), 3i64.to_le_bytes());
        assert_eq!(premul_scalar(DataType::I8, -2.0)[0], (-2i8) as u8);
    }

    #[test]
    fn adjacent_blocks() {
        let t = Tensor::zeros(DataType::F32, 12);
        let blocks: Vec<Tensor> = (0..3).map(|i| t.narrow(4 * i, 4)).collect();
        assert!(adjacent(&blocks));
        let gap = vec![t.narrow(0, 4), t.narrow(8, 4)];
        assert!(!adjacent(&gap));
        let uneven = vec![t.narrow(0, 4), t.narrow(4, 2)];
        assert!(!adjacent(&uneven));
    }
}
