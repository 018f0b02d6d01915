//! Raw declarations of the few HIP runtime and hiprtc functions this project calls, looked up
//! once at run time. Nothing here is safe to call without reading HIP's documentation of it;
//! [`crate::runtime`] and [`crate::rtc`] wrap them.
//!
//! Why not a crate: `hip-sys`/`hip-runtime-sys` (0.1, last released 2023) and `cubecl-hip-sys`
//! (bindgen output per HIP version) both link `libamdhip64` when the crate is built, so building
//! them needs ROCm installed, and a binary built with them does not start on a machine without
//! it. We need the opposite (one wheel for every machine, ROCm found at run time), and only a
//! few dozen functions whose C signatures have been stable since ROCm 5.0, so they are
//! declared here, as NCCL's `ibvsymbols.cc` declares verbs.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::error::{HipError, Result};

/// `hipError_t`.
pub type HipStatus = c_int;
/// `hipSuccess`.
pub const HIP_SUCCESS: HipStatus = 0;
/// `hipErrorNoDevice`: the runtime found no AMD GPU.
pub const HIP_ERROR_NO_DEVICE: HipStatus = 100;
/// `hipErrorInvalidDevice`.
pub const HIP_ERROR_INVALID_DEVICE: HipStatus = 101;
/// `hipErrorNotReady`: an event or stream still has work pending.
pub const HIP_ERROR_NOT_READY: HipStatus = 600;
/// `hiprtcResult`.
pub type RtcStatus = c_int;
/// `HIPRTC_SUCCESS`.
pub const HIPRTC_SUCCESS: RtcStatus = 0;

/// `hipStream_t` (an opaque pointer).
pub type HipStream = *mut c_void;
/// `hipEvent_t`.
pub type HipEvent = *mut c_void;
/// `hipModule_t`.
pub type HipModule = *mut c_void;
/// `hipFunction_t`.
pub type HipFunction = *mut c_void;
/// `hiprtcProgram`.
pub type RtcProgram = *mut c_void;
/// `hipGraph_t`.
pub type HipGraph = *mut c_void;
/// `hipGraphExec_t`.
pub type HipGraphExec = *mut c_void;

/// `hipStreamNonBlocking`: the stream does not synchronise with the null stream.
pub const HIP_STREAM_NON_BLOCKING: c_uint = 1;
/// `hipEventDisableTiming`.
pub const HIP_EVENT_DISABLE_TIMING: c_uint = 2;
/// `hipEventInterprocess` (needs `hipEventDisableTiming`).
pub const HIP_EVENT_INTERPROCESS: c_uint = 4;
/// `hipIpcMemLazyEnablePeerAccess`.
pub const HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;
/// `hipMemcpyHostToDevice`.
pub const HIP_MEMCPY_HOST_TO_DEVICE: c_int = 1;
/// `hipMemcpyDeviceToHost`.
pub const HIP_MEMCPY_DEVICE_TO_HOST: c_int = 2;
/// `hipMemcpyDefault` (direction from the pointers; unified addressing).
pub const HIP_MEMCPY_DEFAULT: c_int = 4;

/// `hipErrorPeerAccessAlreadyEnabled`.
pub const HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED: HipStatus = 704;
/// `hipHostMallocPortable | hipHostMallocMapped`: pinned memory every device sees, mapped
/// into their address spaces.
pub const HIP_HOST_MALLOC_PORTABLE_MAPPED: c_uint = 0x1 | 0x2;
/// `hipDeviceMallocFinegrained` (`hipExtMallocWithFlags`).
pub const HIP_DEVICE_MALLOC_FINEGRAINED: c_uint = 0x1;
/// `hipStreamWaitValueGte`: wait until `*ptr & mask >= value`.
pub const HIP_STREAM_WAIT_VALUE_GTE: c_uint = 0;
/// `HIP_POINTER_ATTRIBUTE_BUFFER_ID`: an allocation's unique id.
pub const HIP_POINTER_ATTRIBUTE_BUFFER_ID: c_int = 7;
/// `hipDeviceAttributeComputeCapabilityMajor` (values of `hipDeviceAttribute_t` as ROCm
/// 5.2's headers number them; checked against no other version).
pub const HIP_DEVICE_ATTRIBUTE_CC_MAJOR: c_int = 23;
/// `hipDeviceAttributeComputeCapabilityMinor`.
pub const HIP_DEVICE_ATTRIBUTE_CC_MINOR: c_int = 61;
/// `hipDeviceAttributeMultiprocessorCount` (compute units).
pub const HIP_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 63;

