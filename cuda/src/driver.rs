//! The CUDA driver, loaded at run time: devices and their primary contexts, streams, events,
//! device memory, modules and kernel launches. Thin RAII types over cudarc's `result` layer;
//! everything above this file handles no raw driver handle except through `as_raw()`.
//!
//! Streams that belong to someone else (PyTorch's current stream) are plain [`RawStream`]
//! values: this layer records events on them and makes them wait, but never destroys them.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

pub use cudarc::driver::DeviceRepr;
use cudarc::driver::{result, sys};

use super::error::{CudaError, DriverResultExt, Result};
use super::libs;

/// The loaded driver: its version and the devices this process sees.
#[derive(Debug)]
pub struct Driver {
    /// `cuDriverGetVersion` (13000 for CUDA 13.0).
    pub version: i32,
    /// Visible devices.
    pub device_count: u32,
    /// Where `libcuda` was found.
    pub path: PathBuf,
    _lib: libloading::Library,
}

/// Loads and initialises the driver once; later calls return the same result.
pub fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let opened = libs::open(
                "libcuda (the CUDA driver)",
                Some("TORCHCOMMS_CUDA_DRIVER_LIB"),
                &["libcuda.so.1", "libcuda.so"],
            )?;
            // SAFETY: only tries to dlopen cudarc's candidate names; the one we opened with
            // RTLD_GLOBAL matches by soname, so cudarc's loader (which panics when it finds
            // nothing) is only used once this returned true.
            if !unsafe { sys::is_culib_present() } {
                return Err(CudaError::LibraryNotFound {
                    lib: "libcuda".into(),
                    reason: "loaded, but not under a name cudarc opens (libcuda.so.1)".into(),
                    searched: opened.path.display().to_string(),
                });
            }
            result::init().call("cuInit")?;
            let mut version = 0i32;
            // SAFETY: writes one int.
            unsafe { sys::cuDriverGetVersion(&mut version) }
                .result()
                .call("cuDriverGetVersion")?;
            let count = result::device::get_count().call("cuDeviceGetCount")?;
            Ok(Driver {
                version,
                device_count: u32::try_from(count).unwrap_or(0),
                path: opened.path,
                _lib: opened.lib,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// True when the driver loads and sees at least one device.
pub fn is_available() -> bool {
    unavailable_reason().is_none()
}

/// Why CUDA cannot be used here, or `None` when it can (tests print this when they skip).
pub fn unavailable_reason() -> Option<String> {
    match driver() {
        Err(e) => Some(e.to_string()),
        Ok(d) if d.device_count == 0 => Some("the CUDA driver loaded but sees no device".into()),
        Ok(_) => None,
    }
}

/// A device's primary context (the one PyTorch uses), retained for the life of the process.
#[derive(Debug)]
pub struct Context {
    ordinal: u32,
    dev: sys::CUdevice,
    raw: sys::CUcontext,
    name: String,
    cc: (i32, i32),
    sm_count: i32,
}

// SAFETY: a CUcontext and CUdevice are process-wide handles the driver lets any thread use;
// this type never mutates them.
unsafe impl Send for Context {}
// SAFETY: as for Send; every method only reads the handles.
unsafe impl Sync for Context {}

impl Context {
    /// The primary context of device `ordinal`, retained once and shared.
    pub fn get(ordinal: u32) -> Result<Arc<Context>> {
        static CTXS: OnceLock<Mutex<HashMap<u32, Arc<Context>>>> = OnceLock::new();
        let d = driver()?;
        if ordinal >= d.device_count {
            return Err(CudaError::NoDevice {
                ordinal,
                count: d.device_count,
            });
        }
        let mut map = CTXS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(&ordinal) {
            return Ok(Arc::clone(c));
        }
        let dev = result::device::get(ordinal as i32).call("cuDeviceGet")?;
        // SAFETY: `dev` came from cuDeviceGet. The retain is never released: primary contexts
        // live as long as the process, like PyTorch's.
        let raw = unsafe { result::primary_ctx::retain(dev) }.call("cuDevicePrimaryCtxRetain")?;
        let attr = |a| {
            // SAFETY: `dev` is valid; the attribute is a plain integer query.
            unsafe { result::device::get_attribute(dev, a) }.call("cuDeviceGetAttribute")
        };
        use sys::CUdevice_attribute as A;
        let cc = (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let sm_count = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let name = result::device::get_name(dev).call("cuDeviceGetName")?;
        let ctx = Arc::new(Context {
            ordinal,
            dev,
            raw,
            name,
            cc,
            sm_count,
        });
        map.insert(ordinal, Arc::clone(&ctx));
        Ok(ctx)
    }

    /// Makes this context current on the calling thread (cheap when it already is).
    pub fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for the life of the process.
        unsafe { result::ctx::set_current(self.raw) }.call("cuCtxSetCurrent")
    }

    /// Lets kernels and copies of this context reach `peer`'s memory directly
    /// (`cuCtxEnablePeerAccess`; already enabled is fine).
    pub fn enable_peer_access(&self, peer: &Context) -> Result<()> {
        self.bind()?;
        // SAFETY: both contexts are retained for the life of the process.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.raw, 0) };
        if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        r.result().call("cuCtxEnablePeerAccess")
    }

    /// Device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Device name (`NVIDIA H200`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability (9, 0 on Hopper).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    /// Streaming multiprocessors.
    pub fn sm_count(&self) -> i32 {
        self.sm_count
    }

    /// The raw `CUdevice`.
    pub fn device(&self) -> sys::CUdevice {
        self.dev
    }

    /// Total and free memory of the device, in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (free, total) = result::mem_get_info().call("cuMemGetInfo")?;
        Ok((total, free))
    }
}

/// A stream this layer does not own, as callers pass it: a `CUstream` as an integer
/// (`torch.cuda.current_stream().cuda_stream`); 0 is the legacy default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RawStream(pub u64);

impl RawStream {
    /// The legacy default stream.
    pub const DEFAULT: RawStream = RawStream(0);

    pub(super) fn raw(self) -> sys::CUstream {
        self.0 as usize as sys::CUstream
    }

    /// Makes the stream wait (on the device) for `event`'s last record.
    pub fn wait_event(self, event: &Event) -> Result<()> {
        // SAFETY: the caller vouches for the stream (it came from its owner); the event is
        // alive (borrowed).
        unsafe {
            result::stream::wait_event(
                self.raw(),
                event.raw,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .call("cuStreamWaitEvent")
    }

    /// Blocks the host until the stream's work is done.
    pub fn synchronize(self) -> Result<()> {
        // SAFETY: as for wait_event.
        unsafe { result::stream::synchronize(self.raw()) }.call("cuStreamSynchronize")
    }

    /// Holds the stream (in the GPU's front end, no kernel) until the 64-bit word at device
    /// address `addr` reaches `value` (`cuStreamWaitValue64`, greater-or-equal). Waiting there
    /// occupies no SM and lets the GPU switch to other processes' contexts meanwhile, which a
    /// spinning kernel does not reliably allow.
    ///
    /// # Safety
    /// `addr` must be 8 aligned bytes of device-accessible memory (mapped pinned host memory
    /// counts) that stay allocated until the wait has passed; someone must raise the word, or
    /// the stream waits forever.
    pub unsafe fn wait_value_geq(self, addr: u64, value: u64) -> Result<()> {
        let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: forwarded to the caller.
        unsafe { sys::cuStreamWaitValue64_v2(self.raw(), addr, value, geq) }
            .result()
            .call("cuStreamWaitValue64")
    }

    /// True while the stream is capturing a CUDA graph.
    pub fn is_capturing(self) -> Result<bool> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: writes one enum.
        unsafe { sys::cuStreamIsCapturing(self.raw(), &mut status) }
            .result()
            .call("cuStreamIsCapturing")?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
}

/// A stream owned by this layer (non-blocking: no implicit ordering with the default stream).
#[derive(Debug)]
pub struct Stream {
    ctx: Arc<Context>,
    raw: sys::CUstream,
}

// SAFETY: CUDA streams may be used from any thread of the process.
unsafe impl Send for Stream {}
// SAFETY: every method is a driver call that is thread-safe on the same stream.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a non-blocking stream on `ctx`; `high_priority` asks for the greatest priority.
    pub fn new(ctx: &Arc<Context>, high_priority: bool) -> Result<Stream> {
        ctx.bind()?;
        use result::stream::StreamKind;
        let raw = if high_priority {
            let (_least, greatest) =
                result::stream::get_priority_range().call("cuCtxGetStreamPriorityRange")?;
            result::stream::create_with_priority(StreamKind::NonBlocking, greatest)
                .call("cuStreamCreateWithPriority")?
        } else {
            result::stream::create(StreamKind::NonBlocking).call("cuStreamCreate")?
        };
        Ok(Stream {
            ctx: Arc::clone(ctx),
            raw,
        })
    }

    /// This stream as a [`RawStream`] (valid while `self` lives).
    pub fn as_raw(&self) -> RawStream {
        RawStream(self.raw as usize as u64)
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: we created the stream and nobody else destroys it.
            unsafe { result::stream::destroy(self.raw) }.call("cuStreamDestroy")
        });
        if let Err(e) = r {
            tracing::warn!("dropping a CUDA stream: {e}");
        }
    }
}

