//! An open device (`ibv_context`) and a protection domain (`ibv_pd`).

use std::sync::Arc;

use crate::error::{errno, rc_error, Error, Result};
use crate::loader::Symbols;
use crate::sys;
use crate::verbs::Device;

pub(crate) struct ContextInner {
    pub(crate) raw: *mut sys::ibv_context,
    pub(crate) name: String,
    pub(crate) syms: &'static Symbols,
    /// The device's Data Direct sysfs path (an mlx5 NIC with its own PCIe path to the GPU).
    pub(crate) data_direct: Option<String>,
}

// SAFETY: rdma-core's verbs are thread safe (the library and providers lock internally); the
// pointer is owned by this value and freed once in Drop.
unsafe impl Send for ContextInner {}
// SAFETY: as above.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: opened by `ibv_open_device`, closed once; every child holds an `Arc` of
        // this value, so none is left when it runs.
        let rc = unsafe { (self.syms.close_device)(self.raw) };
        if rc != 0 {
            tracing::warn!(device = %self.name, "ibv_close_device failed: {}", rc_error(rc));
        }
    }
}

/// An open RDMA device. Cheap to clone (shared); closed when the last clone and every object
/// made from it are dropped.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.inner.name)
            .finish()
    }
}

/// What `ibv_query_device` says that this crate uses.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// Firmware version.
    pub fw_ver: String,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
    /// Most QPs.
    pub max_qp: i32,
    /// Most outstanding work requests per QP.
    pub max_qp_wr: i32,
    /// Most CQ entries.
    pub max_cqe: i32,
    /// Largest memory region.
    pub max_mr_size: u64,
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand (LID routed).
    Infiniband,
    /// Ethernet: RoCE (GID routed).
    Ethernet,
    /// Not reported.
    Unspecified,
}

/// What `ibv_query_port` says that this crate uses.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// Whether the port is active.
    pub active: bool,
    /// Active MTU (verbs' enum: 1 = 256 ... 5 = 4096).
    pub active_mtu: u8,
    /// Local identifier (0 on RoCE).
    pub lid: u16,
    /// Entries of the GID table.
    pub gid_tbl_len: i32,
    /// Link layer.
    pub link_layer: LinkLayer,
}

impl Context {
    /// Opens `device`.
    pub fn open(device: &Device<'_>) -> Result<Context> {
        let syms = crate::loader::symbols()?;
        let name = device.name();
        // SAFETY: the device pointer is live while its list is (the borrow of `device`).
        let raw = unsafe { (syms.open_device)(device.as_raw()) };
        if raw.is_null() {
            return Err(Error::OpenDevice {
                device: name,
                source: errno(),
            });
        }
        let data_direct = crate::mlx5dv::data_direct_path(device.as_raw(), raw);
        if let Some(path) = &data_direct {
            tracing::info!(device = %name, "Data Direct at {path}");
        }
        Ok(Context {
            inner: Arc::new(ContextInner {
                raw,
                name,
                syms,
                data_direct,
            }),
        })
    }

