//! The process-wide registry of memory that peers may write and read.
//!
//! A registration is the only thing a remote request can touch, and only while it is
//! *pinned*: a transfer pins the registration (after checking the key's id, generation and
//! bounds), and dropping an [`RdmaMemory`] marks it dead and then waits for its pins to go, so
//! no transfer touches memory after its owner deregistered it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::error::{RdmaError, Result};
use super::key::{host_id, process_nonce, AccessKey};
use super::wait::wait_for;
use crate::transport::ib::NicRegion;

/// Where registered memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemDevice {
    /// Host memory.
    Cpu,
    /// Memory of CUDA device `N`.
    Cuda(u32),
}

impl MemDevice {
    /// Wire code: -1 for CPU, the ordinal for CUDA.
    pub(crate) fn to_wire(self) -> i32 {
        match self {
            MemDevice::Cpu => -1,
            MemDevice::Cuda(i) => i as i32,
        }
    }

    /// Inverse of [`MemDevice::to_wire`].
    pub(crate) fn from_wire(code: i32) -> Option<MemDevice> {
        match code {
            -1 => Some(MemDevice::Cpu),
            i if i >= 0 => Some(MemDevice::Cuda(i as u32)),
            _ => None,
        }
    }
}

impl std::fmt::Display for MemDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemDevice::Cpu => f.write_str("cpu"),
            MemDevice::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

#[derive(Debug)]
struct Entry {
    addr: u64,
    len: u64,
    device: MemDevice,
    generation: u64,
    /// Live `RdmaMemory` handles sharing this registration.
    handles: usize,
    /// Transfers using it now.
    pins: usize,
    /// Deregistered: no new pin.
    dead: bool,
    /// The whole range registered in place on ib data paths, by path id: made on first use,
    /// deregistered with the registration (or when the path closes).
    nic: Vec<(u64, Arc<dyn NicRegion>)>,
}

#[derive(Debug, Default)]
struct Registry {
    entries: Mutex<HashMap<u64, Entry>>,
    unpinned: Condvar,
}

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Registry::default)
}

fn lock() -> MutexGuard<'static, HashMap<u64, Entry>> {
    registry().entries.lock().unwrap_or_else(|p| p.into_inner())
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// How long dropping a registration waits for transfers still using it.
fn drop_deadline() -> Duration {
    torchcomms_cvars::current().torchcomms_rdma_timeout_seconds()
}

/// Registered memory: `len` bytes at `addr` on `device`. Deregistered on drop, after the
/// transfers that use it finished.
#[derive(Debug)]
pub struct RdmaMemory {
    id: u64,
    generation: u64,
    addr: u64,
    len: u64,
    device: MemDevice,
    reused: bool,
}

