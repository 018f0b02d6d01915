//! The HIP runtime's functions the engine calls, over the CUDA driver.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::sys::{self, CUresult};

/// `hipError_t` (CUDA's status value).
pub type HipError = c_int;

pub(crate) const INVALID_VALUE: HipError = 1;
pub(crate) const NO_DEVICE: HipError = 100;

/// Whether a CUDA driver loads here: cudarc panics on the first call into a driver it cannot
/// find, so every function answers "no device" first when there is none.
pub(crate) fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the driver's names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

pub(crate) fn code(r: CUresult) -> HipError {
    r as HipError
}

/// The primary context of device `ordinal`, retained once for the process (as HIP keeps one
/// context per device).
pub(crate) fn primary(ordinal: c_int) -> Result<sys::CUcontext, HipError> {
    static CTXS: OnceLock<Mutex<HashMap<c_int, usize>>> = OnceLock::new();
    let mut map = CTXS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(&c) = map.get(&ordinal) {
        return Ok(c as sys::CUcontext);
    }
    let mut dev = 0;
    // SAFETY: writes one device; the driver checks the ordinal.
    let r = unsafe { sys::cuDeviceGet(&mut dev, ordinal) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(code(r));
    }
    let mut ctx = std::ptr::null_mut();
    // SAFETY: writes one context of a valid device; never released (process lifetime).
    let r = unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(code(r));
    }
    map.insert(ordinal, ctx as usize);
    Ok(ctx)
}

/// HIP's default: a thread that selected no device uses device 0.
pub(crate) fn ensure_current() -> HipError {
    let mut cur = std::ptr::null_mut();
    // SAFETY: writes one context handle.
    if unsafe { sys::cuCtxGetCurrent(&mut cur) } == CUresult::CUDA_SUCCESS && !cur.is_null() {
        return 0;
    }
    // SAFETY: plain call.
    unsafe { hipSetDevice(0) }
}

macro_rules! cu {
    ($e:expr) => {{
        let c = ensure_current();
        if c != 0 {
            return c;
        }
        code($e)
    }};
}

/// `hipInit`: "no device" when no CUDA driver loads here.
#[no_mangle]
pub unsafe extern "C" fn hipInit(flags: c_uint) -> HipError {
    static ANNOUNCED: std::sync::Once = std::sync::Once::new();
    // Says in every run's output that the HIP runtime was this model, not ROCm.
    ANNOUNCED.call_once(|| eprintln!("hip-on-cuda: the HIP runtime is modelled over CUDA"));
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: plain call.
    code(unsafe { sys::cuInit(flags) })
}

/// `hipGetDeviceCount`.
#[no_mangle]
pub unsafe extern "C" fn hipGetDeviceCount(n: *mut c_int) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller passes a valid out-pointer.
    code(unsafe { sys::cuDeviceGetCount(n) })
}

/// `hipRuntimeGetVersion` (the driver's version).
#[no_mangle]
pub unsafe extern "C" fn hipRuntimeGetVersion(v: *mut c_int) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: as above.
    code(unsafe { sys::cuDriverGetVersion(v) })
}

/// `hipDriverGetVersion`.
#[no_mangle]
pub unsafe extern "C" fn hipDriverGetVersion(v: *mut c_int) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: as above.
    code(unsafe { sys::cuDriverGetVersion(v) })
}

/// `hipGetErrorString`: CUDA's message for the same code.
#[no_mangle]
pub unsafe extern "C" fn hipGetErrorString(e: HipError) -> *const c_char {
    let mut s: *const c_char = std::ptr::null();
    if !driver_present() {
        return c"hip-on-cuda: no CUDA driver here".as_ptr();
    }
    // Only codes CUDA defines are turned back into its enum.
    let known = [
        0, 1, 2, 3, 100, 101, 200, 201, 400, 500, 600, 700, 704, 719, 999,
    ];
    if known.contains(&e) {
        // SAFETY: `e` is one of CUresult's values; writes one static string pointer.
        let r: CUresult = unsafe { std::mem::transmute::<c_int, CUresult>(e) };
        // SAFETY: as above.
        unsafe { sys::cuGetErrorString(r, &mut s) };
    }
    if s.is_null() {
        c"hip-on-cuda: CUDA error".as_ptr()
    } else {
        s
    }
}

/// `hipSetDevice`: the device's primary context becomes current on this thread.
#[no_mangle]
pub unsafe extern "C" fn hipSetDevice(ordinal: c_int) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    match primary(ordinal) {
        // SAFETY: a retained primary context.
        Ok(ctx) => code(unsafe { sys::cuCtxSetCurrent(ctx) }),
        Err(e) => e,
    }
}

/// `hipMalloc`.
#[no_mangle]
pub unsafe extern "C" fn hipMalloc(p: *mut *mut c_void, n: usize) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    if n == 0 {
        // SAFETY: the caller passes a valid out-pointer.
        unsafe { *p = std::ptr::null_mut() };
        return 0;
    }
    // SAFETY: a CUdeviceptr is a u64, as is a pointer here.
    cu!(unsafe { sys::cuMemAlloc_v2(p.cast::<u64>(), n) })
}