/// A CUDA event without timing, to order streams and to poll completion.
#[derive(Debug)]
pub struct Event {
    ctx: Arc<Context>,
    raw: sys::CUevent,
}

// SAFETY: CUDA events may be recorded, queried and waited on from any thread.
unsafe impl Send for Event {}
// SAFETY: as for Send; the driver synchronises its own state.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event on `ctx` (timing disabled: cheaper to record and query).
    pub fn new(ctx: &Arc<Context>) -> Result<Event> {
        ctx.bind()?;
        let raw = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .call("cuEventCreate")?;
        Ok(Event {
            ctx: Arc::clone(ctx),
            raw,
        })
    }

    /// Records the work issued so far on `stream`.
    pub fn record(&self, stream: RawStream) -> Result<()> {
        // SAFETY: the event is alive; the caller vouches for the stream.
        unsafe { result::event::record(self.raw, stream.raw()) }.call("cuEventRecord")
    }

    /// True once the recorded work is done; an error if that work failed.
    pub fn query(&self) -> Result<bool> {
        // SAFETY: the event is alive.
        let r = super::graph::relaxed(|| unsafe { result::event::query(self.raw) });
        match r.call("cuEventQuery") {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_ready() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Blocks the host until the recorded work is done.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the event is alive.
        unsafe { result::event::synchronize(self.raw) }.call("cuEventSynchronize")
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // cuEventDestroy does not wait: resources go once the recorded work is done.
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: we created the event and nobody else destroys it.
            unsafe { result::event::destroy(self.raw) }.call("cuEventDestroy")
        });
        if let Err(e) = r {
            tracing::warn!("dropping a CUDA event: {e}");
        }
    }
}

