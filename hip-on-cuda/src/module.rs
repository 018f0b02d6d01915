//! Code objects and launches of the HIP runtime, over the CUDA driver: what hiprtc produced
//! here is a CUBIN (see [`crate::rtc`]).

use std::ffi::{c_char, c_uint, c_void};

use cudarc::driver::sys;

use crate::runtime::{code, driver_present, ensure_current, HipError, NO_DEVICE};

/// `hipModuleLoadData`.
#[no_mangle]
pub unsafe extern "C" fn hipModuleLoadData(m: *mut *mut c_void, image: *const c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    let c = ensure_current();
    if c != 0 {
        return c;
    }
    // SAFETY: a valid out-pointer; the image is a CUBIN from our hiprtc.
    code(unsafe { sys::cuModuleLoadData(m.cast(), image) })
}

/// `hipModuleUnload`.
#[no_mangle]
pub unsafe extern "C" fn hipModuleUnload(m: *mut c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's module.
    code(unsafe { sys::cuModuleUnload(m.cast()) })
}

/// `hipModuleGetFunction`.
#[no_mangle]
pub unsafe extern "C" fn hipModuleGetFunction(
    f: *mut *mut c_void,
    m: *mut c_void,
    name: *const c_char,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: a valid out-pointer, the caller's module, a NUL-terminated name.
    code(unsafe { sys::cuModuleGetFunction(f.cast(), m.cast(), name) })
}

/// `hipModuleLaunchKernel` (the same argument array as `cuLaunchKernel`).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hipModuleLaunchKernel(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    s: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: forwarded from the caller, who vouches for the kernel's arguments.
    code(unsafe {
        sys::cuLaunchKernel(
            f.cast(),
            gx,
            gy,
            gz,
            bx,
            by,
            bz,
            shared,
            s.cast(),
            params,
            extra,
        )
    })
}
