//! Pinned host memory mapped into the device's address space (`cuMemHostAlloc` with
//! `DEVICEMAP | PORTABLE`, or `hipHostMalloc` with `Mapped | Portable`), and stream-ordered
//! copies between any two addresses (unified addressing: host staging and device tensors
//! alike).
//!
//! The GPU progress engine keeps its flags and its staging buffers here: the device copies
//! into and out of them at full PCIe speed, kernels read and write the flags, and the host
//! reads and writes both without any driver call.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::driver::Context;
use super::error::{DriverResultExt, Result};
use super::platform::{platform, Platform};
use super::stream::RawStream;

/// Page-locked host memory, visible to every context of the process and mapped for kernels.
#[derive(Debug)]
pub struct PinnedBuffer {
    ctx: Arc<Context>,
    ptr: *mut u8,
    bytes: usize,
    device_ptr: u64,
    /// HIP's allocation, freed by its own drop; `None` on CUDA.
    hip: Option<torchcomms_hip::PinnedHost>,
}

// SAFETY: pinned memory is ordinary host memory that any thread may access; the handle is an
// address and a length.
unsafe impl Send for PinnedBuffer {}
// SAFETY: methods take &self and hand out addresses only; who writes the memory when is the
// users' protocol (the GPE's flags and step numbers).
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocates `bytes` of zeroed pinned memory (at least one byte is allocated).
    pub fn alloc(ctx: &Arc<Context>, bytes: usize) -> Result<PinnedBuffer> {
        ctx.bind()?;
        let size = bytes.max(1);
        if ctx.platform() == Platform::Hip {
            let host = torchcomms_hip::PinnedHost::new(size)?;
            LIVE_PINNED_BYTES.fetch_add(size as u64, Ordering::Relaxed);
            return Ok(PinnedBuffer {
                ctx: Arc::clone(ctx),
                ptr: host.as_ptr(),
                bytes,
                device_ptr: host.device_ptr(),
                hip: Some(host),
            });
        }
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: allocates `size` bytes; we own the result until Drop.
        let raw = unsafe { result::malloc_host(size, flags) }.call("cuMemHostAlloc")?;
        let ptr = raw.cast::<u8>();
        // SAFETY: `ptr` is valid for `size` bytes, just allocated.
        unsafe { std::ptr::write_bytes(ptr, 0, size) };
        let mut device_ptr: sys::CUdeviceptr = 0;
        // SAFETY: `raw` came from cuMemHostAlloc with DEVICEMAP; writes one address.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, raw, 0) }
            .result()
            .call("cuMemHostGetDevicePointer");
        LIVE_PINNED_BYTES.fetch_add(size as u64, Ordering::Relaxed);
        let buf = PinnedBuffer {
            ctx: Arc::clone(ctx),
            ptr,
            bytes,
            device_ptr,
            hip: None,
        };
        r.map(|()| buf)
    }

    /// The host address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The address kernels use for the same memory.
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

/// Pinned bytes held now (see [`crate::live_bytes`]).
pub(crate) static LIVE_PINNED_BYTES: AtomicU64 = AtomicU64::new(0);

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        LIVE_PINNED_BYTES.fetch_sub(self.bytes.max(1) as u64, Ordering::Relaxed);
        if self.hip.is_some() {
            return;
        }
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: ours, freed once; users stop using it before dropping (the GPE keeps a
            // buffer until the device work that touches it has completed).
            unsafe { result::free_host(self.ptr.cast::<c_void>()) }.call("cuMemFreeHost")
        });
        if let Err(e) = r {
            tracing::warn!(bytes = self.bytes, "freeing pinned memory: {e}");
        }
    }
}

/// Copies `bytes` from `src` to `dst` on `stream`; either side may be device memory or pinned
/// host memory (unified addressing tells the driver which).
///
/// # Safety
/// Both ranges must stay valid, and `dst` unused by others, until the copy has run.
pub unsafe fn copy_any_async(dst: u64, src: u64, bytes: usize, stream: RawStream) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    if platform() == Platform::Hip {
        // SAFETY: forwarded to the caller.
        return Ok(unsafe { torchcomms_hip::copy_async(dst, src, bytes, stream.hip()) }?);
    }
    // SAFETY: forwarded to the caller.
    unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream.raw()) }
        .result()
        .call("cuMemcpyAsync")
}
