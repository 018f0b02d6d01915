//! hiprtc over NVRTC: a program is compiled for the current NVIDIA device by the engine's own
//! NVRTC path (kernels compiled ahead of time into this build, the disk cache, else NVRTC), so
//! `--offload-arch=` is read and ignored. The source is the engine's single kernel source, so
//! under NVRTC its CUDA branch of `gpu_compat.cuh` compiles, not its HIP branch.

use std::ffi::{c_char, c_int, CStr};

use cudarc::driver::sys;

use crate::runtime::ensure_current;

/// `hiprtcResult`.
pub type RtcResult = c_int;
const RTC_INVALID_INPUT: RtcResult = 3;
const RTC_INVALID_PROGRAM: RtcResult = 4;
const RTC_COMPILATION: RtcResult = 6;

/// A program: its source and name, then its code or its log.
struct Program {
    name: String,
    source: String,
    code: Vec<u8>,
    log: Vec<u8>,
}

/// `hiprtcVersion`: NVRTC's version.
#[no_mangle]
pub unsafe extern "C" fn hiprtcVersion(major: *mut c_int, minor: *mut c_int) -> RtcResult {
    let (a, b) = torchcomms_cuda::nvrtc::nvrtc().map_or((0, 0), |n| n.version);
    // SAFETY: valid out-pointers from the caller.
    unsafe {
        *major = a;
        *minor = b;
    }
    0
}

/// `hiprtcGetErrorString`.
#[no_mangle]
pub unsafe extern "C" fn hiprtcGetErrorString(r: RtcResult) -> *const c_char {
    match r {
        0 => c"HIPRTC_SUCCESS".as_ptr(),
        RTC_COMPILATION => c"HIPRTC_ERROR_COMPILATION (hip-on-cuda: NVRTC)".as_ptr(),
        _ => c"HIPRTC_ERROR (hip-on-cuda)".as_ptr(),
    }
}

/// `hiprtcCreateProgram` (no headers: the engine's sources are whole).
#[no_mangle]
pub unsafe extern "C" fn hiprtcCreateProgram(
    prog: *mut *mut std::ffi::c_void,
    src: *const c_char,
    name: *const c_char,
    num_headers: c_int,
    _headers: *const *const c_char,
    _names: *const *const c_char,
) -> RtcResult {
    if src.is_null() || num_headers != 0 {
        return RTC_INVALID_INPUT;
    }
    // SAFETY: NUL-terminated strings from the caller.
    let text = |p: *const c_char| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    let p = Box::new(Program {
        name: if name.is_null() {
            "hiprtc".into()
        } else {
            text(name)
        },
        source: text(src),
        code: Vec::new(),
        log: vec![0],
    });
    // SAFETY: a valid out-pointer.
    unsafe { *prog = Box::into_raw(p).cast() };
    0
}

fn program<'a>(p: *mut std::ffi::c_void) -> Option<&'a mut Program> {
    // SAFETY: every handle the engine passes came from hiprtcCreateProgram and lives until
    // hiprtcDestroyProgram; one thread uses a program at a time.
    unsafe { p.cast::<Program>().as_mut() }
}

/// `hiprtcCompileProgram`: compiled for the current device's compute capability.
#[no_mangle]
pub unsafe extern "C" fn hiprtcCompileProgram(
    prog: *mut std::ffi::c_void,
    _n: c_int,
    _opts: *const *const c_char,
) -> RtcResult {
    let Some(p) = program(prog) else {
        return RTC_INVALID_PROGRAM;
    };
    match compile(p) {
        Ok(code) => {
            p.code = code;
            0
        }
        Err(log) => {
            p.log = log.into_bytes();
            p.log.push(0);
            RTC_COMPILATION
        }
    }
}

fn compile(p: &Program) -> Result<Vec<u8>, String> {
    if ensure_current() != 0 {
        return Err("hip-on-cuda: no current CUDA device".into());
    }
    let (mut dev, mut major, mut minor, mut version) = (0, 0, 0, 0);
    use sys::CUdevice_attribute as A;
    // SAFETY: valid out-pointers; the device is the current context's.
    let ok = unsafe {
        sys::cuCtxGetDevice(&mut dev) == sys::CUresult::CUDA_SUCCESS
            && sys::cuDeviceGetAttribute(
                &mut major,
                A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                dev,
            ) == sys::CUresult::CUDA_SUCCESS
            && sys::cuDeviceGetAttribute(
                &mut minor,
                A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                dev,
            ) == sys::CUresult::CUDA_SUCCESS
            && sys::cuDriverGetVersion(&mut version) == sys::CUresult::CUDA_SUCCESS
    };
    if !ok {
        return Err("hip-on-cuda: cannot read the current device".into());
    }
    torchcomms_cuda::nvrtc::compile(&p.name, &p.source, (major, minor), version)
        .map(|image| image.bytes)
        .map_err(|e| e.to_string())
}

/// `hiprtcGetProgramLogSize`.
#[no_mangle]
pub unsafe extern "C" fn hiprtcGetProgramLogSize(
    prog: *mut std::ffi::c_void,
    n: *mut usize,
) -> RtcResult {
    let Some(p) = program(prog) else {
        return RTC_INVALID_PROGRAM;
    };
    // SAFETY: a valid out-pointer.
    unsafe { *n = p.log.len() };
    0
}

/// `hiprtcGetProgramLog`.
#[no_mangle]
pub unsafe extern "C" fn hiprtcGetProgramLog(
    prog: *mut std::ffi::c_void,
    out: *mut c_char,
) -> RtcResult {
    let Some(p) = program(prog) else {
        return RTC_INVALID_PROGRAM;
    };
    // SAFETY: the caller's buffer holds the size hiprtcGetProgramLogSize gave.
    unsafe { std::ptr::copy_nonoverlapping(p.log.as_ptr(), out.cast(), p.log.len()) };
    0
}

/// `hiprtcGetCodeSize`.
#[no_mangle]
pub unsafe extern "C" fn hiprtcGetCodeSize(
    prog: *mut std::ffi::c_void,
    n: *mut usize,
) -> RtcResult {
    let Some(p) = program(prog) else {
        return RTC_INVALID_PROGRAM;
    };
    // SAFETY: a valid out-pointer.
    unsafe { *n = p.code.len() };
    0
}

/// `hiprtcGetCode`.
#[no_mangle]
pub unsafe extern "C" fn hiprtcGetCode(prog: *mut std::ffi::c_void, out: *mut c_char) -> RtcResult {
    let Some(p) = program(prog) else {
        return RTC_INVALID_PROGRAM;
    };
    // SAFETY: the caller's buffer holds the size hiprtcGetCodeSize gave.
    unsafe { std::ptr::copy_nonoverlapping(p.code.as_ptr(), out.cast(), p.code.len()) };
    0
}

/// `hiprtcDestroyProgram`.
#[no_mangle]
pub unsafe extern "C" fn hiprtcDestroyProgram(prog: *mut *mut std::ffi::c_void) -> RtcResult {
    // SAFETY: a valid in/out pointer to a handle from hiprtcCreateProgram.
    let raw = unsafe { *prog };
    if raw.is_null() {
        return RTC_INVALID_PROGRAM;
    }
    // SAFETY: created by Box::into_raw above, destroyed once.
    drop(unsafe { Box::from_raw(raw.cast::<Program>()) });
    // SAFETY: as above.
    unsafe { *prog = std::ptr::null_mut() };
    0
}
