//! The data movement of transfers: the only place here that touches registered memory.
//!
//! Every function takes a [`Pin`]: a range that was checked against its registration (by the
//! target against the key, by the requester against its own view) and stays registered while
//! the pin lives. Host memory is copied directly; CUDA memory is staged through host buffers
//! of at most [`CHUNK`] bytes, or copied device to device through a CUDA IPC mapping.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::Arc;

use torchcomms_cuda::ipc::{self, Mapped, HANDLE_BYTES};
use torchcomms_cuda::{copy_dtod_sync, copy_dtoh_sync, copy_htod_sync, Context};

use super::error::{RdmaError, Result};
use super::registry::{MemDevice, Pin};
use crate::span::Span;
use crate::transport::shm::cma;

/// Largest staging buffer of a payload (memory stays bounded for any transfer size).
pub(crate) const CHUNK: usize = 4 << 20;

fn ctx_of(device: MemDevice) -> Result<Option<Arc<Context>>> {
    match device {
        MemDevice::Cpu => Ok(None),
        MemDevice::Cuda(i) => Ok(Some(Context::get(i)?)),
    }
}

/// The pinned host range as a span.
fn span(pin: &Pin) -> Span {
    // SAFETY: the pin's range was checked to lie inside a live host registration, whose owner
    // promised (RdmaMemory::register's contract) that it stays valid while registered; the pin
    // keeps it registered for the life of the span's use below.
    unsafe { Span::from_raw(pin.addr as usize as *mut u8, pin.len as usize) }
}

/// Streams the pinned range to `w` (a write's payload, or a read's response).
pub(crate) fn send_from(pin: &Pin, w: &mut impl Write) -> Result<io::Result<()>> {
    match ctx_of(pin.device)? {
        None => {
            // SAFETY: see `span`; the range is only read.
            Ok(unsafe { span(pin).with_slice(|s| w.write_all(s)) })
        }
        Some(ctx) => {
            let mut stage = vec![0u8; CHUNK.min(pin.len as usize)];
            let mut done = 0u64;
            while done < pin.len {
                let n = (pin.len - done).min(CHUNK as u64) as usize;
                // SAFETY: `[addr + done, + n)` lies inside the pinned device range.
                unsafe { copy_dtoh_sync(&ctx, &mut stage[..n], pin.addr + done) }?;
                if let Err(e) = w.write_all(&stage[..n]) {
                    return Ok(Err(e));
                }
                done += n as u64;
            }
            Ok(Ok(()))
        }
    }
}

/// Fills the pinned range from `r` (a write's payload, or a read's response). The bytes are
/// consumed from `r` even when a CUDA copy fails, so the stream stays in step.
pub(crate) fn recv_into(pin: &Pin, r: &mut impl Read) -> io::Result<Result<()>> {
    match pin.device {
        MemDevice::Cpu => {
            // SAFETY: see `span`; no one else writes the range during a transfer into it
            // (concurrent writes to one range are the callers' race, as with RDMA).
            unsafe { span(pin).with_mut_slice(|s| r.read_exact(s)) }?;
            Ok(Ok(()))
        }
        MemDevice::Cuda(i) => {
            let ctx = Context::get(i);
            let mut stage = vec![0u8; CHUNK.min(pin.len as usize)];
            let mut done = 0u64;
            let mut result = Ok(());
            while done < pin.len {
                let n = (pin.len - done).min(CHUNK as u64) as usize;
                r.read_exact(&mut stage[..n])?;
                if result.is_ok() {
                    result = match &ctx {
                        // SAFETY: `[addr + done, + n)` lies inside the pinned device range.
                        Ok(ctx) => unsafe { copy_htod_sync(ctx, pin.addr + done, &stage[..n]) }
                            .map_err(RdmaError::from),
                        Err(e) => Err(RdmaError::Cuda(e.to_string())),
                    };
                }
                done += n as u64;
            }
            Ok(result)
        }
    }
}

/// Reads and drops `len` payload bytes (a refused request's payload).
pub(crate) fn discard(r: &mut impl Read, len: u64) -> io::Result<()> {
    let n = io::copy(&mut r.take(len), &mut io::sink())?;
    if n < len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Whether a cross-memory-attach error means "not permitted here" (fall back to the stream).
pub(crate) fn cma_denied(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::ENOSYS)
    )
}

/// Copies the requester's `addr` in process `pid` into the pinned host range (a write).
pub(crate) fn cma_pull(pid: u32, addr: u64, pin: &Pin) -> io::Result<()> {
    cma::read(pid, addr as usize, span(pin))
}

/// Copies the pinned host range to the requester's `addr` in process `pid` (a read).
pub(crate) fn cma_push(pid: u32, addr: u64, pin: &Pin) -> io::Result<()> {
    cma::write(pid, addr as usize, span(pin))
}

/// What a requester sends so the target can map its CUDA memory: the allocation's handle, its
/// buffer id and the offset of the pinned range in it.
pub(crate) fn export(pin: &Pin) -> Result<([u8; HANDLE_BYTES], u64, u64)> {
    let MemDevice::Cuda(i) = pin.device else {
        return Err(RdmaError::Cuda("exporting host memory".into()));
    };
    let ctx = Context::get(i)?;
    let e = ipc::export(&ctx, pin.addr)?;
    Ok((e.handle, e.buffer_id, pin.addr - e.base))
}

/// The CUDA IPC mappings a target opened for one connection, by (handle, buffer id).
#[derive(Debug, Default)]
pub(crate) struct Mappings(HashMap<([u8; HANDLE_BYTES], u64), Mapped>);

impl Mappings {
    /// Copies between the pinned device range and `len` bytes at `offset` of the peer's
    /// allocation `handle`; `into_pin` is true for a write (peer -> pinned range).
    pub(crate) fn copy(
        &mut self,
        pin: &Pin,
        handle: &[u8; HANDLE_BYTES],
        buffer_id: u64,
        offset: u64,
        into_pin: bool,
    ) -> Result<()> {
        let MemDevice::Cuda(i) = pin.device else {
            return Err(RdmaError::Cuda(
                "a CUDA IPC request for a host registration".into(),
            ));
        };
        let ctx = Context::get(i)?;
        let mapped = match self.0.entry((*handle, buffer_id)) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(Mapped::open(&ctx, handle)?),
        };
        let peer = mapped.ptr() + offset;
        let (dst, src) = if into_pin {
            (pin.addr, peer)
        } else {
            (peer, pin.addr)
        };
        // SAFETY: the pinned range is inside a live device registration; the peer's range is
        // inside the allocation it exported (the peer pinned it for this request, and the
        // driver faults rather than corrupts on a bad mapping offset).
        unsafe { copy_dtod_sync(&ctx, dst, src, pin.len as usize) }?;
        Ok(())
    }
}
