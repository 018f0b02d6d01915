//! The data movement of transfers: the only place here that touches registered memory.
//!
//! Every function takes a [`Pin`] (a range checked against its registration, by the target
//! against the key, by the requester against its own view, and registered while the pin
//! lives) or, for payloads streamed through the socket, a [`Claim`] that is pinned again for
//! each chunk of at most [`CHUNK`] bytes as it is copied. Cross-memory attach copies host
//! memory directly, CUDA IPC device to device.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::Arc;

use torchcomms_cuda::ipc::{self, Mapped, HANDLE_BYTES};
use torchcomms_cuda::{copy_dtod_sync, copy_dtoh_sync, copy_htod_sync, Context};

use super::error::{RdmaError, Result};
use super::registry::{Claim, MemDevice, Pin};
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

/// Copies the pinned range into `out` (its length).
fn read_pinned(pin: &Pin, ctx: Option<&Arc<Context>>, out: &mut [u8]) -> Result<()> {
    match ctx {
        None => {
            span(pin).copy_to_slice(out);
            Ok(())
        }
        // SAFETY: the range lies inside the pinned device registration.
        Some(ctx) => Ok(unsafe { copy_dtoh_sync(ctx, out, pin.addr) }?),
    }
}

/// Copies the pinned range, of either device, into `out` (its length).
pub(crate) fn read_pin(pin: &Pin, out: &mut [u8]) -> Result<()> {
    read_pinned(pin, ctx_of(pin.device)?.as_ref(), out)
}

/// Copies `data` (its length) into the pinned range, of either device.
pub(crate) fn write_pin(pin: &Pin, data: &[u8]) -> Result<()> {
    write_pinned(pin, ctx_of(pin.device)?.as_ref(), data)
}

/// Copies `data` (its length) into the pinned range.
fn write_pinned(pin: &Pin, ctx: Option<&Arc<Context>>, data: &[u8]) -> Result<()> {
    match ctx {
        None => {
            span(pin).copy_from_slice(data);
            Ok(())
        }
        // SAFETY: the range lies inside the pinned device registration.
        Some(ctx) => Ok(unsafe { copy_htod_sync(ctx, pin.addr, data) }?),
    }
}

/// Streams the claimed range to `w` (a write's payload, or a read's response) in chunks of at
/// most [`CHUNK`] bytes, each pinned only while it is copied out, then one trailer byte: 0
/// when every chunk was read, 1 when the registration went away (or a CUDA copy failed)
/// mid-stream and zeros were sent in its place. The outer error is the stream's.
pub(crate) fn send_from(claim: &Claim, w: &mut impl Write) -> io::Result<Result<()>> {
    let ctx = ctx_of(claim.device);
    let mut stage = vec![0u8; CHUNK.min(claim.len as usize)];
    let mut failed: Option<RdmaError> = ctx.as_ref().err().cloned();
    let mut done = 0u64;
    while done < claim.len {
        let n = (claim.len - done).min(CHUNK as u64) as usize;
        let chunk = &mut stage[..n];
        if failed.is_none() {
            let ctx = ctx.as_ref().ok().and_then(Option::as_ref);
            let read = claim
                .pin_part(done, n as u64)
                .and_then(|pin| read_pinned(&pin, ctx, chunk));
            failed = read.err();
        }
        if failed.is_some() {
            chunk.fill(0);
        }
        w.write_all(chunk)?;
        done += n as u64;
    }
    w.write_all(&[u8::from(failed.is_some())])?;
    Ok(failed.map_or(Ok(()), Err))
}

/// Receives a payload of `len` bytes and its trailer byte from `r` into the claimed range
/// (`None`: drops it, for a refused request), each chunk pinned only while it is copied in.
/// The bytes are consumed even when the claim fails part-way, so the stream stays in step;
/// the inner error says why the data is not all there (this side's registration went away,
/// or the sender's did, as its trailer says).
pub(crate) fn recv_into(
    claim: Option<&Claim>,
    len: u64,
    r: &mut impl Read,
) -> io::Result<Result<()>> {
    let ctx = claim.map(|c| ctx_of(c.device));
    let mut stage = vec![0u8; CHUNK.min(len as usize)];
    let mut failed: Option<RdmaError> = match &ctx {
        Some(Err(e)) => Some(e.clone()),
        _ => None,
    };
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK as u64) as usize;
        let chunk = &mut stage[..n];
        r.read_exact(chunk)?;
        if let (Some(c), None) = (claim, &failed) {
            let ctx = ctx
                .as_ref()
                .and_then(|c| c.as_ref().ok())
                .and_then(Option::as_ref);
            failed = c
                .pin_part(done, n as u64)
                .and_then(|pin| write_pinned(&pin, ctx, chunk))
                .err();
        }
        done += n as u64;
    }
    let mut trailer = [0u8; 1];
    r.read_exact(&mut trailer)?;
    if trailer[0] != 0 && failed.is_none() {
        failed = Some(RdmaError::State {
            op: "receiving a payload",
            detail: "the sender's memory was deregistered (or could not be read) while it \
                     streamed; the data here is incomplete"
                .into(),
        });
    }
    Ok(failed.map_or(Ok(()), Err))
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

/// The context of the pinned range's device; `what` names the request when it is host memory.
fn device_of(pin: &Pin, what: &str) -> Result<Arc<Context>> {
    match pin.device {
        MemDevice::Cuda(i) => Ok(Context::get(i)?),
        MemDevice::Cpu => Err(RdmaError::Cuda(format!("{what} for a host registration"))),
    }
}