/// Bytes of device memory and of pinned host memory this process holds through
/// [`DeviceBuffer`] and [`crate::PinnedBuffer`] now: what tests check returns to zero once
/// every communicator is gone.
pub fn live_bytes() -> (u64, u64) {
    (
        LIVE_DEVICE_BYTES.load(std::sync::atomic::Ordering::Relaxed),
        crate::pinned::LIVE_PINNED_BYTES.load(std::sync::atomic::Ordering::Relaxed),
    )
}

static LIVE_DEVICE_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Device memory from `cuMemAlloc`, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    ctx: Arc<Context>,
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

// SAFETY: device memory is addressable from any host thread; the handle is a plain address.
unsafe impl Send for DeviceBuffer {}
// SAFETY: methods take &self and only issue driver calls, which are thread-safe.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// Allocates `bytes` (uninitialised; 0 bytes gives a null pointer and no allocation).
    pub fn alloc(ctx: &Arc<Context>, bytes: usize) -> Result<DeviceBuffer> {
        ctx.bind()?;
        let ptr = if bytes == 0 {
            0
        } else {
            // SAFETY: a plain allocation in the bound context.
            unsafe { result::malloc_sync(bytes) }.call("cuMemAlloc")?
        };
        if ptr != 0 {
            LIVE_DEVICE_BYTES.fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(DeviceBuffer {
            ctx: Arc::clone(ctx),
            ptr,
            bytes,
        })
    }

    /// Allocates `bytes` set to zero.
    pub fn zeroed(ctx: &Arc<Context>, bytes: usize) -> Result<DeviceBuffer> {
        let b = DeviceBuffer::alloc(ctx, bytes)?;
        if bytes > 0 {
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
        if data.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: bounds checked above; `data` is a valid host slice.
        unsafe { result::memcpy_htod_sync(self.ptr + offset as u64, data) }.call("cuMemcpyHtoD")
    }

    /// Copies bytes at `offset` to the host (synchronous; ordered after the legacy default
    /// stream, so after the work that stream waits for).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len(), "read")?;
        if out.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: bounds checked above; `out` is a valid host slice.
        unsafe { result::memcpy_dtoh_sync(out, self.ptr + offset as u64) }.call("cuMemcpyDtoH")
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
        LIVE_DEVICE_BYTES.fetch_sub(self.bytes as u64, std::sync::atomic::Ordering::Relaxed);
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
    // SAFETY: forwarded to the caller.
    unsafe { result::memcpy_dtod_async(dst, src, bytes, stream.raw()) }.call("cuMemcpyDtoDAsync")
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
    // SAFETY: forwarded to the caller; `src` is a valid host slice.
    unsafe { result::memcpy_htod_sync(dst, src) }.call("cuMemcpyHtoD")
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
    // SAFETY: forwarded to the caller; `dst` is a valid host slice.
    unsafe { result::memcpy_dtoh_sync(dst, src) }.call("cuMemcpyDtoH")
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
/// (`cuMemcpyPeerAsync`, what `cudaMemcpyPeerAsync` calls): the reference a copy into a peer's
/// mapped memory is measured against.
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
    // SAFETY: forwarded to the caller; both contexts are retained for the life of the process.
    unsafe { sys::cuMemcpyPeerAsync(dst, dst_ctx.raw, src, src_ctx.raw, bytes, stream.raw()) }
        .result()
        .call("cuMemcpyPeerAsync")
}

/// A loaded module (CUBIN or PTX) and the functions looked up in it.
#[derive(Debug)]
pub struct Module {
    ctx: Arc<Context>,
    raw: sys::CUmodule,
}

// SAFETY: modules and their functions may be used from any thread of the context.
unsafe impl Send for Module {}
// SAFETY: as for Send; lookups and launches are thread-safe driver calls.
unsafe impl Sync for Module {}

impl Module {
    /// Loads a CUBIN or a NUL-terminated PTX image.
    pub fn load(ctx: &Arc<Context>, image: &[u8]) -> Result<Module> {
        ctx.bind()?;
        // SAFETY: the driver reads the image during the call only; CUBIN carries its size in
        // its ELF header and PTX is NUL-terminated by our compiler wrapper.
        let raw = unsafe { result::module::load_data(image.as_ptr().cast::<c_void>()) }
            .call("cuModuleLoadData")?;
        Ok(Module {
            ctx: Arc::clone(ctx),
            raw,
        })
    }

    /// Looks up a kernel by its `extern "C"` name.
    pub fn function(&self, name: &str) -> Result<Function> {
        let cname = std::ffi::CString::new(name).map_err(|_| CudaError::BadArgument {
            call: "cuModuleGetFunction",
            detail: format!("kernel name {name:?} holds a NUL"),
        })?;
        // SAFETY: the module is loaded; the name is NUL-terminated.
        let raw =
            unsafe { result::module::get_function(self.raw, cname) }.call("cuModuleGetFunction")?;
        Ok(Function { raw })
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: our module, unloaded once.
            unsafe { result::module::unload(self.raw) }.call("cuModuleUnload")
        });
        if let Err(e) = r {
            tracing::warn!("unloading a CUDA module: {e}");
        }
    }
}

