//! An in-process software provider that models RC queue pairs honestly enough to test
//! virtual QPs without hardware: writes copy into the peer's registered memory after lkey,
//! rkey and bounds checks (an out-of-bounds write is a remote access error completion, never a
//! write out of bounds), a write with immediate consumes a posted receive and completes it
//! with the immediate data, a failure moves the QP to the error state and flushes everything
//! outstanding on it, and a destroyed peer makes the sender's writes fail with "retry
//! exceeded". Faults are injected on demand ([`SoftFabric::inject`]); writes of different QPs
//! can run interleaved in a random order (so completions arrive reordered across QPs) and
//! polls can return part of what is available, both from a seeded generator, so a failing
//! test replays exactly.
//!
//! Everything happens under one lock when a completion queue is polled; nothing runs in the
//! background.

mod fabric;
mod memory;

use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::provider::{
    Completion, CqOps, LocalKey, Provider, QpOps, RemoteKey, WcStatus, WorkRequest,
};
use crate::verbs::QpEndpoint;
use fabric::{Cq, Fabric, Mr, Qp, QpState, QP_BASE};
use memory::Backing;
pub use memory::DmaEngine;

/// Behaviour of a software fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoftConfig {
    /// Seed of reordering and partial delivery.
    pub seed: u64,
    /// Run the QPs' writes interleaved in a random order, so completions (at both ends)
    /// arrive reordered across QPs; each QP's own order is kept, as RC guarantees, and a
    /// completion queue stays first in, first out, like a hardware one.
    pub reorder: bool,
    /// Deliver a random number of the available completions per poll (possibly none).
    pub partial: bool,
    /// Copy the bytes of writes (off: only the bookkeeping, to measure the virtual QP).
    pub copy_data: bool,
}

impl Default for SoftConfig {
    fn default() -> SoftConfig {
        SoftConfig {
            seed: 1,
            reorder: false,
            partial: false,
            copy_data: true,
        }
    }
}

/// A software fabric: devices, memory, queue pairs and completion queues of one process.
#[derive(Clone)]
pub struct SoftFabric {
    inner: Arc<Mutex<Fabric>>,
    /// Tells this fabric's endpoints from another's (another process's, most likely), which
    /// it cannot reach: they carry it in the GID's interface id.
    id: u64,
}

/// An id no other fabric of this process, and most likely no fabric of another process, has.
fn new_fabric_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut rng = fabric::Rng::new(nanos ^ u64::from(std::process::id()) << 32);
    rng.next() ^ NEXT.fetch_add(1, Ordering::Relaxed)
}

impl std::fmt::Debug for SoftFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftFabric").finish_non_exhaustive()
    }
}

fn lock(m: &Mutex<Fabric>) -> MutexGuard<'_, Fabric> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl SoftFabric {
    /// A new, empty fabric.
    pub fn new(cfg: SoftConfig) -> SoftFabric {
        SoftFabric {
            inner: Arc::new(Mutex::new(Fabric::new(cfg))),
            id: new_fabric_id(),
        }
    }

    /// Adds a device (a node of the fabric; regions and QPs belong to one).
    pub fn device(&self, name: &str) -> SoftDevice {
        let mut f = lock(&self.inner);
        f.devices.push(name.to_string());
        SoftDevice {
            fabric: self.clone(),
            index: f.devices.len() - 1,
        }
    }

    /// Makes the write on QP `qp_num` that comes after `after` more successful ones complete
    /// with `status` (and the QP go to the error state, as hardware does).
    pub fn inject(&self, qp_num: u32, after: u64, status: WcStatus) -> Result<()> {
        let mut f = lock(&self.inner);
        let qp = f
            .qp(qp_num)
            .ok_or_else(|| Error::Soft(format!("no QP {qp_num:#x} to inject into")))?;
        qp.faults.push_back((after, status));
        Ok(())
    }

    /// Moves QP `qp_num` to the error state now (its outstanding work flushes).
    pub fn fail_qp(&self, qp_num: u32) {
        lock(&self.inner).fail_qp(qp_num);
    }

    /// Writes executed and bytes moved so far.
    pub fn stats(&self) -> (u64, u64) {
        let f = lock(&self.inner);
        (f.writes, f.bytes)
    }
}

/// A device of a [`SoftFabric`].
#[derive(Debug, Clone)]
pub struct SoftDevice {
    fabric: SoftFabric,
    index: usize,
}

impl SoftDevice {
    /// Registers `len` zeroed bytes the fabric owns.
    pub fn register(&self, len: usize) -> SoftMr {
        let mut f = lock(&self.fabric.inner);
        let addr = f.next_addr;
        // Regions sit 4 KiB-aligned with a gap, so an address past one is in no other.
        f.next_addr += (len as u64).div_ceil(4096) * 4096 + 4096;
        self.insert(f, addr, Backing::Owned(vec![0; len]))
    }

