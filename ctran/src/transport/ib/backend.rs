//! What the ib transport needs of an RDMA stack beyond ibverbx's [`Provider`] traits: memory it
//! can register and copy through, a completion queue, and queue pairs it can connect from the
//! peer's endpoint bytes. [`SoftBackend`] implements it over ibverbx's in-process fabric (the
//! only backend that has run: no machine here has an RDMA device); [`super::verbs`] over real
//! verbs.
//!
//! Communicators copy user data through registered staging memory ([`IbMemory`]): their
//! buffers change every operation. Memory registered once for many transfers (the RDMA
//! transfer API's, the GPU progress engine's staging, GPU buffers of sends and receives) is
//! registered in place instead ([`IbBackend::register_user`], `user_memory.rs`, `in_place.rs`).

use std::fmt;

use ibverbx::soft::{Soft, SoftCq, SoftDevice, SoftMr, SoftQp};
use ibverbx::verbs::QpEndpoint;
use ibverbx::{LocalKey, Provider, QpOps, RemoteKey as IbKey};

use super::user_memory::{gpu_dmabuf, CudaCopy, NicRegion, UserDevice};
use crate::span::Span;

/// Registered memory the transport writes from and peers write into.
pub trait IbMemory: Send + fmt::Debug {
    /// For local work requests.
    fn local_key(&self) -> LocalKey;
    /// For the peer.
    fn remote_key(&self) -> IbKey;
    /// Copies `dst.len()` bytes at `offset` of the registration into `dst`.
    fn read_into(&self, offset: usize, dst: Span);
    /// Copies `src` into the registration at `offset`.
    fn write_from(&mut self, offset: usize, src: Span);
    /// Reads `buf.len()` bytes at `offset` (control messages).
    fn read(&self, offset: usize, buf: &mut [u8]);
    /// Writes `buf` at `offset` (control messages).
    fn write(&mut self, offset: usize, buf: &[u8]);
}

/// An RDMA device the transport builds its connections on.
pub trait IbBackend: Send + fmt::Debug + 'static {
    /// The queue pair and completion queue types.
    type P: Provider;
    /// A queue pair created but not yet connected.
    type Unconnected: Send;
    /// Registered memory.
    type Mem: IbMemory;
    /// The caller's memory registered in place.
    type UserMem: NicRegion;

    /// Registers `len` bytes (at least 1).
    fn register(&self, len: usize) -> Result<Self::Mem, ibverbx::Error>;
    /// Registers `len` bytes (at least 1) of the caller's memory at `addr` in place: host
    /// memory as it is, GPU memory through the dma-buf its driver exports (GPUDirect RDMA).
    /// The error says why not (no dma-buf support, the device refused): stage instead.
    ///
    /// # Safety
    /// The range must stay valid memory of `device` until the region is dropped.
    unsafe fn register_user(
        &self,
        addr: u64,
        len: usize,
        device: &UserDevice,
    ) -> Result<Self::UserMem, String>;
    /// A completion queue.
    fn create_cq(&self) -> Result<<Self::P as Provider>::Cq, ibverbx::Error>;
    /// A queue pair completing on `cq`.
    fn create_qp(
        &self,
        cq: &<Self::P as Provider>::Cq,
    ) -> Result<Self::Unconnected, ibverbx::Error>;
    /// What the peer needs to connect to `qp`.
    fn endpoint(&self, qp: &Self::Unconnected) -> Result<QpEndpoint, ibverbx::Error>;
    /// Connects `qp` to the peer's queue pair `remote` (ready to send).
    fn connect(
        &self,
        qp: Self::Unconnected,
        remote: &QpEndpoint,
    ) -> Result<<Self::P as Provider>::Qp, ibverbx::Error>;
}

/// One rank's device on an in-process [`ibverbx::soft::SoftFabric`].
#[derive(Debug, Clone)]
pub struct SoftBackend {
    device: SoftDevice,
}

impl SoftBackend {
    /// Uses `device` (one per rank).
    pub fn new(device: SoftDevice) -> SoftBackend {
        SoftBackend { device }
    }
}

/// A copy in or out of a region the fabric owns fails only for a range past its end: the
/// transport's bug, like an out-of-range slice.
fn owned(r: Result<(), ibverbx::Error>) {
    if let Err(e) = r {
        panic!("ib transport staging: {e}");
    }
}

impl IbMemory for SoftMr {
    fn local_key(&self) -> LocalKey {
        SoftMr::local_key(self)
    }

    fn remote_key(&self) -> IbKey {
        SoftMr::remote_key(self)
    }

    fn read_into(&self, offset: usize, dst: Span) {
        if dst.is_empty() {
            return;
        }
        // SAFETY: the transport passes only spans its callers keep valid and unaliased while
        // their request is pending (Transport::post_recv) or their region is registered
        // (Transport::register_region); the slice lives only for this call.
        unsafe { dst.with_mut_slice(|b| owned(SoftMr::read(self, offset, b))) }
    }

    fn write_from(&mut self, offset: usize, src: Span) {
        if src.is_empty() {
            return;
        }
        // SAFETY: as in `read_into`: the span is valid while its send is pending
        // (Transport::post_send); the slice lives only for this call.
        unsafe { src.with_slice(|b| owned(SoftMr::write(self, offset, b))) }
    }

    fn read(&self, offset: usize, buf: &mut [u8]) {
        owned(SoftMr::read(self, offset, buf))
    }

    fn write(&mut self, offset: usize, buf: &[u8]) {
        owned(SoftMr::write(self, offset, buf))
    }
}

impl IbBackend for SoftBackend {
    type P = Soft;
    type Unconnected = SoftQp;
    type Mem = SoftMr;
    type UserMem = SoftMr;

    fn register(&self, len: usize) -> Result<SoftMr, ibverbx::Error> {
        Ok(self.device.register(len.max(1)))
    }

    unsafe fn register_user(
        &self,
        addr: u64,
        len: usize,
        device: &UserDevice,
    ) -> Result<SoftMr, String> {
        match device {
            // SAFETY: forwarded to the caller.
            UserDevice::Host => Ok(unsafe { self.device.register_raw(addr as *mut u8, len) }),
            UserDevice::Cuda(ctx) => {
                let buf = gpu_dmabuf(ctx, addr, len as u64)?;
                let engine = std::sync::Arc::new(CudaCopy(std::sync::Arc::clone(ctx)));
                let offset = buf.offset_of(addr);
                use std::os::fd::AsFd;
                // SAFETY: the dma-buf exports exactly the pages of this range, which the
                // caller keeps valid while registered.
                unsafe {
                    self.device
                        .register_dmabuf(buf.fd.as_fd(), offset, len, addr, engine)
                }
                .map_err(|e| e.to_string())
            }
        }
    }

    fn create_cq(&self) -> Result<SoftCq, ibverbx::Error> {
        Ok(self.device.create_cq())
    }

    fn create_qp(&self, cq: &SoftCq) -> Result<SoftQp, ibverbx::Error> {
        Ok(self.device.create_qp(cq))
    }

    fn endpoint(&self, qp: &SoftQp) -> Result<QpEndpoint, ibverbx::Error> {
        Ok(qp.endpoint())
    }

    fn connect(&self, mut qp: SoftQp, remote: &QpEndpoint) -> Result<SoftQp, ibverbx::Error> {
        qp.connect(remote)?;
        debug_assert_eq!(QpOps::qp_num(&qp), qp.endpoint().qp_num);
        Ok(qp)
    }
}
