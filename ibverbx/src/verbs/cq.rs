//! Completion queues (`ibv_cq`), polled through the context's `ops.poll_cq` as verbs.h's
//! inline `ibv_poll_cq` does.

use std::sync::Arc;

use crate::error::{errno, rc_error, Error, Result};
use crate::provider::{Completion, CqOps, WcOpcode, WcStatus};
use crate::sys;
use crate::verbs::Context;

pub(crate) struct CqInner {
    pub(crate) raw: *mut sys::ibv_cq,
    pub(crate) ctx: Context,
    poll: sys::PollCqFn,
}

// SAFETY: verbs objects may be used from any thread; rdma-core's providers lock the CQ.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_cq`, destroyed once after every QP using it (they
        // hold an `Arc` of this value).
        let rc = unsafe { (self.ctx.inner.syms.destroy_cq)(self.raw) };
        if rc != 0 {
            tracing::warn!(device = %self.ctx.inner.name, "ibv_destroy_cq failed: {}", rc_error(rc));
        }
    }
}

/// A completion queue; clones share it (queue pairs keep one).
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("device", &self.inner.ctx.inner.name)
            .finish()
    }
}

impl CompletionQueue {
    /// Creates a queue of at least `cqe` entries on `ctx`.
    pub fn new(ctx: &Context, cqe: u32) -> Result<CompletionQueue> {
        let n = libc::c_int::try_from(cqe).unwrap_or(libc::c_int::MAX);
        // SAFETY: live context; no channel, no context pointer, vector 0.
        let raw = unsafe {
            (ctx.inner.syms.create_cq)(
                ctx.inner.raw,
                n,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if raw.is_null() {
            return Err(Error::CreateCq {
                device: ctx.inner.name.clone(),
                cqe,
                source: errno(),
            });
        }
        // SAFETY: a live CQ's context pointer is the context it was created on.
        let poll = unsafe { (*(*raw).context).ops.poll_cq };
        let Some(poll) = poll else {
            // SAFETY: just created, destroyed once.
            unsafe { (ctx.inner.syms.destroy_cq)(raw) };
            return Err(Error::Unsupported {
                symbol: "ibv_context.ops.poll_cq",
            });
        };
        Ok(CompletionQueue {
            inner: Arc::new(CqInner {
                raw,
                ctx: ctx.clone(),
                poll,
            }),
        })
    }

    /// The raw CQ (escape hatch; valid while `self` lives).
    pub fn as_raw(&self) -> *mut sys::ibv_cq {
        self.inner.raw
    }

    /// Polls up to `wc.len()` raw completions; returns how many were written.
    pub fn poll_raw(&self, wc: &mut [sys::ibv_wc]) -> Result<usize> {
        let n = libc::c_int::try_from(wc.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: live CQ; `wc` has room for `n` entries of the declared layout.
        let rc = unsafe { (self.inner.poll)(self.inner.raw, n, wc.as_mut_ptr()) };
        if rc < 0 {
            return Err(Error::PollCq { source: errno() });
        }
        Ok(rc as usize)
    }
}

impl From<&sys::ibv_wc> for Completion {
    fn from(wc: &sys::ibv_wc) -> Completion {
        Completion {
            wr_id: wc.wr_id,
            qp_num: wc.qp_num,
            status: WcStatus::from_raw(wc.status, wc.vendor_err),
            opcode: match wc.opcode {
                sys::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
                sys::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
                sys::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
                sys::IBV_WC_RECV => WcOpcode::Recv,
                other => WcOpcode::Other(other),
            },
            byte_len: wc.byte_len,
            imm: (wc.wc_flags & sys::IBV_WC_WITH_IMM != 0).then(|| u32::from_be(wc.imm_data)),
        }
    }
}

impl CqOps for CompletionQueue {
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        let mut wc = [sys::ibv_wc::default(); 32];
        let mut total = 0;
        while total < max {
            let want = (max - total).min(wc.len());
            let n = self.poll_raw(&mut wc[..want])?;
            out.extend(wc[..n].iter().map(Completion::from));
            total += n;
            if n < want {
                break;
            }
        }
        Ok(total)
    }
}
