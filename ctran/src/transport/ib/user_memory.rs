//! The caller's memory registered in place (zero copy): host memory as it is, GPU memory
//! through the dma-buf its driver exports (GPUDirect RDMA), where the driver allows it. When
//! it does not, registration fails with the reason and the caller stages through host memory.
//!
//! On the software provider the dma-buf is the real driver's export (so "where the driver
//! allows" is the driver's answer), but the software NIC cannot map it: it moves the bytes
//! with a CUDA copy at the registered address ([`CudaCopy`]).

use std::fmt;
use std::sync::Arc;

use ibverbx::soft::DmaEngine;
use ibverbx::{LocalKey, RemoteKey as IbKey};

use crate::cuda::{dmabuf, Context};

/// A registration a work request can name: its local key, and the key a peer uses.
pub trait NicRegion: Send + Sync + fmt::Debug {
    /// For local work requests.
    fn local_key(&self) -> LocalKey;
    /// For the peer.
    fn remote_key(&self) -> IbKey;
}

impl NicRegion for ibverbx::soft::SoftMr {
    fn local_key(&self) -> LocalKey {
        ibverbx::soft::SoftMr::local_key(self)
    }
    fn remote_key(&self) -> IbKey {
        ibverbx::soft::SoftMr::remote_key(self)
    }
}

impl NicRegion for ibverbx::verbs::MemoryRegion {
    fn local_key(&self) -> LocalKey {
        ibverbx::verbs::MemoryRegion::local_key(self)
    }
    fn remote_key(&self) -> IbKey {
        ibverbx::verbs::MemoryRegion::remote_key(self)
    }
}

/// Where the caller's memory lives.
#[derive(Debug, Clone)]
pub enum UserDevice {
    /// Host memory.
    Host,
    /// Memory of this CUDA context's device.
    Cuda(Arc<Context>),
}

/// Whether the driver of `ctx`'s device exports dma-bufs (GPUDirect RDMA through
/// `ibv_reg_dmabuf_mr`), or why not.
pub fn gpu_dmabuf_supported(ctx: &Arc<Context>) -> Result<(), String> {
    let gpu = format!("cuda:{}", ctx.ordinal());
    match dmabuf::supported(ctx) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!(
            "the driver of {gpu} cannot export dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0)"
        )),
        Err(e) => Err(format!("asking whether {gpu} exports dma-bufs: {e}")),
    }
}

/// The dma-buf exporting device range `addr..addr + len`, or why GPUDirect RDMA is not
/// available for it.
pub(crate) fn gpu_dmabuf(
    ctx: &Arc<Context>,
    addr: u64,
    len: u64,
) -> Result<dmabuf::DmaBuf, String> {
    gpu_dmabuf_supported(ctx)?;
    let gpu = format!("cuda:{}", ctx.ordinal());
    dmabuf::export(ctx, addr, len)
        .map_err(|e| format!("exporting {len} bytes of {gpu} at {addr:#x} as a dma-buf: {e}"))
}

/// How the software NIC reaches GPU memory: a synchronous CUDA copy (unified addressing
/// takes host or device addresses on either side).
pub(crate) struct CudaCopy(pub(crate) Arc<Context>);

impl DmaEngine for CudaCopy {
    unsafe fn copy(&self, dst: u64, src: u64, len: usize) -> Result<(), String> {
        // SAFETY: forwarded: the fabric checked both ranges against live registrations.
        unsafe { dmabuf::copy_sync(&self.0, dst, src, len) }.map_err(|e| e.to_string())
    }
}