/// Copies device to device between the pinned range and `other`, the requester's range as
/// addressed in this process; `into_pin`: a write (`other` -> pinned range).
///
/// # Safety
/// `other` must be device memory valid for `pin.len` bytes for the duration of the copy.
unsafe fn copy_with_pin(ctx: &Arc<Context>, pin: &Pin, other: u64, into_pin: bool) -> Result<()> {
    let (dst, src) = if into_pin {
        (pin.addr, other)
    } else {
        (other, pin.addr)
    };
    // SAFETY: the pinned range is inside a live device registration; `other` is valid by this
    // function's contract.
    unsafe { copy_dtod_sync(ctx, dst, src, pin.len as usize) }?;
    Ok(())
}

/// Copies between the pinned device range and the same process's device memory at `addr`
/// (`into_pin`: a write, `addr` -> pinned range). The requester pinned its range for the
/// request and the connection's other end was checked to be this process.
pub(crate) fn local_copy(pin: &Pin, addr: u64, into_pin: bool) -> Result<()> {
    let ctx = device_of(pin, "a same-process CUDA copy")?;
    // SAFETY: `addr` is the requester's pinned device memory of `pin.len` bytes in this very
    // process (unified addressing: any device).
    unsafe { copy_with_pin(&ctx, pin, addr, into_pin) }
}

/// What a requester sends so the target can map its CUDA memory: the allocation's handle, its
/// buffer id and the offset of the pinned range in it.
pub(crate) fn export(pin: &Pin) -> Result<([u8; HANDLE_BYTES], u64, u64)> {
    let ctx = device_of(pin, "exporting over CUDA IPC")?;
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
        let ctx = device_of(pin, "a CUDA IPC request")?;
        let mapped = match self.0.entry((*handle, buffer_id)) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(Mapped::open(&ctx, handle)?),
        };
        // SAFETY: the peer's range is inside the allocation it exported (the peer pinned it
        // for this request, and the driver faults rather than corrupts on a bad mapping
        // offset).
        unsafe { copy_with_pin(&ctx, pin, mapped.ptr() + offset, into_pin) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::RdmaMemory;

    /// Yields `len` bytes of 0xAB and then a trailer byte; drops `mem` once `drop_after` bytes
    /// were read (the owner deregistering while a payload streams in).
    struct Source {
        len: usize,
        sent: usize,
        drop_after: usize,
        mem: Option<Arc<RdmaMemory>>,
        trailer_sent: bool,
    }

    impl Read for Source {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.sent >= self.drop_after {
                self.mem = None;
            }
            if self.sent == self.len {
                if self.trailer_sent || buf.is_empty() {
                    return Ok(0);
                }
                self.trailer_sent = true;
                buf[0] = 0;
                return Ok(1);
            }
            let n = buf
                .len()
                .min(self.len - self.sent)
                .min(self.drop_after.max(1));
            buf[..n].fill(0xAB);
            self.sent += n;
            Ok(n)
        }
    }

    fn register(buf: &mut [u8]) -> Arc<RdmaMemory> {
        // SAFETY: the buffer outlives the registration in every test below.
        unsafe { RdmaMemory::register(buf.as_mut_ptr() as u64, buf.len() as u64, MemDevice::Cpu) }
            .expect("register")
    }

    #[test]
    fn a_registration_dropped_mid_stream_is_not_written_after() {
        let mut buf = vec![0u8; 2 * CHUNK + 10];
        let len = buf.len();
        let mem = register(&mut buf);
        let claim = mem
            .to_view(None, None)
            .expect("view")
            .0
            .pin()
            .expect("pin")
            .claim();
        let mut src = Source {
            len,
            sent: 0,
            drop_after: CHUNK,
            mem: Some(mem),
            trailer_sent: false,
        };
        let r = recv_into(Some(&claim), len as u64, &mut src).expect("the stream is whole");
        assert!(r.is_err(), "the rest could not land: {r:?}");
        assert!(src.mem.is_none() && src.trailer_sent);
        assert!(
            buf[..CHUNK].iter().all(|&b| b == 0xAB),
            "the first chunk landed"
        );
        assert!(
            buf[CHUNK..].iter().all(|&b| b == 0),
            "nothing after the drop"
        );
    }

    #[test]
    fn a_source_dropped_mid_stream_sends_zeros_and_says_so() {
        let mut buf = vec![7u8; 10];
        let mem = register(&mut buf);
        let claim = mem
            .to_view(None, None)
            .expect("view")
            .0
            .pin()
            .expect("pin")
            .claim();
        drop(mem);
        let mut out = Vec::new();
        let r = send_from(&claim, &mut out).expect("writing to a Vec");
        assert!(r.is_err());
        assert_eq!(
            out,
            [vec![0u8; 10], vec![1u8]].concat(),
            "zeros, then trailer 1"
        );
        let mut back = vec![9u8; 10];
        let m2 = register(&mut back);
        let c2 = m2
            .to_view(None, None)
            .expect("view")
            .0
            .pin()
            .expect("pin")
            .claim();
        let got = recv_into(Some(&c2), 10, &mut out.as_slice()).expect("whole");
        assert!(got.is_err(), "the receiver learns the data is incomplete");
    }
}
