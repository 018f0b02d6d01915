//! Device memory and copies of either runtime.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::driver::Context;
use super::error::{CudaError, DriverResultExt, Result};
use super::platform::{platform, Platform};
use super::stream::RawStream;

/// Bytes of device memory and of pinned host memory this process holds through
/// [`DeviceBuffer`] and [`crate::PinnedBuffer`] now: what tests check returns to zero once
/// every communicator is gone.
pub fn live_bytes() -> (u64, u64) {
    (
        LIVE_DEVICE_BYTES.load(Ordering::Relaxed),
        crate::pinned::LIVE_PINNED_BYTES.load(Ordering::Relaxed),
    )
}

static LIVE_DEVICE_BYTES: AtomicU64 = AtomicU64::new(0);

/// Who frees a [`DeviceBuffer`].
#[derive(Debug)]
enum Owner {
    /// `cuMemFree` in our drop.
    Cuda,
    /// The HIP allocation's own drop.
    Hip(torchcomms_hip::DeviceBuffer),
}

/// Device memory (`cuMemAlloc`/`hipMalloc`), freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    ctx: Arc<Context>,
    ptr: u64,
    bytes: usize,
    owner: Owner,
}

// SAFETY: device memory is addressable from any host thread; the handle is a plain address.
unsafe impl Send for DeviceBuffer {}
// SAFETY: methods take &self and only issue runtime calls, which are thread-safe.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// Allocates `bytes` (uninitialised; 0 bytes gives a null pointer and no allocation). On
    /// HIP the memory is fine-grained, so peers and the host see its writes during a kernel.
    pub fn alloc(ctx: &Arc<Context>, bytes: usize) -> Result<DeviceBuffer> {
        ctx.bind()?;
        let (ptr, owner) = match ctx.platform() {
            Platform::Hip if bytes > 0 => {
                // The engine's buffers are what peers and the host poll while kernels run.
                let b = torchcomms_hip::DeviceBuffer::fine_grained(bytes)?;
                (b.as_raw() as u64, Owner::Hip(b))
            }
            Platform::Cuda if bytes > 0 => {
                // SAFETY: a plain allocation in the bound context.
                let p = unsafe { result::malloc_sync(bytes) }.call("cuMemAlloc")?;
                (p, Owner::Cuda)
            }
            _ => (0, Owner::Cuda),
        };
        if ptr != 0 {
            LIVE_DEVICE_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
        }
        Ok(DeviceBuffer {
            ctx: Arc::clone(ctx),
            ptr,
            bytes,
            owner,
        })
    }

    /// Allocates `bytes` set to zero.
    pub fn zeroed(ctx: &Arc<Context>, bytes: usize) -> Result<DeviceBuffer> {
        let b = DeviceBuffer::alloc(ctx, bytes)?;
        if let Owner::Hip(h) = &b.owner {
            h.zero()?;
        } else if bytes > 0 {
            // SAFETY: the range is our allocation.
            unsafe { result::memset_d8_sync(b.ptr, 0, bytes) }.call("cuMemsetD8")?;
        }
        Ok(b)
    }

    /// Allocates and fills from host bytes (synchronous, on the legacy default stream).
    pub fn from_host(ctx: &Arc<Context>, data: &[u8]) -> Result<DeviceBuffer> {
        let b = DeviceBuffer::alloc(ctx, data.len())?;
        b.write(0, data)?;
        Ok(b)
    }

    /// Copies host bytes to `offset` (synchronous; ordered after the legacy default stream).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len(), "write")?;
        // SAFETY: bounds checked above; `data` is a valid host slice.
        unsafe { copy_htod_sync(&self.ctx, self.ptr + offset as u64, data) }
    }

    /// Copies bytes at `offset` to the host (synchronous; ordered after the legacy default
    /// stream, so after the work that stream waits for).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len(), "read")?;
        // SAFETY: bounds checked above; `out` is a valid host slice.
        unsafe { copy_dtoh_sync(&self.ctx, out, self.ptr + offset as u64) }
    }

    fn check(&self, offset: usize, len: usize, call: &'static str) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(CudaError::BadArgument {
                call,
                detail: format!(
                    "{len} bytes at offset {offset} outside a {}-byte buffer",
                    self.bytes
                ),
            });
        }
        Ok(())
    }

    /// Device address (0 for an empty buffer).
    pub fn as_ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// True for a 0-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        LIVE_DEVICE_BYTES.fetch_sub(self.bytes as u64, Ordering::Relaxed);
        if let Owner::Hip(_) = self.owner {
            // Freed by its own drop, on the device bound here.
            if let Err(e) = self.ctx.bind() {
                tracing::warn!(bytes = self.bytes, "freeing device memory: {e}");
            }
            return;
        }
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: our allocation, freed once (cuMemFree waits for work using it).
            unsafe { result::free_sync(self.ptr) }.call("cuMemFree")
        });
        if let Err(e) = r {
            tracing::warn!(bytes = self.bytes, "freeing device memory: {e}");
        }
    }
}

