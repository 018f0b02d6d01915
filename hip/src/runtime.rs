//! Safe owners of HIP resources: devices, device memory, streams, events and IPC mappings.
//! Each releases its resource in `Drop` (logging, never panicking, if HIP refuses) and offers
//! `as_raw()` for code that must pass the handle to another library (RCCL).
//!
//! None of this has run on an AMD GPU (docs/amd.md): it is written against HIP's documented
//! API, and on the machines we have it is only checked to report "no AMD GPU".

use std::ffi::c_void;
use std::sync::OnceLock;

use crate::error::{HipError, Result};
use crate::sys::{self, check, HipIpcMemHandle};

/// Whether HIP can be used here: `Ok(n)` with the number of AMD GPUs, or why not
/// ([`HipError::LibraryNotFound`]: "ROCm not found"; [`HipError::NoDevice`]: "no AMD GPU").
/// Evaluated once.
pub fn availability() -> Result<usize> {
    static AVAIL: OnceLock<Result<usize>> = OnceLock::new();
    AVAIL
        .get_or_init(|| {
            let hip = sys::hip()?;
            // SAFETY: hipInit takes flags that must be 0.
            let init = unsafe { (hip.hipInit)(0) };
            if init == sys::HIP_ERROR_NO_DEVICE || init == sys::HIP_ERROR_INVALID_DEVICE {
                return Err(HipError::NoDevice {
                    detail: format!("hipInit: {}", sys::error_string(hip, init)),
                });
            }
            check(hip, "hipInit", init)?;
            let mut n = 0;
            // SAFETY: `n` is a valid out-pointer for the call.
            let code = unsafe { (hip.hipGetDeviceCount)(&mut n) };
            if code == sys::HIP_ERROR_NO_DEVICE || (code == sys::HIP_SUCCESS && n <= 0) {
                return Err(HipError::NoDevice {
                    detail: format!(
                        "hipGetDeviceCount: {} ({} from {})",
                        n.max(0),
                        sys::error_string(hip, code),
                        hip.path.display()
                    ),
                });
            }
            check(hip, "hipGetDeviceCount", code)?;
            Ok(n as usize)
        })
        .clone()
}

/// Whether an AMD GPU can be used.
pub fn is_available() -> bool {
    availability().is_ok()
}

/// HIP's runtime version (`hipRuntimeGetVersion`, e.g. 50221153 for ROCm 5.2).
pub fn runtime_version() -> Result<i32> {
    let hip = sys::hip()?;
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer.
    check(hip, "hipRuntimeGetVersion", unsafe {
        (hip.hipRuntimeGetVersion)(&mut v)
    })?;
    Ok(v)
}

/// Makes `device` current on this thread (HIP's state is per thread, as CUDA's runtime).
pub fn set_device(device: usize) -> Result<()> {
    availability()?;
    let hip = sys::hip()?;
    // SAFETY: plain call; an out-of-range ordinal is reported as an error code.
    check(hip, "hipSetDevice", unsafe {
        (hip.hipSetDevice)(device as i32)
    })
}

fn log_drop_err(what: &str, r: Result<()>) {
    if let Err(e) = r {
        tracing::warn!("releasing a HIP {what} failed: {e}");
    }
}

/// Device memory from `hipMalloc`, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: *mut c_void,
    len: usize,
}

