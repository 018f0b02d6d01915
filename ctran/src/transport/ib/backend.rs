//! What the ib transport needs of an RDMA stack beyond ibverbx's [`Provider`] traits: memory it
//! can register and copy through, a completion queue, and queue pairs it can connect from the
//! peer's endpoint bytes. [`SoftBackend`] implements it over ibverbx's in-process fabric (the
//! only backend that has run: no machine here has an RDMA device); [`super::verbs`] over real
//! verbs.
//!
//! The transport copies user data through registered staging memory ([`IbMemory`]) rather
//! than registering user buffers: the software fabric owns its memory (it cannot register a
//! caller's buffer), and a staging copy keeps one code path for both providers. Registering
//! user memory directly (zero copy) is a later step for the verbs backend.

use std::fmt;

use ibverbx::soft::{Soft, SoftCq, SoftDevice, SoftMr, SoftQp};
use ibverbx::verbs::QpEndpoint;
use ibverbx::{LocalKey, Provider, QpOps, RemoteKey as IbKey};

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

    /// Registers `len` bytes (at least 1).
    fn register(&self, len: usize) -> Result<Self::Mem, ibverbx::Error>;
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
        unsafe { dst.with_mut_slice(|b| SoftMr::read(self, offset, b)) }
    }

    fn write_from(&mut self, offset: usize, src: Span) {
        if src.is_empty() {
            return;
        }
        // SAFETY: as in `read_into`: the span is valid while its send is pending
        // (Transport::post_send); the slice lives only for this call.
        unsafe { src.with_slice(|b| SoftMr::write(self, offset, b)) }
    }

    fn read(&self, offset: usize, buf: &mut [u8]) {
        SoftMr::read(self, offset, buf)
    }

    fn write(&mut self, offset: usize, buf: &[u8]) {
        SoftMr::write(self, offset, buf)
    }
}

impl IbBackend for SoftBackend {
    type P = Soft;
    type Unconnected = SoftQp;
    type Mem = SoftMr;

    fn register(&self, len: usize) -> Result<SoftMr, ibverbx::Error> {
        Ok(self.device.register(len.max(1)))
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
