//! Devices, host memory and pointer queries of the HIP runtime, over the CUDA driver.

use std::ffi::{c_char, c_int, c_uint, c_void};

use cudarc::driver::sys;

use crate::runtime::{
    code, driver_present, ensure_current, primary, HipError, INVALID_VALUE, NO_DEVICE,
};

/// `hipDeviceGetAttribute` for the attributes the engine asks (ROCm 5.2's numbering).
#[no_mangle]
pub unsafe extern "C" fn hipDeviceGetAttribute(v: *mut c_int, attr: c_int, dev: c_int) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    use sys::CUdevice_attribute as A;
    let a = match attr {
        23 => A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        61 => A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        63 => A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        _ => return INVALID_VALUE,
    };
    // SAFETY: a valid out-pointer; the driver checks the device.
    code(unsafe { sys::cuDeviceGetAttribute(v, a, dev) })
}

/// `hipDeviceGetName`.
#[no_mangle]
pub unsafe extern "C" fn hipDeviceGetName(buf: *mut c_char, len: c_int, dev: c_int) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's buffer of `len` bytes.
    code(unsafe { sys::cuDeviceGetName(buf, len, dev) })
}

/// `hipDeviceGetPCIBusId`.
#[no_mangle]
pub unsafe extern "C" fn hipDeviceGetPCIBusId(
    buf: *mut c_char,
    len: c_int,
    dev: c_int,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: as above.
    code(unsafe { sys::cuDeviceGetPCIBusId(buf, len, dev) })
}

/// `hipDeviceGetByPCIBusId`.
#[no_mangle]
pub unsafe extern "C" fn hipDeviceGetByPCIBusId(dev: *mut c_int, id: *const c_char) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: a valid out-pointer and a NUL-terminated id.
    code(unsafe { sys::cuDeviceGetByPCIBusId(dev, id) })
}

/// `hipDeviceCanAccessPeer`.
#[no_mangle]
pub unsafe extern "C" fn hipDeviceCanAccessPeer(
    ok: *mut c_int,
    dev: c_int,
    peer: c_int,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: a valid out-pointer.
    code(unsafe { sys::cuDeviceCanAccessPeer(ok, dev, peer) })
}

/// `hipDeviceEnablePeerAccess`: the current device reaches `peer` (already enabled is 704 in
/// both).
#[no_mangle]
pub unsafe extern "C" fn hipDeviceEnablePeerAccess(peer: c_int, _f: c_uint) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    let c = ensure_current();
    if c != 0 {
        return c;
    }
    match primary(peer) {
        // SAFETY: a retained primary context.
        Ok(ctx) => code(unsafe { sys::cuCtxEnablePeerAccess(ctx, 0) }),
        Err(e) => e,
    }
}

/// `hipMemGetInfo`.
#[no_mangle]
pub unsafe extern "C" fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    let c = ensure_current();
    if c != 0 {
        return c;
    }
    // SAFETY: valid out-pointers.
    code(unsafe { sys::cuMemGetInfo_v2(free, total) })
}

/// `hipMemGetAddressRange`.
#[no_mangle]
pub unsafe extern "C" fn hipMemGetAddressRange(
    base: *mut *mut c_void,
    size: *mut usize,
    p: *mut c_void,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    let c = ensure_current();
    if c != 0 {
        return c;
    }
    // SAFETY: valid out-pointers (a device pointer is a u64 here).
    code(unsafe { sys::cuMemGetAddressRange_v2(base.cast(), size, p as u64) })
}

/// `hipPointerGetAttribute` for `HIP_POINTER_ATTRIBUTE_BUFFER_ID` (7), the one the engine asks.
#[no_mangle]
pub unsafe extern "C" fn hipPointerGetAttribute(
    data: *mut c_void,
    attr: c_int,
    p: *mut c_void,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    if attr != 7 {
        return INVALID_VALUE;
    }
    // SAFETY: the buffer id is one u64 at `data`.
    code(unsafe {
        sys::cuPointerGetAttribute(
            data,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
            p as u64,
        )
    })
}

/// `hipHostMalloc` (portable 1 and mapped 2 are CUDA's portable and device-map bits).
#[no_mangle]
pub unsafe extern "C" fn hipHostMalloc(p: *mut *mut c_void, n: usize, f: c_uint) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    let c = ensure_current();
    if c != 0 {
        return c;
    }
    // SAFETY: a valid out-pointer.
    code(unsafe { sys::cuMemHostAlloc(p, n, f & 0x3) })
}

/// `hipHostFree`.
#[no_mangle]
pub unsafe extern "C" fn hipHostFree(p: *mut c_void) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: the caller's allocation.
    code(unsafe { sys::cuMemFreeHost(p) })
}

/// `hipHostGetDevicePointer`.
#[no_mangle]
pub unsafe extern "C" fn hipHostGetDevicePointer(
    d: *mut *mut c_void,
    h: *mut c_void,
    f: c_uint,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    // SAFETY: a valid out-pointer; the caller's mapped allocation.
    code(unsafe { sys::cuMemHostGetDevicePointer_v2(d.cast(), h, f) })
}

/// `hipMemcpyPeerAsync`.
#[no_mangle]
pub unsafe extern "C" fn hipMemcpyPeerAsync(
    dst: *mut c_void,
    dst_dev: c_int,
    src: *const c_void,
    src_dev: c_int,
    n: usize,
    s: *mut c_void,
) -> HipError {
    if !driver_present() {
        return NO_DEVICE;
    }
    let (d, sc) = match (primary(dst_dev), primary(src_dev)) {
        (Ok(d), Ok(sc)) => (d, sc),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    // SAFETY: the caller's ranges and stream; both contexts retained for the process.
    code(unsafe { sys::cuMemcpyPeerAsync(dst as u64, d, src as u64, sc, n, s.cast()) })
}