    /// Registers `len` bytes of the caller's host memory at `addr` in place (zero copy, as
    /// `ibv_reg_mr`): peers' writes land there, reads take from there.
    ///
    /// # Safety
    /// The range must stay valid for reads and writes until the region is dropped.
    pub unsafe fn register_raw(&self, addr: *mut u8, len: usize) -> SoftMr {
        let backing = Backing::External {
            base: addr as u64,
            len,
            engine: None,
            _dmabuf: None,
        };
        self.insert(lock(&self.fabric.inner), addr as u64, backing)
    }

    /// Registers `len` bytes at `offset` of the dma-buf `fd` (a GPU's memory exported by its
    /// driver), named `iova` in work requests, as `ibv_reg_dmabuf_mr` does. The descriptor
    /// must be a dma-buf whose size covers the range (checked through `/proc/self/fdinfo`, so
    /// a wrong descriptor fails here as on hardware); the region holds a duplicate of it.
    /// The software NIC cannot map the dma-buf: it moves the bytes at `iova` (the memory's
    /// address in this process) through `engine`.
    ///
    /// # Safety
    /// `iova..iova + len` must be the memory the dma-buf range exports, valid until the
    /// region is dropped.
    pub unsafe fn register_dmabuf(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        engine: Arc<dyn DmaEngine>,
    ) -> Result<SoftMr> {
        memory::check_dmabuf(fd, offset, len as u64)?;
        let backing = Backing::External {
            base: iova,
            len,
            engine: Some(engine),
            _dmabuf: Some(memory::hold(fd)?),
        };
        Ok(self.insert(lock(&self.fabric.inner), iova, backing))
    }

    fn insert(&self, mut f: MutexGuard<'_, Fabric>, addr: u64, mem: Backing) -> SoftMr {
        let key = f.next_key;
        f.next_key += 1;
        let len = mem.len() as u64;
        f.mrs.insert(
            key,
            Mr {
                device: self.index,
                addr,
                mem,
            },
        );
        SoftMr {
            fabric: self.fabric.clone(),
            key,
            addr,
            len,
        }
    }

    /// A completion queue.
    pub fn create_cq(&self) -> SoftCq {
        let mut f = lock(&self.fabric.inner);
        f.cqs.push(Cq {
            alive: true,
            ..Cq::default()
        });
        SoftCq {
            fabric: self.fabric.clone(),
            index: f.cqs.len() - 1,
        }
    }

    /// A queue pair completing on `cq`, to be connected with [`SoftQp::connect`].
    pub fn create_qp(&self, cq: &SoftCq) -> SoftQp {
        let mut f = lock(&self.fabric.inner);
        f.qps.push(Some(Qp {
            device: self.index,
            cq: cq.index,
            peer: None,
            state: QpState::Reset,
            sq: Default::default(),
            rq: Default::default(),
            faults: Default::default(),
        }));
        SoftQp {
            fabric: self.fabric.clone(),
            num: QP_BASE + (f.qps.len() - 1) as u32,
            device: self.index,
        }
    }
}

/// A registered region of a software device; deregistered (and freed) on drop.
#[derive(Debug)]
pub struct SoftMr {
    fabric: SoftFabric,
    key: u32,
    addr: u64,
    len: u64,
}

impl SoftMr {
    /// For local work requests.
    pub fn local_key(&self) -> LocalKey {
        LocalKey {
            addr: self.addr,
            len: self.len,
            lkey: self.key,
        }
    }

    /// For the peer.
    pub fn remote_key(&self) -> RemoteKey {
        RemoteKey {
            addr: self.addr,
            len: self.len,
            rkey: self.key,
        }
    }

    /// Copies `buf.len()` bytes at `offset` out (through the region's engine, if any).
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        lock(&self.fabric.inner)
            .host_copy(self.key, offset, ptr, len, false)
            .map_err(|e| Error::Soft(format!("reading region {:#x}: {e}", self.key)))
    }

    /// Copies `buf` in at `offset` (through the region's engine, if any).
    pub fn write(&self, offset: usize, buf: &[u8]) -> Result<()> {
        let (ptr, len) = (buf.as_ptr().cast_mut(), buf.len());
        lock(&self.fabric.inner)
            .host_copy(self.key, offset, ptr, len, true)
            .map_err(|e| Error::Soft(format!("writing region {:#x}: {e}", self.key)))
    }

    /// The whole region.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0; self.len as usize];
        self.read(0, &mut v)?;
        Ok(v)
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        lock(&self.fabric.inner).mrs.remove(&self.key);
    }
}

/// A completion queue of a software device.
#[derive(Debug)]
pub struct SoftCq {
    fabric: SoftFabric,
    index: usize,
}

impl CqOps for SoftCq {
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        let mut f = lock(&self.fabric.inner);
        f.progress();
        Ok(f.take(self.index, out, max))
    }
}

