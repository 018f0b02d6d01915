//! GPU IPC (CUDA IPC, or HIP's over Infinity Fabric): exporting device allocations to other
//! processes of the host and mapping theirs, plus the topology questions the NVLink transport
//! asks (which device a peer uses, whether this device can reach it).
//!
//! A handle names a whole allocation (the range `cuMemAlloc` returned), so a pointer into a
//! tensor is exported as (handle of its allocation, offset). The allocation's buffer id tells a
//! reused address from the allocation that was there before: caches key on it.

use std::ffi::{c_char, c_void};
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::Context;
use super::error::{DriverResultExt, Result};
use super::platform::Platform;

/// Bytes of an IPC memory handle.
pub const HANDLE_BYTES: usize = 64;

/// An exported allocation: what a peer needs to map it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exported {
    /// The driver's handle.
    pub handle: [u8; HANDLE_BYTES],
    /// Start of the allocation in the exporter's address space.
    pub base: u64,
    /// Its size.
    pub size: u64,
    /// The allocation's unique id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`).
    pub buffer_id: u64,
}

/// The allocation that holds device address `ptr`: its start, size and buffer id.
pub fn allocation_of(ctx: &Arc<Context>, ptr: u64) -> Result<(u64, u64, u64)> {
    ctx.bind()?;
    if ctx.platform() == Platform::Hip {
        return Ok(torchcomms_hip::allocation_of(ptr)?);
    }
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: writes two values; the driver checks that `ptr` is a device address.
    unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }
        .result()
        .call("cuMemGetAddressRange")?;
    let mut id = 0u64;
    // SAFETY: the buffer id attribute is one unsigned 64-bit value.
    unsafe {
        sys::cuPointerGetAttribute(
            (&mut id as *mut u64).cast::<c_void>(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
            ptr,
        )
    }
    .result()
    .call("cuPointerGetAttribute(BUFFER_ID)")?;
    Ok((base, size as u64, id))
}

/// Exports the allocation holding `ptr`.
pub fn export(ctx: &Arc<Context>, ptr: u64) -> Result<Exported> {
    let (base, size, buffer_id) = allocation_of(ctx, ptr)?;
    if ctx.platform() == Platform::Hip {
        return Ok(Exported {
            handle: torchcomms_hip::ipc_handle_of(base)?.reserved,
            base,
            size,
            buffer_id,
        });
    }
    let mut h = sys::CUipcMemHandle_st {
        reserved: [0; HANDLE_BYTES],
    };
    // SAFETY: writes one handle; `base` starts an allocation of this context.
    unsafe { sys::cuIpcGetMemHandle(&mut h, base) }
        .result()
        .call("cuIpcGetMemHandle")?;
    Ok(Exported {
        handle: h.reserved.map(|c| c as u8),
        base,
        size,
        buffer_id,
    })
}

/// A peer's allocation mapped into this process; unmapped on drop.
#[derive(Debug)]
pub struct Mapped {
    ctx: Arc<Context>,
    ptr: u64,
    /// HIP's mapping, closed by its own drop; `None` on CUDA.
    hip: Option<torchcomms_hip::IpcMapping>,
}

impl Mapped {
    /// Maps a peer's exported allocation (peer access is enabled as needed).
    pub fn open(ctx: &Arc<Context>, handle: &[u8; HANDLE_BYTES]) -> Result<Mapped> {
        ctx.bind()?;
        if ctx.platform() == Platform::Hip {
            let m = torchcomms_hip::IpcMapping::open(&torchcomms_hip::HipIpcMemHandle {
                reserved: *handle,
            })?;
            return Ok(Mapped {
                ctx: Arc::clone(ctx),
                ptr: m.as_raw() as u64,
                hip: Some(m),
            });
        }
        let h = sys::CUipcMemHandle_st {
            reserved: handle.map(|b| b as c_char),
        };
        let mut ptr = 0u64;
        // SAFETY: writes one address; the handle came from a peer's cuIpcGetMemHandle.
        unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                h,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        }
        .result()
        .call("cuIpcOpenMemHandle")?;
        Ok(Mapped {
            ctx: Arc::clone(ctx),
            ptr,
            hip: None,
        })
    }

    /// The mapping's start in this process (the exporter's `base`).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if self.hip.is_some() {
            return;
        }
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: our mapping, closed once; kernels using it have been waited for by the
            // owner (the transport drops mappings after its stream is idle).
            unsafe { sys::cuIpcCloseMemHandle(self.ptr) }
                .result()
                .call("cuIpcCloseMemHandle")
        });
        if let Err(e) = r {
            tracing::warn!("closing a CUDA IPC mapping: {e}");
        }
    }
}

/// The PCI bus id of `ctx`'s device (`0000:1b:00.0`), which names it across processes.
pub fn pci_bus_id(ctx: &Arc<Context>) -> Result<String> {
    if ctx.platform() == Platform::Hip {
        return Ok(torchcomms_hip::device::pci_bus_id(ctx.ordinal() as i32)?);
    }
    let mut buf = [0 as c_char; 32];
    // SAFETY: writes at most `len` bytes, NUL-terminated.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, ctx.device()) }
        .result()
        .call("cuDeviceGetPCIBusId")?;
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Whether `ctx`'s device can map memory of the device with PCI bus id `peer` (which this
/// process must see). `false` when it cannot see that device, or it is `ctx`'s own.
pub fn can_access(ctx: &Arc<Context>, peer: &str) -> Result<bool> {
    if pci_bus_id(ctx)?.eq_ignore_ascii_case(peer) {
        return Ok(false);
    }
    if ctx.platform() == Platform::Hip {
        let me = ctx.ordinal() as i32;
        return Ok(match torchcomms_hip::device::device_by_pci_bus_id(peer)? {
            Some(other) => torchcomms_hip::device::can_access_peer(me, other)?,
            None => false,
        });
    }
    let Ok(cpeer) = std::ffi::CString::new(peer) else {
        return Ok(false);
    };
    let mut dev: sys::CUdevice = 0;
    // SAFETY: writes one device; the id is NUL-terminated.
    let found = unsafe { sys::cuDeviceGetByPCIBusId(&mut dev, cpeer.as_ptr()) }.result();
    if found.is_err() {
        return Ok(false);
    }
    let mut ok = 0i32;
    // SAFETY: writes one int.
    unsafe { sys::cuDeviceCanAccessPeer(&mut ok, ctx.device(), dev) }
        .result()
        .call("cuDeviceCanAccessPeer")?;
    Ok(ok != 0)
}
