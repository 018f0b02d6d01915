//! Memory regions (`ibv_mr`): host memory owned by the region, raw host memory, and dma-buf
//! (GPU) memory through the optional `ibv_reg_dmabuf_mr`.

use std::ffi::c_void;

use crate::error::{errno, rc_error, Error, Result};
use crate::provider::{LocalKey, RemoteKey};
use crate::sys;
use crate::verbs::ProtectionDomain;

/// Access rights of a region: local write, remote write and remote read (what puts and gets
/// need on either side).
pub const DEFAULT_ACCESS: i32 =
    sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ;

/// A registered memory region. It owns its host buffer when made by [`MemoryRegion::new`];
/// deregistration happens before the buffer is freed, so the NIC never touches freed memory.
pub struct MemoryRegion {
    raw: *mut sys::ibv_mr,
    pd: ProtectionDomain,
    // Kept for the region's life (the NIC reads and writes it); `None` for raw and dma-buf
    // regions, whose memory the caller keeps.
    buf: Option<Box<[u8]>>,
}

// SAFETY: the region's pointer is owned by this value; verbs objects may be used from any
// thread, and the owned buffer is only reached through `&mut self` or raw pointers.
unsafe impl Send for MemoryRegion {}
// SAFETY: `&MemoryRegion` gives out keys and a raw pointer only.
unsafe impl Sync for MemoryRegion {}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("local", &self.local_key())
            .finish()
    }
}

impl MemoryRegion {
    /// Allocates `len` zeroed bytes and registers them with `access` (e.g. [`DEFAULT_ACCESS`]).
    pub fn new(pd: &ProtectionDomain, len: usize, access: i32) -> Result<MemoryRegion> {
        let mut buf = vec![0u8; len.max(1)].into_boxed_slice();
        // SAFETY: the buffer is owned by the region and outlives the registration (Drop
        // deregisters before the box is freed).
        let mut mr = unsafe { Self::register_raw(pd, buf.as_mut_ptr(), len.max(1), access)? };
        mr.buf = Some(buf);
        Ok(mr)
    }

    /// Registers caller-owned host memory.
    ///
    /// # Safety
    /// `addr..addr + len` must be valid memory that stays allocated, and that nothing else
    /// relies on not changing (a remote peer may write it), until the region is dropped.
    pub unsafe fn register_raw(
        pd: &ProtectionDomain,
        addr: *mut u8,
        len: usize,
        access: i32,
    ) -> Result<MemoryRegion> {
        let syms = pd.inner.ctx.inner.syms;
        // SAFETY: live PD; the caller vouches for the memory.
        let raw = unsafe { (syms.reg_mr)(pd.inner.raw, addr.cast::<c_void>(), len, access) };
        Self::registered(pd, raw, "ibv_reg_mr", len)
    }

    /// Registers `len` bytes at `offset` of a dma-buf (e.g. GPU memory exported by
    /// `cuMemGetHandleForAddressRange`), addressed by the NIC as `iova`.
    ///
    /// On a device with Data Direct ([`crate::verbs::Context::data_direct`]) and a libmlx5
    /// that registers for it, `mlx5dv_reg_dmabuf_mr` with Data Direct access does, unless
    /// `CTRAN_IB_DATA_DIRECT` is off; otherwise `ibv_reg_dmabuf_mr`.
    ///
    /// Returns [`Error::Unsupported`] when libibverbs predates rdma-core 34.
    ///
    /// # Safety
    /// `fd` must be a dma-buf file descriptor whose memory stays allocated until the region
    /// is dropped.
    pub unsafe fn register_dmabuf(
        pd: &ProtectionDomain,
        fd: i32,
        offset: u64,
        len: usize,
        iova: u64,
        access: i32,
    ) -> Result<MemoryRegion> {
        let ctx = &pd.inner.ctx.inner;
        // libmlx5's registration, where it also offers Data Direct.
        let data_direct_reg = crate::mlx5dv::mlx5dv()
            .ok()
            .filter(|m| m.has_data_direct())
            .and_then(|m| m.reg_dmabuf_mr);
        let route = crate::mlx5dv::dmabuf_registration(
            ctx.data_direct.is_some(),
            data_direct_reg.is_some(),
            torchcomms_cvars::current().ctran_ib_data_direct(),
        );
        if let (crate::mlx5dv::DmabufRegistration::DataDirect, Some(reg)) = (route, data_direct_reg)
        {
            let dd = crate::mlx5dv::REG_DMABUF_ACCESS_DATA_DIRECT;
            // SAFETY: live PD; the caller vouches for the dma-buf.
            let raw = unsafe { reg(pd.inner.raw, offset, len, iova, fd, access, dd) };
            return Self::registered(pd, raw, "mlx5dv_reg_dmabuf_mr", len);
        }
        let syms = ctx.syms;
        let Some(reg) = syms.reg_dmabuf_mr else {
            return Err(Error::Unsupported {
                symbol: "ibv_reg_dmabuf_mr",
            });
        };
        // SAFETY: live PD; the caller vouches for the dma-buf.
        let raw = unsafe { reg(pd.inner.raw, offset, len, iova, fd, access) };
        Self::registered(pd, raw, "ibv_reg_dmabuf_mr", len)
    }

    /// The region a registration call returned, or its failure (errno) when it returned NULL.
    fn registered(
        pd: &ProtectionDomain,
        raw: *mut sys::ibv_mr,
        call: &'static str,
        len: usize,
    ) -> Result<MemoryRegion> {
        if raw.is_null() {
            return Err(Error::RegMr {
                call,
                device: pd.inner.ctx.inner.name.clone(),
                len,
                source: errno(),
            });
        }
        Ok(MemoryRegion {
            raw,
            pd: pd.clone(),
            buf: None,
        })
    }

    fn mr(&self) -> &sys::ibv_mr {
        // SAFETY: `raw` is a live region owned by `self`.
        unsafe { &*self.raw }
    }

    /// What a local work request names: address, length, lkey.
    pub fn local_key(&self) -> LocalKey {
        let mr = self.mr();
        LocalKey {
            addr: mr.addr as u64,
            len: mr.length as u64,
            lkey: mr.lkey,
        }
    }

    /// What a peer needs to write here: address, length, rkey (serialisable).
    pub fn remote_key(&self) -> RemoteKey {
        let mr = self.mr();
        RemoteKey {
            addr: mr.addr as u64,
            len: mr.length as u64,
            rkey: mr.rkey,
        }
    }

    /// The owned buffer, when the region owns one. A peer may write it at any time: read it
    /// once the write's notification arrived.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        self.buf.as_deref_mut()
    }

    /// The owned buffer, read-only (see [`MemoryRegion::as_mut_slice`]).
    pub fn as_slice(&self) -> Option<&[u8]> {
        self.buf.as_deref()
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The raw region (escape hatch; valid while `self` lives).
    pub fn as_raw(&self) -> *mut sys::ibv_mr {
        self.raw
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered once, deregistered once, before `buf` is freed (fields drop
        // after this body).
        let rc = unsafe { (self.pd.inner.ctx.inner.syms.dereg_mr)(self.raw) };
        if rc != 0 {
            tracing::warn!(device = %self.pd.inner.ctx.inner.name, "ibv_dereg_mr failed: {}", rc_error(rc));
        }
    }
}
