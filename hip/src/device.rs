//! What a device is and what it reaches: its name and size, its PCI bus id (which names it
//! across processes), peer access between GPUs of the host, free memory, the driver version.
//!
//! Never ran on an AMD GPU (docs/amd.md).

use std::ffi::{c_char, CString};

use crate::error::Result;
use crate::runtime::availability;
use crate::sys::{self, check};

/// A device's fixed properties, read once when the engine first uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `hipDeviceGetName` (`AMD Instinct MI250X`).
    pub name: String,
    /// Compute units (`hipDeviceAttributeMultiprocessorCount`).
    pub compute_units: i32,
    /// HIP's compute capability pair (9, 0 on gfx90a).
    pub compute_capability: (i32, i32),
}

fn text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The properties of device `ordinal`.
pub fn device_info(ordinal: i32) -> Result<DeviceInfo> {
    availability()?;
    let hip = sys::hip()?;
    let attr = |a| {
        let mut v = 0;
        // SAFETY: `v` is a valid out-pointer; HIP checks the ordinal and the attribute.
        check(hip, "hipDeviceGetAttribute", unsafe {
            (hip.hipDeviceGetAttribute)(&mut v, a, ordinal)
        })
        .map(|()| v)
    };
    let mut name = [0 as c_char; 256];
    // SAFETY: HIP writes at most `len` bytes, NUL-terminated.
    check(hip, "hipDeviceGetName", unsafe {
        (hip.hipDeviceGetName)(name.as_mut_ptr(), name.len() as i32, ordinal)
    })?;
    Ok(DeviceInfo {
        name: text(&name),
        compute_units: attr(sys::HIP_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        compute_capability: (
            attr(sys::HIP_DEVICE_ATTRIBUTE_CC_MAJOR)?,
            attr(sys::HIP_DEVICE_ATTRIBUTE_CC_MINOR)?,
        ),
    })
}

/// The PCI bus id of device `ordinal` (`0000:c1:00.0`).
pub fn pci_bus_id(ordinal: i32) -> Result<String> {
    availability()?;
    let hip = sys::hip()?;
    let mut buf = [0 as c_char; 32];
    // SAFETY: HIP writes at most `len` bytes, NUL-terminated.
    check(hip, "hipDeviceGetPCIBusId", unsafe {
        (hip.hipDeviceGetPCIBusId)(buf.as_mut_ptr(), buf.len() as i32, ordinal)
    })?;
    Ok(text(&buf))
}

/// Whether device `ordinal` can map memory of the device with PCI bus id `peer`; `false` when
/// this process does not see that device or it is `ordinal` itself.
pub fn can_access(ordinal: i32, peer: &str) -> Result<bool> {
    if pci_bus_id(ordinal)?.eq_ignore_ascii_case(peer) {
        return Ok(false);
    }
    let Ok(cpeer) = CString::new(peer) else {
        return Ok(false);
    };
    let hip = sys::hip()?;
    let mut other = -1;
    // SAFETY: `other` is a valid out-pointer; the id is NUL-terminated.
    if unsafe { (hip.hipDeviceGetByPCIBusId)(&mut other, cpeer.as_ptr()) } != sys::HIP_SUCCESS {
        return Ok(false);
    }
    let mut ok = 0;
    // SAFETY: `ok` is a valid out-pointer; both ordinals come from HIP.
    check(hip, "hipDeviceCanAccessPeer", unsafe {
        (hip.hipDeviceCanAccessPeer)(&mut ok, ordinal, other)
    })?;
    Ok(ok != 0)
}

/// Lets the current device's kernels and copies reach device `peer`'s memory (already
/// enabled is fine).
pub fn enable_peer_access(peer: i32) -> Result<()> {
    availability()?;
    let hip = sys::hip()?;
    // SAFETY: plain call; HIP checks the ordinal.
    let code = unsafe { (hip.hipDeviceEnablePeerAccess)(peer, 0) };
    if code == sys::HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(());
    }
    check(hip, "hipDeviceEnablePeerAccess", code)
}

/// Free and total memory of the current device, in bytes.
pub fn mem_info() -> Result<(usize, usize)> {
    availability()?;
    let hip = sys::hip()?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    check(hip, "hipMemGetInfo", unsafe {
        (hip.hipMemGetInfo)(&mut free, &mut total)
    })?;
    Ok((free, total))
}

/// The driver's version (`hipDriverGetVersion`).
pub fn driver_version() -> Result<i32> {
    let hip = sys::hip()?;
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer.
    check(hip, "hipDriverGetVersion", unsafe {
        (hip.hipDriverGetVersion)(&mut v)
    })?;
    Ok(v)
}