/// A kernel of a [`Module`] (valid while the module is loaded).
#[derive(Debug, Clone, Copy)]
pub struct Function {
    raw: sys::CUfunction,
}

// SAFETY: a CUfunction is a handle usable from any thread.
unsafe impl Send for Function {}
// SAFETY: as for Send.
unsafe impl Sync for Function {}

/// Most parameters a kernel of this project takes.
const MAX_KERNEL_ARGS: usize = 8;

/// A launch of a [`Function`] in the making: its arguments in the kernel's parameter order,
/// each a value whose type cudarc's [`DeviceRepr`] vouches can be passed to a kernel (numbers,
/// or `#[repr(C)]` parameter structs that implement it). The values are borrowed until the
/// launch, which copies them.
#[derive(Debug)]
#[must_use = "a launch does nothing until `launch` is called"]
pub struct LaunchArgs<'a> {
    func: Function,
    args: [*mut c_void; MAX_KERNEL_ARGS],
    len: usize,
    _values: std::marker::PhantomData<&'a ()>,
}

impl<'a> LaunchArgs<'a> {
    /// Adds the next argument.
    pub fn arg<T: DeviceRepr>(mut self, value: &'a T) -> Self {
        assert!(
            self.len < MAX_KERNEL_ARGS,
            "kernels take at most {MAX_KERNEL_ARGS} parameters"
        );
        self.args[self.len] = (value as *const T).cast_mut().cast();
        self.len += 1;
        self
    }

    /// Launches on `stream` with a 1-D grid of `grid` blocks of `block` threads.
    ///
    /// # Safety
    /// The arguments' types and order must match the kernel's parameters, and every device
    /// address among them must stay valid, as the kernel uses it, until the kernel finishes.
    /// The module must outlive the launch.
    pub unsafe fn launch(mut self, grid: u32, block: u32, stream: RawStream) -> Result<()> {
        let len = self.len;
        // SAFETY: forwarded to the caller; the argument values are borrowed for 'a, past the
        // call, which copies them.
        unsafe { self.func.launch(grid, block, stream, &mut self.args[..len]) }
    }
}

impl Function {
    /// Starts a launch: add the arguments with [`LaunchArgs::arg`], then launch.
    pub fn args<'a>(&self) -> LaunchArgs<'a> {
        LaunchArgs {
            func: *self,
            args: [std::ptr::null_mut(); MAX_KERNEL_ARGS],
            len: 0,
            _values: std::marker::PhantomData,
        }
    }

    /// Launches on `stream` with a 1-D grid.
    ///
    /// # Safety
    /// `params` must point at values whose types and order match the kernel's parameters, and
    /// every device address among them must stay valid until the kernel finishes. The module
    /// must outlive the launch.
    unsafe fn launch(
        &self,
        grid: u32,
        block: u32,
        stream: RawStream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe {
            result::launch_kernel(
                self.raw,
                (grid, 1, 1),
                (block, 1, 1),
                0,
                stream.raw(),
                params,
            )
        }
        .call("cuLaunchKernel")
    }
}
