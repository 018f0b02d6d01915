//! Device memory exported as a dma-buf: what GPUDirect RDMA registers with a NIC
//! (`ibv_reg_dmabuf_mr`), so the NIC reads and writes GPU memory without a host copy.
//!
//! The driver exports whole host pages (`cuMemGetHandleForAddressRange` wants a page-aligned
//! start and length), so a range is widened to pages and the caller registers the part it
//! wants at its offset in the export.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::Context;
use super::error::{CudaError, DriverResultExt, Result};
use super::platform::Platform;
use super::stream::RawStream;

/// A dma-buf exporting `len` bytes of device memory from `base` (both page-aligned).
#[derive(Debug)]
pub struct DmaBuf {
    /// The dma-buf's file descriptor (closed on drop; a registration holds its own reference).
    pub fd: OwnedFd,
    /// Device address of the export's first byte.
    pub base: u64,
    /// Bytes exported.
    pub len: u64,
}

impl DmaBuf {
    /// Offset of device address `addr` in the export.
    pub fn offset_of(&self, addr: u64) -> u64 {
        addr - self.base
    }
}

/// Whether `ctx`'s device and driver can export memory as a dma-buf
/// (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`; the kernel must allow it too, which only the
/// export itself tells).
/// On HIP: no (ROCm 5's runtime has no `hipMemGetHandleForAddressRange`; GPUDirect over
/// ib then stages, as for a CUDA driver that exports none).
pub fn supported(ctx: &Context) -> Result<bool> {
    if ctx.platform() == Platform::Hip {
        return Ok(false);
    }
    let mut v = 0i32;
    // SAFETY: a plain integer query of a valid device.
    unsafe {
        sys::cuDeviceGetAttribute(
            &mut v,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
            ctx.device(),
        )
    }
    .result()
    .call("cuDeviceGetAttribute(DMA_BUF_SUPPORTED)")?;
    Ok(v != 0)
}

fn page() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// Exports the pages holding device range `addr..addr + len` of `ctx`.
pub fn export(ctx: &Arc<Context>, addr: u64, len: u64) -> Result<DmaBuf> {
    ctx.bind()?;
    if ctx.platform() == Platform::Hip {
        return Err(CudaError::Unsupported {
            what: "exporting device memory as a dma-buf",
            platform: "HIP",
        });
    }
    let page = page();
    let base = addr & !(page - 1);
    let end = (addr + len.max(1)).div_ceil(page) * page;
    let mut fd: i32 = -1;
    // SAFETY: writes one int (the new descriptor); the driver checks the range.
    unsafe {
        sys::cuMemGetHandleForAddressRange(
            (&mut fd as *mut i32).cast(),
            base,
            (end - base) as usize,
            sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    }
    .result()
    .call("cuMemGetHandleForAddressRange(DMA_BUF_FD)")?;
    // SAFETY: the driver returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(DmaBuf {
        fd,
        base,
        len: end - base,
    })
}

/// Copies `bytes` from `src` to `dst`, either of which may be host or device memory
/// (unified addressing), and waits for it: how a software stand-in for a NIC reaches device
/// memory it cannot map.
///
/// # Safety
/// Both ranges must be valid for `bytes` while the copy runs.
pub unsafe fn copy_sync(ctx: &Context, dst: u64, src: u64, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    ctx.bind()?;
    // SAFETY: forwarded to the caller.
    unsafe { crate::pinned::copy_any_async(dst, src, bytes, RawStream::DEFAULT) }?;
    RawStream::DEFAULT.synchronize()
}