    /// The device's Data Direct sysfs path, where libmlx5 reports one: GPU memory is then
    /// registered for Data Direct ([`crate::verbs::MemoryRegion::register_dmabuf`]).
    pub fn data_direct(&self) -> Option<&str> {
        self.inner.data_direct.as_deref()
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The raw context (escape hatch; valid while `self` lives).
    pub fn as_raw(&self) -> *mut sys::ibv_context {
        self.inner.raw
    }

    /// Device attributes.
    pub fn query_device(&self) -> Result<DeviceAttr> {
        // SAFETY: all-zero is a valid `ibv_device_attr` (integers and a char array).
        let mut attr: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, valid out-pointer of the declared layout.
        let rc = unsafe { (self.inner.syms.query_device)(self.inner.raw, &mut attr) };
        if rc != 0 {
            return Err(Error::QueryDevice {
                device: self.inner.name.clone(),
                source: rc_error(rc),
            });
        }
        let fw: Vec<u8> = attr
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Ok(DeviceAttr {
            fw_ver: String::from_utf8_lossy(&fw).into_owned(),
            phys_port_cnt: attr.phys_port_cnt,
            max_qp: attr.max_qp,
            max_qp_wr: attr.max_qp_wr,
            max_cqe: attr.max_cqe,
            max_mr_size: attr.max_mr_size,
        })
    }

    /// Port attributes (ports count from 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        // SAFETY: all-zero is a valid `ibv_port_attr`.
        let mut attr: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context; the exported `ibv_query_port` fills the compat prefix of the
        // (larger, zeroed) structure.
        let rc = unsafe { (self.inner.syms.query_port)(self.inner.raw, port, &mut attr) };
        if rc != 0 {
            return Err(Error::QueryPort {
                device: self.inner.name.clone(),
                port,
                source: rc_error(rc),
            });
        }
        Ok(PortAttr {
            active: attr.state == sys::IBV_PORT_ACTIVE,
            active_mtu: u8::try_from(attr.active_mtu).unwrap_or(0),
            lid: attr.lid,
            gid_tbl_len: attr.gid_tbl_len,
            link_layer: match attr.link_layer {
                sys::IBV_LINK_LAYER_INFINIBAND => LinkLayer::Infiniband,
                sys::IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
                _ => LinkLayer::Unspecified,
            },
        })
    }

    /// GID `index` of `port` (16 bytes, network order; all zero for an empty entry).
    pub fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16]> {
        let mut gid = sys::ibv_gid::default();
        let idx = libc::c_int::try_from(index).unwrap_or(libc::c_int::MAX);
        // SAFETY: live context, valid out-pointer.
        let rc = unsafe { (self.inner.syms.query_gid)(self.inner.raw, port, idx, &mut gid) };
        if rc != 0 {
            return Err(Error::QueryGid {
                device: self.inner.name.clone(),
                port,
                index,
                source: rc_error(rc),
            });
        }
        Ok(gid.raw)
    }

    /// The GID index to use on `port`: `configured` when given; on Ethernet the first
    /// RoCE v2 entry (from sysfs `gid_attrs/types`), else 0.
    pub fn pick_gid_index(&self, port: u8, configured: Option<u8>) -> Result<u8> {
        if let Some(i) = configured {
            return Ok(i);
        }
        let attr = self.query_port(port)?;
        if attr.link_layer != LinkLayer::Ethernet {
            return Ok(0);
        }
        let n = attr.gid_tbl_len.clamp(0, 256);
        for i in 0..n {
            let path = format!(
                "/sys/class/infiniband/{}/ports/{port}/gid_attrs/types/{i}",
                self.inner.name
            );
            let Ok(kind) = std::fs::read_to_string(&path) else {
                continue;
            };
            let gid = self.query_gid(port, i as u32)?;
            if kind.trim().eq_ignore_ascii_case("RoCE v2") && gid != [0; 16] {
                return Ok(i as u8);
            }
        }
        Ok(0)
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        // SAFETY: live context.
        let raw = unsafe { (self.inner.syms.alloc_pd)(self.inner.raw) };
        if raw.is_null() {
            return Err(Error::AllocPd {
                device: self.inner.name.clone(),
                source: errno(),
            });
        }
        Ok(ProtectionDomain {
            inner: Arc::new(PdInner {
                raw,
                ctx: self.clone(),
            }),
        })
    }
}

pub(crate) struct PdInner {
    pub(crate) raw: *mut sys::ibv_pd,
    pub(crate) ctx: Context,
}

// SAFETY: as for `ContextInner`: verbs objects may be used from any thread.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: allocated by `ibv_alloc_pd`, freed once after every MR and QP of it (they
        // hold an `Arc` of this value).
        let rc = unsafe { (self.ctx.inner.syms.dealloc_pd)(self.raw) };
        if rc != 0 {
            tracing::warn!(device = %self.ctx.inner.name, "ibv_dealloc_pd failed: {}", rc_error(rc));
        }
    }
}

/// A protection domain: memory regions and queue pairs of one domain may work together.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.inner.ctx.inner.name)
            .finish()
    }
}

impl ProtectionDomain {
    /// The device context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The raw PD (escape hatch; valid while `self` lives).
    pub fn as_raw(&self) -> *mut sys::ibv_pd {
        self.inner.raw
    }
}
