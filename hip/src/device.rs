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

/// The ordinal of the device with PCI bus id `id`, or `None` when this process does not see it.
pub fn device_by_pci_bus_id(id: &str) -> Result<Option<i32>> {
    let Ok(cid) = CString::new(id) else {
        return Ok(None);
    };
    availability()?;
    let hip = sys::hip()?;
    let mut dev = -1;
    // SAFETY: `dev` is a valid out-pointer; the id is NUL-terminated.
    let found = unsafe { (hip.hipDeviceGetByPCIBusId)(&mut dev, cid.as_ptr()) } == sys::HIP_SUCCESS;
    Ok(found.then_some(dev))
}

/// Whether device `ordinal` can map memory of device `peer`.
pub fn can_access_peer(ordinal: i32, peer: i32) -> Result<bool> {
    availability()?;
    let hip = sys::hip()?;
    let mut ok = 0;
    // SAFETY: `ok` is a valid out-pointer; HIP checks both ordinals.
    check(hip, "hipDeviceCanAccessPeer", unsafe {
        (hip.hipDeviceCanAccessPeer)(&mut ok, ordinal, peer)
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