impl RdmaMemory {
    /// Registers `len` bytes at `addr` on `device` (a registration of the same live range is
    /// shared: [`RdmaMemory::reused_registration`]).
    ///
    /// # Safety
    /// The range must be valid memory of `device`, readable and writable, until the returned
    /// value (and every view of it) is dropped: peers holding its key write and read it.
    pub unsafe fn register(addr: u64, len: u64, device: MemDevice) -> Result<Arc<RdmaMemory>> {
        if addr.checked_add(len).is_none() {
            return Err(RdmaError::InvalidArgument {
                arg: "len",
                detail: format!("{len} bytes at {addr:#x} overflow the address space"),
            });
        }
        let mut map = lock();
        let same = map
            .iter_mut()
            .find(|(_, e)| !e.dead && e.addr == addr && e.len == len && e.device == device);
        if let Some((&id, e)) = same {
            e.handles += 1;
            return Ok(Arc::new(RdmaMemory {
                id,
                generation: e.generation,
                addr,
                len,
                device,
                reused: true,
            }));
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
        map.insert(
            id,
            Entry {
                addr,
                len,
                device,
                generation,
                handles: 1,
                pins: 0,
                dead: false,
                nic: Vec::new(),
            },
        );
        Ok(Arc::new(RdmaMemory {
            id,
            generation,
            addr,
            len,
            device,
            reused: false,
        }))
    }

    /// Registration id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes registered.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a 0-byte registration.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the memory lives.
    pub fn device(&self) -> MemDevice {
        self.device
    }

    /// Whether this handle shares a registration made earlier for the same range.
    pub fn reused_registration(&self) -> bool {
        self.reused
    }

    /// The key peers present to reach this memory.
    pub fn key(&self) -> AccessKey {
        AccessKey {
            host: host_id(),
            pid: std::process::id(),
            nonce: process_nonce(),
            id: self.id,
            generation: self.generation,
            addr: self.addr,
            len: self.len,
            device: self.device,
        }
    }

    fn range(&self, offset: Option<u64>, length: Option<u64>) -> Result<(u64, u64)> {
        let offset = offset.unwrap_or(0);
        if offset > self.len {
            return Err(RdmaError::InvalidArgument {
                arg: "offset",
                detail: format!(
                    "expected at most {} (the memory's size), got {offset}",
                    self.len
                ),
            });
        }
        let length = length.unwrap_or(self.len - offset);
        if length > self.len - offset {
            return Err(RdmaError::InvalidArgument {
                arg: "length",
                detail: format!(
                    "expected at most {} (size {} minus offset {offset}), got {length}",
                    self.len - offset,
                    self.len
                ),
            });
        }
        Ok((offset, length))
    }

    /// A read-only view of `length` bytes at `offset` (defaults: the whole memory), the
    /// source of a write.
    pub fn to_view(
        self: &Arc<Self>,
        offset: Option<u64>,
        length: Option<u64>,
    ) -> Result<RdmaMemoryView> {
        let (offset, len) = self.range(offset, length)?;
        Ok(RdmaMemoryView(View {
            mem: Arc::clone(self),
            offset,
            len,
        }))
    }

    /// A writable view, the destination of a read.
    pub fn to_mutable_view(
        self: &Arc<Self>,
        offset: Option<u64>,
        length: Option<u64>,
    ) -> Result<RdmaMemoryMutableView> {
        let (offset, len) = self.range(offset, length)?;
        Ok(RdmaMemoryMutableView(View {
            mem: Arc::clone(self),
            offset,
            len,
        }))
    }

    /// The whole memory as a peer names it.
    pub fn to_remote_buffer(&self) -> RdmaRemoteBuffer {
        RdmaRemoteBuffer {
            ptr: self.addr,
            len: self.len,
            key: self.key(),
        }
    }
}

impl Drop for RdmaMemory {
    fn drop(&mut self) {
        let mut map = lock();
        let Some(e) = map.get_mut(&self.id) else {
            return;
        };
        e.handles -= 1;
        if e.handles > 0 {
            return;
        }
        e.dead = true;
        let limit = drop_deadline();
        let id = self.id;
        let (mut map, unpinned) =
            wait_for(&registry().unpinned, map, Instant::now() + limit, |map| {
                (map.get(&id).map_or(0, |e| e.pins) == 0).then_some(())
            });
        if unpinned.is_none() {
            let pins = map.get(&id).map_or(0, |e| e.pins);
            tracing::error!(
                id,
                pins,
                "RdmaMemory dropped while {pins} transfer(s) still use it after {limit:?}; \
                 deregistering anyway"
            );
        }
        let gone = map.remove(&self.id);
        drop(map);
        // Deregisters its NIC regions, outside the registry's lock.
        drop(gone);
    }
}

/// Deregisters every region ib data path `path` made (it is closing).
pub(crate) fn forget_nic_path(path: u64) {
    let mut gone = Vec::new();
    for e in lock().values_mut() {
        e.nic.retain(|(p, r)| {
            if *p == path {
                gone.push(Arc::clone(r));
            }
            *p != path
        });
    }
    drop(gone);
}

/// A registration held for one transfer: the memory stays registered until this drops.
#[derive(Debug)]
pub(crate) struct Pin {
    id: u64,
    generation: u64,
    /// Where the pinned range starts, and its device.
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) device: MemDevice,
}

impl Pin {
    /// Pins `len` bytes at `addr` of the registration `key` names, after checking that it is
    /// live, of the key's generation, and that the range lies inside it.
    pub(crate) fn remote(key: &AccessKey, addr: u64, len: u64) -> Result<Pin> {
        key.check_mine()?;
        pin(key.id, key.generation, addr, len)
    }

    /// The region ib data path `path` registered over this pin's whole registration, made by
    /// `make(addr, len, device)` on first use (outside the registry's lock: registering can
    /// take long). `make`'s error says why the memory cannot be registered in place.
    pub(crate) fn nic_region(
        &self,
        path: u64,
        make: impl FnOnce(u64, u64, MemDevice) -> std::result::Result<Arc<dyn NicRegion>, String>,
    ) -> std::result::Result<(u64, Arc<dyn NicRegion>), String> {
        let whole = {
            let map = lock();
            let e = map.get(&self.id).ok_or("the registration is gone")?;
            if let Some((_, r)) = e.nic.iter().find(|(p, _)| *p == path) {
                return Ok((e.addr, Arc::clone(r)));
            }
            (e.addr, e.len, e.device)
        };
        let made = make(whole.0, whole.1, whole.2)?;
        let mut map = lock();
        // The pin keeps the entry alive; another transfer may have registered meanwhile.
        let e = map.get_mut(&self.id).ok_or("the registration is gone")?;
        let r = match e.nic.iter().find(|(p, _)| *p == path) {
            Some((_, r)) => Arc::clone(r),
            None => {
                e.nic.push((path, Arc::clone(&made)));
                made
            }
        };
        Ok((e.addr, r))
    }

    /// The pinned range as a [`Claim`], which pins parts of it again later.
    pub(crate) fn claim(&self) -> Claim {
        Claim {
            id: self.id,
            generation: self.generation,
            addr: self.addr,
            len: self.len,
            device: self.device,
        }
    }
}

/// A range checked against its registration once, pinned again chunk by chunk while a
/// payload streams through a socket: a slow peer then never holds a registration for longer
/// than one chunk's copy, and a registration dropped mid-stream fails the rest of the
/// transfer instead of being written after it is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claim {
    id: u64,
    generation: u64,
    /// Where the range starts, and its device.
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) device: MemDevice,
}