// SAFETY: device memory is not tied to the thread that allocated it; HIP's allocator is
// thread-safe, and this type hands out the address only (accesses go through HIP calls).
unsafe impl Send for DeviceBuffer {}
// SAFETY: `&DeviceBuffer` allows only reads of the address and HIP calls that synchronise
// internally.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// `len` bytes on the current device (uninitialised).
    pub fn new(len: usize) -> Result<Self> {
        availability()?;
        let hip = sys::hip()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; a size of 0 gives null, which drop accepts.
        check(hip, "hipMalloc", unsafe { (hip.hipMalloc)(&mut ptr, len) })?;
        Ok(Self { ptr, len })
    }
    /// `len` bytes of fine-grained memory on the current device (uninitialised): memory whose
    /// writes other GPUs and the host see while a kernel runs, which flags that peers spin on
    /// over an IPC mapping need (`hipMalloc`'s coarse-grained memory is coherent only at kernel
    /// boundaries; RCCL allocates its flags the same way).
    pub fn fine_grained(len: usize) -> Result<Self> {
        availability()?;
        let hip = sys::hip()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; a size of 0 gives null, which drop accepts.
        check(hip, "hipExtMallocWithFlags", unsafe {
            (hip.hipExtMallocWithFlags)(&mut ptr, len, sys::HIP_DEVICE_MALLOC_FINEGRAINED)
        })?;
        Ok(Self { ptr, len })
    }
    /// `len` bytes on the current device, set to zero.
    pub fn zeroed(len: usize) -> Result<Self> {
        let b = Self::new(len)?;
        b.zero()?;
        Ok(b)
    }
    /// Sets every byte to zero (synchronously).
    pub fn zero(&self) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let hip = sys::hip()?;
        // SAFETY: the buffer holds `len` bytes.
        check(hip, "hipMemset", unsafe {
            (hip.hipMemset)(self.ptr, 0, self.len)
        })
    }
    /// Copies `src` into the buffer from offset 0 (synchronously).
    pub fn write(&self, src: &[u8]) -> Result<()> {
        self.check_len("write", src.len())?;
        let hip = sys::hip()?;
        // SAFETY: the destination holds at least `src.len()` bytes (checked above) and `src`
        // is a live host slice.
        check(hip, "hipMemcpy", unsafe {
            (hip.hipMemcpy)(
                self.ptr,
                src.as_ptr().cast(),
                src.len(),
                sys::HIP_MEMCPY_HOST_TO_DEVICE,
            )
        })
    }
    /// Copies the first `dst.len()` bytes out (synchronously).
    pub fn read(&self, dst: &mut [u8]) -> Result<()> {
        self.check_len("read", dst.len())?;
        let hip = sys::hip()?;
        // SAFETY: the source holds at least `dst.len()` bytes and `dst` is a live host slice.
        check(hip, "hipMemcpy", unsafe {
            (hip.hipMemcpy)(
                dst.as_mut_ptr().cast(),
                self.ptr,
                dst.len(),
                sys::HIP_MEMCPY_DEVICE_TO_HOST,
            )
        })
    }
    fn check_len(&self, op: &'static str, bytes: usize) -> Result<()> {
        if bytes > self.len {
            return Err(HipError::OutOfBounds {
                op,
                bytes,
                len: self.len,
            });
        }
        Ok(())
    }
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The device address, valid while `self` lives.
    pub fn as_raw(&self) -> *mut c_void {
        self.ptr
    }
    /// A handle another process of this host opens with [`IpcMapping::open`] (over
    /// Infinity Fabric or PCIe, as the hardware links the two GPUs).
    pub fn ipc_handle(&self) -> Result<HipIpcMemHandle> {
        let hip = sys::hip()?;
        let mut h = HipIpcMemHandle {
            reserved: [0; sys::HIP_IPC_HANDLE_SIZE],
        };
        // SAFETY: `h` is a valid out-pointer and `self.ptr` is a hipMalloc allocation.
        check(hip, "hipIpcGetMemHandle", unsafe {
            (hip.hipIpcGetMemHandle)(&mut h, self.ptr)
        })?;
        Ok(h)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        if let Ok(hip) = sys::hip() {
            // SAFETY: `ptr` came from hipMalloc and is freed once.
            log_drop_err(
                "buffer",
                check(hip, "hipFree", unsafe { (hip.hipFree)(self.ptr) }),
            );
        }
    }
}

/// Another process's device memory mapped here from its [`HipIpcMemHandle`]; unmapped on drop.
#[derive(Debug)]
pub struct IpcMapping {
    ptr: *mut c_void,
}

// SAFETY: as `DeviceBuffer`: an address valid in every thread of the process.
unsafe impl Send for IpcMapping {}
// SAFETY: as `DeviceBuffer`.
unsafe impl Sync for IpcMapping {}