/// `hipExtMallocWithFlags`: CUDA device memory is what HIP's fine-grained memory is for
/// (system-scope atomics and flags are coherent while kernels run), so the flags change nothing.
#[no_mangle]
pub unsafe extern "C" fn hipExtMallocWithFlags(
    p: *mut *mut c_void,
    n: usize,
    _f: c_uint,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: forwarded.
    unsafe { hipMalloc(p, n) }
}

/// `hipFree`.
#[no_mangle]
pub unsafe extern "C" fn hipFree(p: *mut c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    if p.is_null() {
        return 0;
    }
    // SAFETY: the caller frees its own allocation.
    cu!(unsafe { sys::cuMemFree_v2(p as u64) })
}

/// `hipMemcpy` (any direction: unified addressing).
#[no_mangle]
pub unsafe extern "C" fn hipMemcpy(
    d: *mut c_void,
    s: *const c_void,
    n: usize,
    _k: c_int,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller vouches for both ranges.
    cu!(unsafe { sys::cuMemcpy(d as u64, s as u64, n) })
}

/// `hipMemcpyAsync`.
#[no_mangle]
pub unsafe extern "C" fn hipMemcpyAsync(
    d: *mut c_void,
    s: *const c_void,
    n: usize,
    _k: c_int,
    st: *mut c_void,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: as above; the stream is the caller's.
    cu!(unsafe { sys::cuMemcpyAsync(d as u64, s as u64, n, st.cast()) })
}

/// `hipMemset`.
#[no_mangle]
pub unsafe extern "C" fn hipMemset(d: *mut c_void, v: c_int, n: usize) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's range.
    cu!(unsafe { sys::cuMemsetD8_v2(d as u64, v as u8, n) })
}

/// `hipStreamCreateWithFlags` (non-blocking is 1 in both).
#[no_mangle]
pub unsafe extern "C" fn hipStreamCreateWithFlags(s: *mut *mut c_void, f: c_uint) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: a valid out-pointer from the caller.
    cu!(unsafe { sys::cuStreamCreate(s.cast(), f) })
}

/// `hipStreamCreateWithPriority`.
#[no_mangle]
pub unsafe extern "C" fn hipStreamCreateWithPriority(
    s: *mut *mut c_void,
    f: c_uint,
    prio: c_int,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: as above.
    cu!(unsafe { sys::cuStreamCreateWithPriority(s.cast(), f, prio) })
}

/// `hipDeviceGetStreamPriorityRange`.
#[no_mangle]
pub unsafe extern "C" fn hipDeviceGetStreamPriorityRange(
    lo: *mut c_int,
    hi: *mut c_int,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: valid out-pointers.
    cu!(unsafe { sys::cuCtxGetStreamPriorityRange(lo, hi) })
}

/// `hipStreamDestroy`.
#[no_mangle]
pub unsafe extern "C" fn hipStreamDestroy(s: *mut c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's stream.
    cu!(unsafe { sys::cuStreamDestroy_v2(s.cast()) })
}

/// `hipStreamSynchronize`.
#[no_mangle]
pub unsafe extern "C" fn hipStreamSynchronize(s: *mut c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: as above.
    cu!(unsafe { sys::cuStreamSynchronize(s.cast()) })
}

/// `hipStreamWaitEvent`.
#[no_mangle]
pub unsafe extern "C" fn hipStreamWaitEvent(s: *mut c_void, e: *mut c_void, f: c_uint) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's stream and event.
    cu!(unsafe { sys::cuStreamWaitEvent(s.cast(), e.cast(), f) })
}

/// `hipStreamWaitValue64` with `hipStreamWaitValueGte` (0, as CUDA's GEQ) and a full mask.
#[no_mangle]
pub unsafe extern "C" fn hipStreamWaitValue64(
    s: *mut c_void,
    p: *mut c_void,
    v: u64,
    f: c_uint,
    mask: u64,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    if f != 0 || mask != u64::MAX {
        return INVALID_VALUE; // only what the engine uses is modelled
    }
    // SAFETY: the caller's stream and word.
    cu!(unsafe { sys::cuStreamWaitValue64_v2(s.cast(), p as u64, v, 0) })
}

/// `hipStreamIsCapturing` (statuses numbered alike).
#[no_mangle]
pub unsafe extern "C" fn hipStreamIsCapturing(s: *mut c_void, st: *mut c_int) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the caller's stream; writes one enum.
    let r = cu!(unsafe { sys::cuStreamIsCapturing(s.cast(), &mut status) });
    // SAFETY: a valid out-pointer.
    unsafe { *st = status as c_int };
    r
}

fn capture_mode(m: c_int) -> Option<sys::CUstreamCaptureMode> {
    use sys::CUstreamCaptureMode as M;
    Some(match m {
        0 => M::CU_STREAM_CAPTURE_MODE_GLOBAL,
        1 => M::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        2 => M::CU_STREAM_CAPTURE_MODE_RELAXED,
        _ => return None,
    })
}