impl Drop for SoftCq {
    fn drop(&mut self) {
        let mut f = lock(&self.fabric.inner);
        if let Some(c) = f.cqs.get_mut(self.index) {
            *c = Cq::default();
        }
    }
}

/// A reliable-connected queue pair of a software device; destroyed on drop (its peer's
/// writes then fail with retry exceeded).
#[derive(Debug)]
pub struct SoftQp {
    fabric: SoftFabric,
    num: u32,
    device: usize,
}

impl SoftQp {
    /// Connection information, as a real QP gives it (LID = device index + 1; the GID's
    /// interface id names the fabric).
    pub fn endpoint(&self) -> QpEndpoint {
        let mut gid = [0u8; 16];
        gid[..8].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
        gid[8..].copy_from_slice(&self.fabric.id.to_be_bytes());
        QpEndpoint {
            qp_num: self.num,
            lid: self.device as u16 + 1,
            gid,
            mtu: 5,
            psn: 0,
        }
    }

    /// Connects to the peer QP `remote` (both sides must connect, as RTR/RTS on hardware).
    pub fn connect(&mut self, remote: &QpEndpoint) -> Result<()> {
        if remote.gid[8..] != self.fabric.id.to_be_bytes() {
            return Err(Error::Soft(format!(
                "connect: QP {:#x} is on another software fabric (another process?): the \
                 software provider reaches only QPs of its own fabric",
                remote.qp_num
            )));
        }
        let mut f = lock(&self.fabric.inner);
        if f.qp(remote.qp_num).is_none() {
            return Err(Error::Soft(format!(
                "connect: no QP {:#x} on the fabric",
                remote.qp_num
            )));
        }
        let qp = f
            .qp(self.num)
            .ok_or_else(|| Error::Soft(format!("QP {:#x} is gone", self.num)))?;
        qp.peer = Some(remote.qp_num);
        qp.state = QpState::Ready;
        Ok(())
    }
}

impl QpOps for SoftQp {
    fn qp_num(&self) -> u32 {
        self.num
    }

    fn post_send(&mut self, wr: &WorkRequest) -> Result<()> {
        self.post_sends(std::slice::from_ref(wr))
    }

    fn post_sends(&mut self, wrs: &[WorkRequest]) -> Result<()> {
        let mut f = lock(&self.fabric.inner);
        let num = self.num;
        let qp = f.qp(num).ok_or_else(|| Error::PostSend {
            qp_num: num,
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        })?;
        if qp.state == QpState::Reset {
            return Err(Error::PostSend {
                qp_num: num,
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
        qp.sq.extend(wrs.iter().copied());
        if !f.active.contains(&num) {
            f.active.push(num);
        }
        Ok(())
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<()> {
        let mut f = lock(&self.fabric.inner);
        let num = self.num;
        let qp = f.qp(num).ok_or_else(|| Error::PostRecv {
            qp_num: num,
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        })?;
        if qp.state == QpState::Error {
            // As verbs: a receive posted in the error state completes flushed.
            let cq = qp.cq;
            f.push_completion(
                cq,
                Completion {
                    wr_id,
                    qp_num: num,
                    status: WcStatus::WrFlush,
                    opcode: crate::provider::WcOpcode::Recv,
                    byte_len: 0,
                    imm: None,
                },
            );
            return Ok(());
        }
        qp.rq.push_back(wr_id);
        // A writer blocked on this receive (RNR) may go on.
        if let Some(peer) = qp.peer {
            if !f.active.contains(&peer) && f.qp(peer).is_some_and(|p| !p.sq.is_empty()) {
                f.active.push(peer);
            }
        }
        Ok(())
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        let mut f = lock(&self.fabric.inner);
        if let Some(slot) = f.qps.get_mut((self.num - QP_BASE) as usize) {
            *slot = None;
        }
        f.active.retain(|&n| n != self.num);
    }
}

/// The software provider.
#[derive(Debug)]
pub enum Soft {}

impl Provider for Soft {
    type Qp = SoftQp;
    type Cq = SoftCq;
}

/// Connects `n` QP pairs between `a` (completing on `cq_a`) and `b` (on `cq_b`).
pub fn connect_pairs(
    a: &SoftDevice,
    cq_a: &SoftCq,
    b: &SoftDevice,
    cq_b: &SoftCq,
    n: usize,
) -> Result<(Vec<SoftQp>, Vec<SoftQp>)> {
    let mut qa: Vec<SoftQp> = (0..n).map(|_| a.create_qp(cq_a)).collect();
    let mut qb: Vec<SoftQp> = (0..n).map(|_| b.create_qp(cq_b)).collect();
    for (x, y) in qa.iter_mut().zip(qb.iter_mut()) {
        let (ex, ey) = (x.endpoint(), y.endpoint());
        x.connect(&ey)?;
        y.connect(&ex)?;
    }
    Ok((qa, qb))
}