impl Claim {
    /// Pins `len` bytes at byte `offset` of the range (checked again: live, same generation,
    /// inside the registration).
    pub(crate) fn pin_part(&self, offset: u64, len: u64) -> Result<Pin> {
        pin(self.id, self.generation, self.addr + offset, len)
    }
}

fn pin(id: u64, generation: u64, addr: u64, len: u64) -> Result<Pin> {
    let mut map = lock();
    let e = match map.get_mut(&id) {
        Some(e) if !e.dead => e,
        _ => return Err(RdmaError::UnknownRegistration { id }),
    };
    if e.generation != generation {
        return Err(RdmaError::StaleKey {
            id,
            key: generation,
            current: e.generation,
        });
    }
    let inside = addr >= e.addr
        && addr
            .checked_add(len)
            .is_some_and(|end| end <= e.addr + e.len);
    if !inside {
        return Err(RdmaError::OutOfBounds {
            id,
            addr,
            len,
            reg_addr: e.addr,
            reg_len: e.len,
        });
    }
    e.pins += 1;
    Ok(Pin {
        id,
        generation,
        addr,
        len,
        device: e.device,
    })
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut map = lock();
        if let Some(e) = map.get_mut(&self.id) {
            e.pins -= 1;
        }
        drop(map);
        registry().unpinned.notify_all();
    }
}

/// A range of a registration (shared by both view kinds).
#[derive(Debug, Clone)]
pub(crate) struct View {
    pub(crate) mem: Arc<RdmaMemory>,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

impl View {
    /// Pins the view's range for a transfer of this process.
    pub(crate) fn pin(&self) -> Result<Pin> {
        pin(
            self.mem.id,
            self.mem.generation,
            self.mem.addr + self.offset,
            self.len,
        )
    }
}

/// A read-only range of registered memory: the source of a write.
#[derive(Debug, Clone)]
pub struct RdmaMemoryView(pub(crate) View);

/// A writable range of registered memory: the destination of a read.
#[derive(Debug, Clone)]
pub struct RdmaMemoryMutableView(pub(crate) View);

impl RdmaMemoryView {
    /// Bytes in the view.
    pub fn size(&self) -> u64 {
        self.0.len
    }
}

impl RdmaMemoryMutableView {
    /// Bytes in the view.
    pub fn size(&self) -> u64 {
        self.0.len
    }
}

/// A peer's memory as this side names it: `len` bytes at `ptr` (in the peer's address space)
/// and the key of the registration they belong to. Checked only by the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaRemoteBuffer {
    /// Start in the owner's address space.
    pub ptr: u64,
    /// Bytes.
    pub len: u64,
    /// The owner's key.
    pub key: AccessKey,
}

impl RdmaRemoteBuffer {
    /// Builds one from its three parts (as pickled), parsing the key.
    pub fn new(ptr: u64, len: u64, access_key: &str) -> Result<RdmaRemoteBuffer> {
        let key = AccessKey::parse(access_key)?;
        Ok(RdmaRemoteBuffer { ptr, len, key })
    }

    /// The key's text.
    pub fn access_key(&self) -> String {
        self.key.encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_check_bounds_and_liveness() {
        let mut buf = vec![0u8; 64];
        let addr = buf.as_mut_ptr() as u64;
        // SAFETY: `buf` outlives the registration (dropped at the end of the test).
        let m = unsafe { RdmaMemory::register(addr, 64, MemDevice::Cpu) }.unwrap();
        // SAFETY: as above.
        let again = unsafe { RdmaMemory::register(addr, 64, MemDevice::Cpu) }.unwrap();
        assert!(again.reused_registration() && !m.reused_registration());
        assert_eq!(again.id(), m.id());
        let key = m.key();
        drop(Pin::remote(&key, addr + 8, 56).unwrap());
        let e = Pin::remote(&key, addr + 8, 57).unwrap_err();
        assert!(matches!(e, RdmaError::OutOfBounds { .. }), "{e}");
        let stale = AccessKey {
            generation: key.generation + 1,
            ..key
        };
        assert!(matches!(
            Pin::remote(&stale, addr, 1),
            Err(RdmaError::StaleKey { .. })
        ));
        drop(again);
        assert!(
            Pin::remote(&key, addr, 1).is_ok(),
            "one handle still holds it"
        );
        drop(m);
        let e = Pin::remote(&key, addr, 1).unwrap_err();
        assert!(matches!(e, RdmaError::UnknownRegistration { .. }), "{e}");
        assert!(m_view_errors());
    }

    fn m_view_errors() -> bool {
        let mut buf = vec![0u8; 16];
        // SAFETY: `buf` outlives the registration.
        let m =
            unsafe { RdmaMemory::register(buf.as_mut_ptr() as u64, 16, MemDevice::Cpu) }.unwrap();
        let ok = m.to_view(Some(4), Some(12)).is_ok();
        let e1 = m.to_view(Some(17), None).unwrap_err().to_string();
        let e2 = m
            .to_mutable_view(Some(4), Some(13))
            .unwrap_err()
            .to_string();
        ok && e1.contains("offset") && e2.contains("length")
    }
}