/// `hipThreadExchangeStreamCaptureMode`.
#[no_mangle]
pub unsafe extern "C" fn hipThreadExchangeStreamCaptureMode(m: *mut c_int) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: a valid in/out pointer.
    let Some(mut mode) = capture_mode(unsafe { *m }) else {
        return INVALID_VALUE;
    };
    // SAFETY: exchanges this thread's mode.
    let r = code(unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) });
    // SAFETY: as above.
    unsafe { *m = mode as c_int };
    r
}

/// `hipStreamBeginCapture`.
#[no_mangle]
pub unsafe extern "C" fn hipStreamBeginCapture(s: *mut c_void, m: c_int) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    let Some(mode) = capture_mode(m) else {
        return INVALID_VALUE;
    };
    // SAFETY: the caller's stream.
    cu!(unsafe { sys::cuStreamBeginCapture_v2(s.cast(), mode) })
}

/// `hipStreamEndCapture`.
#[no_mangle]
pub unsafe extern "C" fn hipStreamEndCapture(s: *mut c_void, g: *mut *mut c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's stream; a valid out-pointer.
    cu!(unsafe { sys::cuStreamEndCapture(s.cast(), g.cast()) })
}

/// `hipGraphInstantiate` (no error node or log asked for by the engine).
#[no_mangle]
pub unsafe extern "C" fn hipGraphInstantiate(
    e: *mut *mut c_void,
    g: *mut c_void,
    _node: *mut c_void,
    _log: *mut c_char,
    _len: usize,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's graph; a valid out-pointer.
    cu!(unsafe { sys::cuGraphInstantiateWithFlags(e.cast(), g.cast(), 0) })
}

/// `hipGraphLaunch`.
#[no_mangle]
pub unsafe extern "C" fn hipGraphLaunch(e: *mut c_void, s: *mut c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's graph and stream.
    cu!(unsafe { sys::cuGraphLaunch(e.cast(), s.cast()) })
}

/// `hipGraphExecDestroy`.
#[no_mangle]
pub unsafe extern "C" fn hipGraphExecDestroy(e: *mut c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's graph.
    cu!(unsafe { sys::cuGraphExecDestroy(e.cast()) })
}

/// `hipGraphDestroy`.
#[no_mangle]
pub unsafe extern "C" fn hipGraphDestroy(g: *mut c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's graph.
    cu!(unsafe { sys::cuGraphDestroy(g.cast()) })
}

/// `hipEventCreateWithFlags` (disable-timing 2 and interprocess 4 in both).
#[no_mangle]
pub unsafe extern "C" fn hipEventCreateWithFlags(e: *mut *mut c_void, f: c_uint) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: a valid out-pointer.
    cu!(unsafe { sys::cuEventCreate(e.cast(), f) })
}

/// `hipEventDestroy`.
#[no_mangle]
pub unsafe extern "C" fn hipEventDestroy(e: *mut c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's event.
    cu!(unsafe { sys::cuEventDestroy_v2(e.cast()) })
}

/// `hipEventRecord`.
#[no_mangle]
pub unsafe extern "C" fn hipEventRecord(e: *mut c_void, s: *mut c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's event and stream.
    cu!(unsafe { sys::cuEventRecord(e.cast(), s.cast()) })
}

/// `hipEventQuery` (not-ready is 600 in both).
#[no_mangle]
pub unsafe extern "C" fn hipEventQuery(e: *mut c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's event.
    cu!(unsafe { sys::cuEventQuery(e.cast()) })
}

/// `hipEventSynchronize`.
#[no_mangle]
pub unsafe extern "C" fn hipEventSynchronize(e: *mut c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's event.
    cu!(unsafe { sys::cuEventSynchronize(e.cast()) })
}

/// `hipIpcMemHandle_t`, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IpcHandle {
    reserved: [u8; 64],
}

/// `hipIpcGetMemHandle`.
#[no_mangle]
pub unsafe extern "C" fn hipIpcGetMemHandle(h: *mut IpcHandle, p: *mut c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: CUipcMemHandle is the same 64 bytes; the caller's allocation.
    cu!(unsafe { sys::cuIpcGetMemHandle(h.cast(), p as u64) })
}

/// `hipIpcOpenMemHandle` (lazy peer access is 1 in both).
#[no_mangle]
pub unsafe extern "C" fn hipIpcOpenMemHandle(
    p: *mut *mut c_void,
    h: IpcHandle,
    f: c_uint,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    let handle = sys::CUipcMemHandle_st {
        reserved: h.reserved.map(|b| b as c_char),
    };
    // SAFETY: a valid out-pointer; the handle came from a peer's hipIpcGetMemHandle.
    cu!(unsafe { sys::cuIpcOpenMemHandle_v2(p.cast(), handle, f) })
}

/// `hipIpcCloseMemHandle`.
#[no_mangle]
pub unsafe extern "C" fn hipIpcCloseMemHandle(p: *mut c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's mapping.
    cu!(unsafe { sys::cuIpcCloseMemHandle(p as u64) })
}