/// Copies `bytes` between device addresses on `stream` (stream-ordered).
///
/// # Safety
/// Both ranges must be valid device memory of the stream's context while the copy runs.
pub unsafe fn copy_async(dst: u64, src: u64, bytes: usize, stream: RawStream) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    match platform() {
        // SAFETY: forwarded to the caller.
        Platform::Cuda => unsafe { result::memcpy_dtod_async(dst, src, bytes, stream.raw()) }
            .call("cuMemcpyDtoDAsync"),
        // SAFETY: forwarded to the caller.
        Platform::Hip => Ok(unsafe { torchcomms_hip::copy_async(dst, src, bytes, stream.hip()) }?),
    }
}

/// Copies host bytes to device address `dst` of `ctx`, synchronously (ordered after the legacy
/// default stream): the staging step of transfers whose other end is not on this device.
///
/// # Safety
/// `dst..dst + src.len()` must be device memory of `ctx`, valid for writes.
pub unsafe fn copy_htod_sync(ctx: &Context, dst: u64, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    ctx.bind()?;
    match ctx.platform() {
        // SAFETY: forwarded to the caller; `src` is a valid host slice.
        Platform::Cuda => unsafe { result::memcpy_htod_sync(dst, src) }.call("cuMemcpyHtoD"),
        Platform::Hip => {
            // SAFETY: as above.
            Ok(unsafe { torchcomms_hip::copy_sync(dst, src.as_ptr() as u64, src.len()) }?)
        }
    }
}

/// Copies device bytes at `src` of `ctx` to the host, synchronously (ordered after the legacy
/// default stream).
///
/// # Safety
/// `src..src + dst.len()` must be device memory of `ctx`, valid for reads.
pub unsafe fn copy_dtoh_sync(ctx: &Context, dst: &mut [u8], src: u64) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    ctx.bind()?;
    match ctx.platform() {
        // SAFETY: forwarded to the caller; `dst` is a valid host slice.
        Platform::Cuda => unsafe { result::memcpy_dtoh_sync(dst, src) }.call("cuMemcpyDtoH"),
        Platform::Hip => {
            // SAFETY: as above.
            Ok(unsafe { torchcomms_hip::copy_sync(dst.as_mut_ptr() as u64, src, dst.len()) }?)
        }
    }
}

/// Copies `bytes` between device addresses (either may be a peer's IPC mapping in `ctx`) on
/// the legacy default stream, and waits for it.
///
/// # Safety
/// Both ranges must be valid device memory reachable from `ctx` while the copy runs.
pub unsafe fn copy_dtod_sync(ctx: &Context, dst: u64, src: u64, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    ctx.bind()?;
    // SAFETY: forwarded to the caller.
    unsafe { copy_async(dst, src, bytes, RawStream::DEFAULT) }?;
    RawStream::DEFAULT.synchronize()
}

/// Copies `bytes` from `src` on `src_ctx`'s device to `dst` on `dst_ctx`'s device on `stream`
/// (`cuMemcpyPeerAsync`/`hipMemcpyPeerAsync`): the reference a copy into a peer's mapped
/// memory is measured against.
///
/// # Safety
/// Both ranges must be valid device memory of their contexts while the copy runs, and `stream`
/// a stream of `src_ctx` or `dst_ctx`.
pub unsafe fn copy_peer_async(
    dst: u64,
    dst_ctx: &Context,
    src: u64,
    src_ctx: &Context,
    bytes: usize,
    stream: RawStream,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let (Some(dst_raw), Some(src_raw)) = (dst_ctx.cuda_context(), src_ctx.cuda_context()) else {
        // SAFETY: forwarded to the caller.
        return Ok(unsafe {
            torchcomms_hip::copy_peer_async(
                dst,
                dst_ctx.ordinal() as i32,
                src,
                src_ctx.ordinal() as i32,
                bytes,
                stream.hip(),
            )
        }?);
    };
    // SAFETY: forwarded to the caller; both contexts are retained for the life of the process.
    unsafe { sys::cuMemcpyPeerAsync(dst, dst_raw, src, src_raw, bytes, stream.raw()) }
        .result()
        .call("cuMemcpyPeerAsync")
}
