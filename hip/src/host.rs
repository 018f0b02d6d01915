//! Pinned host memory mapped into every device's address space (`hipHostMalloc` with
//! `Portable | Mapped`): what the GPU progress engine keeps its flags and staging in.
//!
//! Never ran on an AMD GPU (docs/amd.md).

use std::ffi::c_void;

use crate::error::Result;
use crate::runtime::availability;
use crate::sys::{self, check};

/// Page-locked host memory, zeroed, with the address kernels use for it; freed on drop.
#[derive(Debug)]
pub struct PinnedHost {
    ptr: *mut c_void,
    len: usize,
    device_ptr: u64,
}

// SAFETY: ordinary host memory any thread may use; the type hands out addresses only.
unsafe impl Send for PinnedHost {}
// SAFETY: as for Send; who writes the memory when is its users' protocol.
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    /// Allocates `len` bytes (at least one), zeroed.
    pub fn new(len: usize) -> Result<PinnedHost> {
        availability()?;
        let hip = sys::hip()?;
        let size = len.max(1);
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer.
        check(hip, "hipHostMalloc", unsafe {
            (hip.hipHostMalloc)(&mut ptr, size, sys::HIP_HOST_MALLOC_PORTABLE_MAPPED)
        })?;
        let mut host = PinnedHost {
            ptr,
            len: size,
            device_ptr: 0,
        };
        // SAFETY: `ptr` is valid for `size` bytes, just allocated and not yet shared.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, size) };
        let mut dev = std::ptr::null_mut();
        // SAFETY: `dev` is a valid out-pointer; `ptr` came from hipHostMalloc with Mapped.
        check(hip, "hipHostGetDevicePointer", unsafe {
            (hip.hipHostGetDevicePointer)(&mut dev, ptr, 0)
        })?;
        host.device_ptr = dev as u64;
        Ok(host)
    }

    /// The host address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.cast()
    }

    /// The address kernels and copies use for the same memory.
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }

    /// Bytes allocated.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (at least one byte is allocated).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        if let Ok(hip) = sys::hip() {
            // SAFETY: from hipHostMalloc, freed once; users stop touching it before the drop.
            if let Err(e) = check(hip, "hipHostFree", unsafe { (hip.hipHostFree)(self.ptr) }) {
                tracing::warn!("freeing pinned memory: {e}");
            }
        }
    }
}
