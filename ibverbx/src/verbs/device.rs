//! The device list and one device's name.

use std::ffi::CStr;

use crate::error::{errno, Error, Result};
use crate::loader::{symbols, Symbols};
use crate::sys;

/// The RDMA devices libibverbs lists (`ibv_get_device_list`), freed on drop.
///
/// A machine without kernel verbs support (no `/sys/class/infiniband_verbs`) lists no device
/// rather than failing: that is what "no RDMA device" means to a caller.
#[derive(Debug)]
pub struct DeviceList {
    list: *mut *mut sys::ibv_device,
    len: usize,
    syms: &'static Symbols,
}

// SAFETY: the list is an immutable array owned by this value; rdma-core's device objects are
// reference counted and may be used (opened) from any thread.
unsafe impl Send for DeviceList {}
// SAFETY: as above; `&DeviceList` only reads the array.
unsafe impl Sync for DeviceList {}

impl DeviceList {
    /// Lists the devices (loading libibverbs on first use).
    pub fn get() -> Result<DeviceList> {
        let syms = symbols()?;
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the function is the library's.
        let list = unsafe { (syms.get_device_list)(&mut n) };
        if list.is_null() {
            let e = errno();
            // rdma-core returns NULL (ENOSYS, or ENOENT from sysfs) when the kernel has no
            // verbs support at all: no device.
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOSYS | libc::ENOENT | libc::ENODEV)
            ) {
                return Ok(DeviceList { list, len: 0, syms });
            }
            return Err(Error::GetDeviceList { source: e });
        }
        Ok(DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
            syms,
        })
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device at `i`.
    pub fn get_device(&self, i: usize) -> Option<Device<'_>> {
        if i >= self.len {
            return None;
        }
        // SAFETY: `i < len`, the array holds `len` valid device pointers while the list lives.
        let raw = unsafe { *self.list.add(i) };
        Some(Device { raw, _list: self })
    }

    /// Every device.
    pub fn iter(&self) -> impl Iterator<Item = Device<'_>> + '_ {
        (0..self.len).filter_map(move |i| self.get_device(i))
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if !self.list.is_null() {
            // SAFETY: the list came from `ibv_get_device_list` and is freed once; contexts
            // opened from it keep their device alive (rdma-core reference counts them).
            unsafe { (self.syms.free_device_list)(self.list) };
        }
    }
}

/// One device of a [`DeviceList`].
#[derive(Debug, Clone, Copy)]
pub struct Device<'a> {
    raw: *mut sys::ibv_device,
    _list: &'a DeviceList,
}

impl Device<'_> {
    /// Kernel name of the device, e.g. `mlx5_0`.
    pub fn name(&self) -> String {
        // SAFETY: `raw` is a live device of the list; `name` is NUL-terminated within its
        // fixed array (rdma-core copies at most IBV_SYSFS_NAME_MAX - 1 bytes).
        let name = unsafe { CStr::from_ptr((*self.raw).name.as_ptr()) };
        name.to_string_lossy().into_owned()
    }

    /// The raw device (escape hatch; valid while the list lives).
    pub fn as_raw(&self) -> *mut sys::ibv_device {
        self.raw
    }
}
