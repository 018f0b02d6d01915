//! [`IbBackend`] over real verbs (`ibverbx::verbs`). Compiled and type-checked here, never run:
//! no machine this was built on has an RDMA device (docs/ib.md, "What never ran on hardware").
//!
//! Staging memory is owned by its registration ([`MemoryRegion::new`]), so copies in and out
//! are plain slice copies; a queue pair goes RESET → INIT when created and INIT → RTR → RTS
//! when the peer's endpoint arrives, with the path settings of `CTRAN_IB_*`.

use ibverbx::verbs::{
    CompletionQueue, Context, DeviceList, Init, MemoryRegion, PathConfig, ProtectionDomain, QpCaps,
    QpEndpoint, QueuePair, Rts, Verbs, DEFAULT_ACCESS,
};
use ibverbx::{IbConfig, LocalKey, RemoteKey as IbKey};

use super::backend::{IbBackend, IbMemory};
use super::user_memory::{gpu_dmabuf, UserDevice};
use crate::span::Span;

/// One port of an RDMA device, with the protection domain every registration of the
/// transport uses.
#[derive(Debug)]
pub struct VerbsBackend {
    pd: ProtectionDomain,
    port: u8,
    path: PathConfig,
    caps: QpCaps,
    cqe: u32,
}

impl VerbsBackend {
    /// Opens port `port` of device `device` for a transport with `peers` peers, with the
    /// settings of `cfg` (GID index, path, QPs per connection and their outstanding limit).
    pub fn open(
        device: &str,
        port: u8,
        cfg: &IbConfig,
        peers: usize,
    ) -> Result<VerbsBackend, ibverbx::Error> {
        let list = DeviceList::get()?;
        let dev = list
            .iter()
            .find(|d| d.name() == device)
            .ok_or_else(|| ibverbx::Error::BadConfig(format!("no RDMA device {device}")))?;
        let ctx = Context::open(&dev)?;
        let attr = ctx.query_device()?;
        let gid_index = ctx.pick_gid_index(port, cfg.gid_index)?;
        let per_qp = cfg.vqp.max_msgs_per_qp;
        // Every QP has at most `per_qp` writes and `per_qp` receives outstanding, all
        // completing on the one queue.
        let want = peers as u64 * cfg.qps_per_connection as u64 * 2 * u64::from(per_qp);
        let max = u64::try_from(attr.max_cqe).unwrap_or(0).max(1);
        Ok(VerbsBackend {
            pd: ctx.alloc_pd()?,
            port,
            path: PathConfig {
                gid_index,
                ..cfg.path
            },
            caps: QpCaps {
                max_send_wr: per_qp,
                max_recv_wr: per_qp,
            },
            cqe: want.clamp(1, max) as u32,
        })
    }
}

impl IbMemory for MemoryRegion {
    fn local_key(&self) -> LocalKey {
        MemoryRegion::local_key(self)
    }

    fn remote_key(&self) -> IbKey {
        MemoryRegion::remote_key(self)
    }

    fn read_into(&self, offset: usize, dst: Span) {
        if let Some(b) = self.as_slice() {
            dst.copy_from_slice(&b[offset..offset + dst.len()]);
        }
    }

    fn write_from(&mut self, offset: usize, src: Span) {
        if let Some(b) = self.as_mut_slice() {
            src.copy_to_slice(&mut b[offset..offset + src.len()]);
        }
    }

    fn read(&self, offset: usize, buf: &mut [u8]) {
        if let Some(b) = self.as_slice() {
            buf.copy_from_slice(&b[offset..offset + buf.len()]);
        }
    }

    fn write(&mut self, offset: usize, buf: &[u8]) {
        if let Some(b) = self.as_mut_slice() {
            b[offset..offset + buf.len()].copy_from_slice(buf);
        }
    }
}

impl IbBackend for VerbsBackend {
    type P = Verbs;
    type Unconnected = QueuePair<Init>;
    type Mem = MemoryRegion;
    type UserMem = MemoryRegion;

    fn register(&self, len: usize) -> Result<MemoryRegion, ibverbx::Error> {
        MemoryRegion::new(&self.pd, len.max(1), DEFAULT_ACCESS)
    }

    unsafe fn register_user(
        &self,
        addr: u64,
        len: usize,
        device: &UserDevice,
    ) -> Result<MemoryRegion, String> {
        let r = match device {
            // SAFETY: forwarded to the caller.
            UserDevice::Host => unsafe {
                MemoryRegion::register_raw(&self.pd, addr as *mut u8, len, DEFAULT_ACCESS)
            },
            UserDevice::Cuda(ctx) => {
                let buf = gpu_dmabuf(ctx, addr, len as u64)?;
                use std::os::fd::AsRawFd;
                // SAFETY: the dma-buf exports the pages of this range, which the caller keeps
                // valid while registered; the NIC names it by its device address.
                unsafe {
                    MemoryRegion::register_dmabuf(
                        &self.pd,
                        buf.fd.as_raw_fd(),
                        buf.offset_of(addr),
                        len,
                        addr,
                        DEFAULT_ACCESS,
                    )
                }
            }
        };
        r.map_err(|e| e.to_string())
    }

    fn create_cq(&self) -> Result<CompletionQueue, ibverbx::Error> {
        CompletionQueue::new(self.pd.context(), self.cqe)
    }

    fn create_qp(&self, cq: &CompletionQueue) -> Result<QueuePair<Init>, ibverbx::Error> {
        QueuePair::new(&self.pd, cq, self.port, self.caps)?.to_init()
    }

    fn endpoint(&self, qp: &QueuePair<Init>) -> Result<QpEndpoint, ibverbx::Error> {
        qp.endpoint(self.path.gid_index)
    }

    fn connect(
        &self,
        qp: QueuePair<Init>,
        remote: &QpEndpoint,
    ) -> Result<QueuePair<Rts>, ibverbx::Error> {
        qp.to_rtr(remote, &self.path)?.to_rts(&self.path)
    }
}