/// `hipStreamCaptureStatusNone`: the stream is not being captured.
pub const HIP_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
/// `hipStreamCaptureModeGlobal`.
pub const HIP_STREAM_CAPTURE_MODE_GLOBAL: c_int = 0;
/// `hipStreamCaptureModeThreadLocal`.
pub const HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;
/// `hipStreamCaptureModeRelaxed`.
pub const HIP_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;

/// `HIP_IPC_HANDLE_SIZE`.
pub const HIP_IPC_HANDLE_SIZE: usize = 64;
/// `hipIpcMemHandle_t`: 64 opaque bytes, passed by value to `hipIpcOpenMemHandle`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HipIpcMemHandle {
    /// The bytes another process of the host opens.
    pub reserved: [u8; HIP_IPC_HANDLE_SIZE],
}

/// The HIP runtime's functions this project calls (all required).
#[allow(non_snake_case, missing_docs)]
#[derive(Debug)]
pub struct Hip {
    /// Where the library was loaded from.
    pub path: PathBuf,
    pub hipInit: unsafe extern "C" fn(c_uint) -> HipStatus,
    pub hipGetDeviceCount: unsafe extern "C" fn(*mut c_int) -> HipStatus,
    pub hipRuntimeGetVersion: unsafe extern "C" fn(*mut c_int) -> HipStatus,
    pub hipGetErrorString: unsafe extern "C" fn(HipStatus) -> *const c_char,
    pub hipSetDevice: unsafe extern "C" fn(c_int) -> HipStatus,
    pub hipMalloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipStatus,
    pub hipFree: unsafe extern "C" fn(*mut c_void) -> HipStatus,
    pub hipMemcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> HipStatus,
    pub hipMemcpyAsync:
        unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, HipStream) -> HipStatus,
    pub hipStreamCreateWithFlags: unsafe extern "C" fn(*mut HipStream, c_uint) -> HipStatus,
    pub hipStreamDestroy: unsafe extern "C" fn(HipStream) -> HipStatus,
    pub hipStreamSynchronize: unsafe extern "C" fn(HipStream) -> HipStatus,
    pub hipStreamWaitEvent: unsafe extern "C" fn(HipStream, HipEvent, c_uint) -> HipStatus,
    pub hipEventCreateWithFlags: unsafe extern "C" fn(*mut HipEvent, c_uint) -> HipStatus,
    pub hipEventDestroy: unsafe extern "C" fn(HipEvent) -> HipStatus,
    pub hipEventRecord: unsafe extern "C" fn(HipEvent, HipStream) -> HipStatus,
    pub hipEventQuery: unsafe extern "C" fn(HipEvent) -> HipStatus,
    pub hipEventSynchronize: unsafe extern "C" fn(HipEvent) -> HipStatus,
    pub hipIpcGetMemHandle: unsafe extern "C" fn(*mut HipIpcMemHandle, *mut c_void) -> HipStatus,
    pub hipIpcOpenMemHandle:
        unsafe extern "C" fn(*mut *mut c_void, HipIpcMemHandle, c_uint) -> HipStatus,
    pub hipIpcCloseMemHandle: unsafe extern "C" fn(*mut c_void) -> HipStatus,
    pub hipModuleLoadData: unsafe extern "C" fn(*mut HipModule, *const c_void) -> HipStatus,
    pub hipModuleUnload: unsafe extern "C" fn(HipModule) -> HipStatus,
    pub hipModuleGetFunction:
        unsafe extern "C" fn(*mut HipFunction, HipModule, *const c_char) -> HipStatus,
    #[allow(clippy::type_complexity)]
    pub hipModuleLaunchKernel: unsafe extern "C" fn(
        HipFunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        HipStream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipStatus,
    pub hipStreamCreateWithPriority:
        unsafe extern "C" fn(*mut HipStream, c_uint, c_int) -> HipStatus,
    pub hipDeviceGetStreamPriorityRange: unsafe extern "C" fn(*mut c_int, *mut c_int) -> HipStatus,
    pub hipStreamIsCapturing: unsafe extern "C" fn(HipStream, *mut c_int) -> HipStatus,
    pub hipThreadExchangeStreamCaptureMode: unsafe extern "C" fn(*mut c_int) -> HipStatus,
    pub hipMemset: unsafe extern "C" fn(*mut c_void, c_int, usize) -> HipStatus,
    pub hipDriverGetVersion: unsafe extern "C" fn(*mut c_int) -> HipStatus,
    pub hipExtMallocWithFlags: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> HipStatus,
    pub hipDeviceGetAttribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> HipStatus,
    pub hipDeviceGetName: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipStatus,
    pub hipDeviceGetPCIBusId: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipStatus,
    pub hipDeviceGetByPCIBusId: unsafe extern "C" fn(*mut c_int, *const c_char) -> HipStatus,
    pub hipDeviceCanAccessPeer: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> HipStatus,
    pub hipDeviceEnablePeerAccess: unsafe extern "C" fn(c_int, c_uint) -> HipStatus,
    pub hipMemGetInfo: unsafe extern "C" fn(*mut usize, *mut usize) -> HipStatus,
    pub hipMemGetAddressRange:
        unsafe extern "C" fn(*mut *mut c_void, *mut usize, *mut c_void) -> HipStatus,
    pub hipPointerGetAttribute: unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> HipStatus,
    pub hipHostMalloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> HipStatus,
    pub hipHostFree: unsafe extern "C" fn(*mut c_void) -> HipStatus,
    pub hipHostGetDevicePointer:
        unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_uint) -> HipStatus,
    pub hipMemcpyPeerAsync: unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *const c_void,
        c_int,
        usize,
        HipStream,
    ) -> HipStatus,
    pub hipStreamWaitValue64:
        unsafe extern "C" fn(HipStream, *mut c_void, u64, c_uint, u64) -> HipStatus,
    pub hipStreamBeginCapture: unsafe extern "C" fn(HipStream, c_int) -> HipStatus,
    pub hipStreamEndCapture: unsafe extern "C" fn(HipStream, *mut HipGraph) -> HipStatus,
    pub hipGraphInstantiate: unsafe extern "C" fn(
        *mut HipGraphExec,
        HipGraph,
        *mut c_void,
        *mut c_char,
        usize,
    ) -> HipStatus,
    pub hipGraphLaunch: unsafe extern "C" fn(HipGraphExec, HipStream) -> HipStatus,
    pub hipGraphExecDestroy: unsafe extern "C" fn(HipGraphExec) -> HipStatus,
    pub hipGraphDestroy: unsafe extern "C" fn(HipGraph) -> HipStatus,
    /// Kept loaded as long as the pointers above are used (the table lives in a static).
    _lib: libloading::Library,
}