impl IpcMapping {
    /// Maps the memory behind `handle` (exported by another process of this host).
    pub fn open(handle: &HipIpcMemHandle) -> Result<Self> {
        availability()?;
        let hip = sys::hip()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; the handle is passed by value as HIP declares.
        check(hip, "hipIpcOpenMemHandle", unsafe {
            (hip.hipIpcOpenMemHandle)(&mut ptr, *handle, sys::HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        })?;
        Ok(Self { ptr })
    }
    /// The mapped address here, valid while `self` lives.
    pub fn as_raw(&self) -> *mut c_void {
        self.ptr
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if let Ok(hip) = sys::hip() {
            // SAFETY: `ptr` came from hipIpcOpenMemHandle and is closed once.
            log_drop_err(
                "IPC mapping",
                check(hip, "hipIpcCloseMemHandle", unsafe {
                    (hip.hipIpcCloseMemHandle)(self.ptr)
                }),
            );
        }
    }
}

/// A non-blocking HIP stream, destroyed on drop.
#[derive(Debug)]
pub struct Stream {
    raw: sys::HipStream,
}

// SAFETY: HIP streams may be used from any thread (HIP's runtime locks internally).
unsafe impl Send for Stream {}
// SAFETY: as above: enqueueing on a stream from several threads is allowed by HIP.
unsafe impl Sync for Stream {}

impl Stream {
    /// A stream on the current device that does not wait for the null stream.
    pub fn new() -> Result<Self> {
        availability()?;
        let hip = sys::hip()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check(hip, "hipStreamCreateWithFlags", unsafe {
            (hip.hipStreamCreateWithFlags)(&mut raw, sys::HIP_STREAM_NON_BLOCKING)
        })?;
        Ok(Self { raw })
    }
    /// A non-blocking stream on the current device, of the highest priority with `high`.
    pub fn with_priority(high: bool) -> Result<Self> {
        if !high {
            return Self::new();
        }
        availability()?;
        let hip = sys::hip()?;
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: valid out-pointers.
        check(hip, "hipDeviceGetStreamPriorityRange", unsafe {
            (hip.hipDeviceGetStreamPriorityRange)(&mut least, &mut greatest)
        })?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `greatest` is a priority HIP reported.
        check(hip, "hipStreamCreateWithPriority", unsafe {
            (hip.hipStreamCreateWithPriority)(&mut raw, sys::HIP_STREAM_NON_BLOCKING, greatest)
        })?;
        Ok(Self { raw })
    }
    /// Blocks until the stream's work is done.
    pub fn synchronize(&self) -> Result<()> {
        let hip = sys::hip()?;
        // SAFETY: `raw` is a live stream.
        check(hip, "hipStreamSynchronize", unsafe {
            (hip.hipStreamSynchronize)(self.raw)
        })
    }
    /// Makes later work on this stream wait for `event`.
    pub fn wait(&self, event: &Event) -> Result<()> {
        // SAFETY: this stream is live while borrowed.
        unsafe { stream_wait_event(self.raw, event) }
    }
    /// The `hipStream_t`, valid while `self` lives.
    pub fn as_raw(&self) -> *mut c_void {
        self.raw
    }
}

/// Makes later work on `stream` (null: the null stream) wait for `event`.
///
/// # Safety
/// `stream` must be null or a live `hipStream_t` of the current device.
pub unsafe fn stream_wait_event(stream: *mut c_void, event: &Event) -> Result<()> {
    availability()?;
    let hip = sys::hip()?;
    // SAFETY: the caller vouches for `stream`; `event` is live.
    check(hip, "hipStreamWaitEvent", unsafe {
        (hip.hipStreamWaitEvent)(stream, event.raw, 0)
    })
}

/// Whether `stream` is being captured into a HIP graph.
///
/// # Safety
/// `stream` must be null or a live `hipStream_t` of the current device.
pub unsafe fn stream_is_capturing(stream: *mut c_void) -> Result<bool> {
    availability()?;
    let hip = sys::hip()?;
    let mut status = sys::HIP_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the caller vouches for `stream`; `status` is a valid out-pointer.
    check(hip, "hipStreamIsCapturing", unsafe {
        (hip.hipStreamIsCapturing)(stream, &mut status)
    })?;
    Ok(status != sys::HIP_STREAM_CAPTURE_STATUS_NONE)
}

/// Lets this thread make HIP calls that a capture in global mode elsewhere would refuse (event
/// queries of a watchdog): the mode of PyTorch's own background threads.
pub fn relax_capture_mode_for_this_thread() -> Result<()> {
    crate::graph::exchange_capture_mode(sys::HIP_STREAM_CAPTURE_MODE_RELAXED).map(drop)
}

/// Copies `bytes` from `src` to `dst` (device or host addresses, unified) in order on `stream`.
///
/// # Safety
/// Both ranges must stay valid until the copy has run; `stream` must be null or live.
pub unsafe fn copy_async(dst: u64, src: u64, bytes: usize, stream: *mut c_void) -> Result<()> {
    availability()?;
    let hip = sys::hip()?;
    // SAFETY: forwarded to the caller.
    check(hip, "hipMemcpyAsync", unsafe {
        (hip.hipMemcpyAsync)(
            dst as *mut c_void,
            src as *const c_void,
            bytes,
            sys::HIP_MEMCPY_DEFAULT,
            stream,
        )
    })
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(hip) = sys::hip() {
            // SAFETY: `raw` came from hipStreamCreateWithFlags and is destroyed once.
            log_drop_err(
                "stream",
                check(hip, "hipStreamDestroy", unsafe {
                    (hip.hipStreamDestroy)(self.raw)
                }),
            );
        }
    }
}