/// hiprtc's functions (a library of its own from ROCm 6; inside `libamdhip64` before).
#[allow(non_snake_case, missing_docs)]
#[derive(Debug)]
pub struct Rtc {
    /// Where the library was loaded from.
    pub path: PathBuf,
    pub hiprtcVersion: unsafe extern "C" fn(*mut c_int, *mut c_int) -> RtcStatus,
    pub hiprtcGetErrorString: unsafe extern "C" fn(RtcStatus) -> *const c_char,
    pub hiprtcCreateProgram: unsafe extern "C" fn(
        *mut RtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> RtcStatus,
    pub hiprtcCompileProgram:
        unsafe extern "C" fn(RtcProgram, c_int, *const *const c_char) -> RtcStatus,
    pub hiprtcGetProgramLogSize: unsafe extern "C" fn(RtcProgram, *mut usize) -> RtcStatus,
    pub hiprtcGetProgramLog: unsafe extern "C" fn(RtcProgram, *mut c_char) -> RtcStatus,
    pub hiprtcGetCodeSize: unsafe extern "C" fn(RtcProgram, *mut usize) -> RtcStatus,
    pub hiprtcGetCode: unsafe extern "C" fn(RtcProgram, *mut c_char) -> RtcStatus,
    pub hiprtcDestroyProgram: unsafe extern "C" fn(*mut RtcProgram) -> RtcStatus,
    _lib: libloading::Library,
}

/// File names of the HIP runtime, newest first (ROCm 7, 6, 5).
const HIP_NAMES: &[&str] = &[
    "libamdhip64.so",
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
];
/// File names of hiprtc; ROCm 5 has none (hiprtc is inside `libamdhip64`, tried last).
const RTC_NAMES: &[&str] = &["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6"];

/// The HIP runtime, loaded at the first call; the error is kept and returned to every caller.
pub fn hip() -> Result<&'static Hip> {
    static HIP: OnceLock<Result<Hip>> = OnceLock::new();
    HIP.get_or_init(|| {
        let cv = torchcomms_cvars::current();
        let (path, lib) = open("libamdhip64", cv.torchcomms_hip_lib(), HIP_NAMES)?;
        load_hip(path, lib)
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// hiprtc, loaded at the first call: `libhiprtc` (ROCm 6 and later), else the HIP runtime
/// itself (ROCm 5 exports hiprtc from `libamdhip64`).
pub fn rtc() -> Result<&'static Rtc> {
    static RTC: OnceLock<Result<Rtc>> = OnceLock::new();
    RTC.get_or_init(|| {
        let cv = torchcomms_cvars::current();
        let (path, lib) = match open("libhiprtc", cv.torchcomms_hiprtc_lib(), RTC_NAMES) {
            Ok(found) => found,
            Err(rtc_err) => {
                open("libamdhip64", cv.torchcomms_hip_lib(), HIP_NAMES).map_err(|_| rtc_err)?
            }
        };
        load_rtc(path, lib)
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Paths to try: the override (a file, or a folder holding one of `names`), the folders of
/// `LD_LIBRARY_PATH`, `$ROCM_PATH/lib`, `$HIP_PATH/lib`, ROCm's default prefix `/opt/rocm/lib`,
/// then the bare names for the system loader (Debian's packages are found this way).
pub fn candidates(override_path: Option<&str>, names: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(override_path) = override_path.filter(|p| !p.is_empty()) {
        let p = PathBuf::from(override_path);
        if p.is_dir() {
            out.extend(names.iter().map(|n| p.join(n)).filter(|f| f.exists()));
        } else {
            out.push(p);
        }
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    // LD_LIBRARY_PATH, ROCM_PATH and HIP_PATH describe the machine's installation (set by the
    // system or ROCm's scripts): inputs read directly; our own knobs are cvars.
    if let Some(v) = std::env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&v));
    }
    for var in ["ROCM_PATH", "HIP_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            dirs.push(PathBuf::from(root).join("lib"));
        }
    }
    dirs.push(PathBuf::from("/opt/rocm/lib"));
    for d in dirs.iter().filter(|d| d.is_dir()) {
        out.extend(names.iter().map(|n| d.join(n)).filter(|f| f.exists()));
    }
    out.extend(names.iter().map(PathBuf::from));
    out
}

/// Opens the first candidate of [`candidates`] that loads: how every ROCm library is found
/// (the HIP runtime, hiprtc, and RCCL for the `rccl` backend).
pub fn open(
    label: &str,
    override_path: Option<&str>,
    names: &[&str],
) -> Result<(PathBuf, libloading::Library)> {
    let cands = candidates(override_path, names);
    let mut reason = String::from("no candidate");
    for c in &cands {
        // SAFETY: loading runs the library's initialisers; ROCm's libraries are meant to be
        // dlopen'ed (PyTorch's ROCm wheels and RCCL's tools load them this way).
        match unsafe { libloading::Library::new(c) } {
            Ok(lib) => {
                tracing::debug!(label, path = %c.display(), "loaded");
                return Ok((c.clone(), lib));
            }
            // libloading's message is "dlopen failed"; dlerror's text is its source.
            Err(e) => {
                reason = match std::error::Error::source(&e) {
                    Some(src) => src.to_string(),
                    None => e.to_string(),
                }
            }
        }
    }
    Err(HipError::LibraryNotFound {
        lib: label.into(),
        reason,
        searched: cands
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Looks one function up; a missing symbol is an error value, never a panic.
///
/// # Safety
/// `T` must be the function pointer type of the C declaration of `name` in HIP's headers.
unsafe fn sym<T: Copy>(
    lib: &libloading::Library,
    path: &std::path::Path,
    name: &'static str,
) -> Result<T> {
    let cname = format!("{name}\0");
    // SAFETY: the caller guarantees that `T` is the symbol's type.
    match unsafe { lib.get::<T>(cname.as_bytes()) } {
        Ok(s) => Ok(*s),
        Err(_) => Err(HipError::MissingSymbol {
            lib: "libamdhip64/libhiprtc".into(),
            path: path.display().to_string(),
            symbol: name,
        }),
    }
}

fn load_hip(path: PathBuf, lib: libloading::Library) -> Result<Hip> {
    macro_rules! s {
        ($n:ident) => {
            // SAFETY: the field's type is the C declaration of the symbol of the same name
            // (hip/hip_runtime_api.h, unchanged since ROCm 5.0).
            unsafe { sym(&lib, &path, stringify!($n))? }
        };
    }
    Ok(Hip {
        hipInit: s!(hipInit),
        hipGetDeviceCount: s!(hipGetDeviceCount),
        hipRuntimeGetVersion: s!(hipRuntimeGetVersion),
        hipGetErrorString: s!(hipGetErrorString),
        hipSetDevice: s!(hipSetDevice),
        hipMalloc: s!(hipMalloc),
        hipFree: s!(hipFree),
        hipMemcpy: s!(hipMemcpy),
        hipMemcpyAsync: s!(hipMemcpyAsync),
        hipStreamCreateWithFlags: s!(hipStreamCreateWithFlags),
        hipStreamDestroy: s!(hipStreamDestroy),
        hipStreamSynchronize: s!(hipStreamSynchronize),
        hipStreamWaitEvent: s!(hipStreamWaitEvent),
        hipEventCreateWithFlags: s!(hipEventCreateWithFlags),
        hipEventDestroy: s!(hipEventDestroy),
        hipEventRecord: s!(hipEventRecord),
        hipEventQuery: s!(hipEventQuery),
        hipEventSynchronize: s!(hipEventSynchronize),
        hipIpcGetMemHandle: s!(hipIpcGetMemHandle),
        hipIpcOpenMemHandle: s!(hipIpcOpenMemHandle),
        hipIpcCloseMemHandle: s!(hipIpcCloseMemHandle),
        hipModuleLoadData: s!(hipModuleLoadData),
        hipModuleUnload: s!(hipModuleUnload),
        hipModuleGetFunction: s!(hipModuleGetFunction),
        hipModuleLaunchKernel: s!(hipModuleLaunchKernel),
        hipStreamCreateWithPriority: s!(hipStreamCreateWithPriority),
        hipDeviceGetStreamPriorityRange: s!(hipDeviceGetStreamPriorityRange),
        hipStreamIsCapturing: s!(hipStreamIsCapturing),
        hipThreadExchangeStreamCaptureMode: s!(hipThreadExchangeStreamCaptureMode),
        hipMemset: s!(hipMemset),
        hipDriverGetVersion: s!(hipDriverGetVersion),
        hipExtMallocWithFlags: s!(hipExtMallocWithFlags),
        hipDeviceGetAttribute: s!(hipDeviceGetAttribute),
        hipDeviceGetName: s!(hipDeviceGetName),
        hipDeviceGetPCIBusId: s!(hipDeviceGetPCIBusId),
        hipDeviceGetByPCIBusId: s!(hipDeviceGetByPCIBusId),
        hipDeviceCanAccessPeer: s!(hipDeviceCanAccessPeer),
        hipDeviceEnablePeerAccess: s!(hipDeviceEnablePeerAccess),
        hipMemGetInfo: s!(hipMemGetInfo),
        hipMemGetAddressRange: s!(hipMemGetAddressRange),
        hipPointerGetAttribute: s!(hipPointerGetAttribute),
        hipHostMalloc: s!(hipHostMalloc),
        hipHostFree: s!(hipHostFree),
        hipHostGetDevicePointer: s!(hipHostGetDevicePointer),
        hipMemcpyPeerAsync: s!(hipMemcpyPeerAsync),
        hipStreamWaitValue64: s!(hipStreamWaitValue64),
        hipStreamBeginCapture: s!(hipStreamBeginCapture),
        hipStreamEndCapture: s!(hipStreamEndCapture),
        hipGraphInstantiate: s!(hipGraphInstantiate),
        hipGraphLaunch: s!(hipGraphLaunch),
        hipGraphExecDestroy: s!(hipGraphExecDestroy),
        hipGraphDestroy: s!(hipGraphDestroy),
        path,
        _lib: lib,
    })
}

fn load_rtc(path: PathBuf, lib: libloading::Library) -> Result<Rtc> {
    macro_rules! s {
        ($n:ident) => {
            // SAFETY: the field's type is the C declaration of the symbol of the same name
            // (hip/hiprtc.h, unchanged since ROCm 5.0).
            unsafe { sym(&lib, &path, stringify!($n))? }
        };
    }
    Ok(Rtc {
        hiprtcVersion: s!(hiprtcVersion),
        hiprtcGetErrorString: s!(hiprtcGetErrorString),
        hiprtcCreateProgram: s!(hiprtcCreateProgram),
        hiprtcCompileProgram: s!(hiprtcCompileProgram),
        hiprtcGetProgramLogSize: s!(hiprtcGetProgramLogSize),
        hiprtcGetProgramLog: s!(hiprtcGetProgramLog),
        hiprtcGetCodeSize: s!(hiprtcGetCodeSize),
        hiprtcGetCode: s!(hiprtcGetCode),
        hiprtcDestroyProgram: s!(hiprtcDestroyProgram),
        path,
        _lib: lib,
    })
}

/// `hipGetErrorString(code)` as text.
pub fn error_string(hip: &Hip, code: HipStatus) -> String {
    // SAFETY: hipGetErrorString takes any value and returns a static NUL-terminated string (or
    // null, handled).
    let p = unsafe { (hip.hipGetErrorString)(code) };
    if p.is_null() {
        return format!("hipError_t {code}");
    }
    // SAFETY: non-null, NUL-terminated and static (HIP's table of messages).
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// A HIP status as a `Result`.
pub fn check(hip: &Hip, call: &'static str, code: HipStatus) -> Result<()> {
    if code == HIP_SUCCESS {
        Ok(())
    } else {
        Err(HipError::Runtime {
            call,
            code,
            message: error_string(hip, code),
        })
    }
}