/// A HIP event without timing, destroyed on drop.
#[derive(Debug)]
pub struct Event {
    raw: sys::HipEvent,
}

// SAFETY: HIP events may be recorded and queried from any thread.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// An event on the current device.
    pub fn new() -> Result<Self> {
        availability()?;
        let hip = sys::hip()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check(hip, "hipEventCreateWithFlags", unsafe {
            (hip.hipEventCreateWithFlags)(&mut raw, sys::HIP_EVENT_DISABLE_TIMING)
        })?;
        Ok(Self { raw })
    }
    /// Records the work enqueued on `stream` so far.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: `stream` is live while borrowed.
        unsafe { self.record_raw(stream.raw) }
    }
    /// Records the work enqueued so far on a stream another library owns (PyTorch's current
    /// stream; null is the null stream).
    ///
    /// # Safety
    /// `stream` must be null or a live `hipStream_t` of the current device.
    pub unsafe fn record_raw(&self, stream: *mut c_void) -> Result<()> {
        let hip = sys::hip()?;
        // SAFETY: `raw` is live; the caller vouches for `stream`.
        check(hip, "hipEventRecord", unsafe {
            (hip.hipEventRecord)(self.raw, stream)
        })
    }
    /// Whether the recorded work is done.
    pub fn is_complete(&self) -> Result<bool> {
        let hip = sys::hip()?;
        // SAFETY: `raw` is a live event.
        match unsafe { (hip.hipEventQuery)(self.raw) } {
            sys::HIP_ERROR_NOT_READY => Ok(false),
            code => check(hip, "hipEventQuery", code).map(|()| true),
        }
    }
    /// Blocks until the recorded work is done.
    pub fn synchronize(&self) -> Result<()> {
        let hip = sys::hip()?;
        // SAFETY: `raw` is a live event.
        check(hip, "hipEventSynchronize", unsafe {
            (hip.hipEventSynchronize)(self.raw)
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(hip) = sys::hip() {
            // SAFETY: `raw` came from hipEventCreateWithFlags and is destroyed once.
            log_drop_err(
                "event",
                check(hip, "hipEventDestroy", unsafe {
                    (hip.hipEventDestroy)(self.raw)
                }),
            );
        }
    }
}

/// Blocks until the work on `stream` (null: the null stream) is done.
///
/// # Safety
/// `stream` must be null or a live `hipStream_t`.
pub unsafe fn stream_synchronize(stream: *mut c_void) -> Result<()> {
    availability()?;
    let hip = sys::hip()?;
    // SAFETY: forwarded to the caller.
    check(hip, "hipStreamSynchronize", unsafe {
        (hip.hipStreamSynchronize)(stream)
    })
}

/// Holds `stream` until the 64-bit word at `addr` is at least `value` (`hipStreamWaitValue64`,
/// `hipStreamWaitValueGte`).
///
/// # Safety
/// `addr` must be 8 aligned bytes the device can read (mapped pinned memory counts) until the
/// wait has passed, and someone must raise the word; `stream` must be null or live.
pub unsafe fn stream_wait_value64(stream: *mut c_void, addr: u64, value: u64) -> Result<()> {
    availability()?;
    let hip = sys::hip()?;
    // SAFETY: forwarded to the caller.
    check(hip, "hipStreamWaitValue64", unsafe {
        (hip.hipStreamWaitValue64)(
            stream,
            addr as *mut c_void,
            value,
            sys::HIP_STREAM_WAIT_VALUE_GTE,
            u64::MAX,
        )
    })
}

/// Copies `bytes` between any two addresses (unified) and waits for the copy.
///
/// # Safety
/// Both ranges must be valid for `bytes` during the call.
pub unsafe fn copy_sync(dst: u64, src: u64, bytes: usize) -> Result<()> {
    availability()?;
    let hip = sys::hip()?;
    // SAFETY: forwarded to the caller.
    check(hip, "hipMemcpy", unsafe {
        (hip.hipMemcpy)(
            dst as *mut c_void,
            src as *const c_void,
            bytes,
            sys::HIP_MEMCPY_DEFAULT,
        )
    })
}

/// Copies `bytes` from device `src_device`'s `src` to device `dst_device`'s `dst` on `stream`.
///
/// # Safety
/// Both ranges must be valid device memory of their devices while the copy runs; `stream`
/// must be null or a live stream of one of them.
pub unsafe fn copy_peer_async(
    dst: u64,
    dst_device: i32,
    src: u64,
    src_device: i32,
    bytes: usize,
    stream: *mut c_void,
) -> Result<()> {
    availability()?;
    let hip = sys::hip()?;
    // SAFETY: forwarded to the caller.
    check(hip, "hipMemcpyPeerAsync", unsafe {
        (hip.hipMemcpyPeerAsync)(
            dst as *mut c_void,
            dst_device,
            src as *const c_void,
            src_device,
            bytes,
            stream,
        )
    })
}

/// The allocation holding device address `ptr`: its start, size and unique buffer id.
pub fn allocation_of(ptr: u64) -> Result<(u64, u64, u64)> {
    availability()?;
    let hip = sys::hip()?;
    let (mut base, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: valid out-pointers; HIP checks that `ptr` is a device address.
    check(hip, "hipMemGetAddressRange", unsafe {
        (hip.hipMemGetAddressRange)(&mut base, &mut size, ptr as *mut c_void)
    })?;
    let mut id = 0u64;
    // SAFETY: the buffer id attribute is one unsigned 64-bit value.
    check(hip, "hipPointerGetAttribute(BUFFER_ID)", unsafe {
        (hip.hipPointerGetAttribute)(
            (&mut id as *mut u64).cast(),
            sys::HIP_POINTER_ATTRIBUTE_BUFFER_ID,
            ptr as *mut c_void,
        )
    })?;
    Ok((base as u64, size as u64, id))
}

/// An IPC handle for the allocation starting at device address `base` (another process of
/// the host opens it with [`IpcMapping::open`]).
pub fn ipc_handle_of(base: u64) -> Result<HipIpcMemHandle> {
    availability()?;
    let hip = sys::hip()?;
    let mut h = HipIpcMemHandle {
        reserved: [0; sys::HIP_IPC_HANDLE_SIZE],
    };
    // SAFETY: `h` is a valid out-pointer; HIP checks that `base` starts an allocation.
    check(hip, "hipIpcGetMemHandle", unsafe {
        (hip.hipIpcGetMemHandle)(&mut h, base as *mut c_void)
    })?;
    Ok(h)
}
