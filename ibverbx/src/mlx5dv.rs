//! mlx5 direct verbs (`libmlx5`), loaded at run time where present, as upstream's ibverbx and
//! NCCL load it. Its one use here is Data Direct: a ConnectX NIC that reaches GPU memory over a
//! PCIe path of its own registers a dma-buf with `mlx5dv_reg_dmabuf_mr` and
//! `MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT`, which plain `ibv_reg_dmabuf_mr` cannot ask for.
//! A machine without libmlx5, with an older one (rdma-core before 52 lacks both Data Direct
//! calls) or with another vendor's NIC registers dma-bufs through plain verbs.
//!
//! The library is opened once, from `TORCHCOMMS_MLX5_LIB` when set, else `libmlx5.so.1`, else
//! `libmlx5.so`; failing is a value (the reason), never a panic.

use std::ffi::{c_char, c_int};
use std::sync::OnceLock;

use crate::sys;

/// `MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT` (infiniband/mlx5dv.h).
pub const REG_DMABUF_ACCESS_DATA_DIRECT: c_int = 1;

type IsSupportedFn = unsafe extern "C" fn(*mut sys::ibv_device) -> bool;
type DataDirectPathFn = unsafe extern "C" fn(*mut sys::ibv_context, *mut c_char, usize) -> c_int;
type RegDmabufMrFn = unsafe extern "C" fn(
    *mut sys::ibv_pd,
    u64,
    usize,
    u64,
    c_int,
    c_int,
    c_int,
) -> *mut sys::ibv_mr;

/// The functions of libmlx5 this crate calls.
#[derive(Debug)]
pub struct Mlx5dv {
    /// Where the library was found.
    pub path: String,
    pub(crate) is_supported: IsSupportedFn,
    /// rdma-core 52 and later.
    pub(crate) data_direct_path: Option<DataDirectPathFn>,
    /// rdma-core 52 and later.
    pub(crate) reg_dmabuf_mr: Option<RegDmabufMrFn>,
    // Kept open for the life of the process: the function pointers above point into it.
    _lib: libloading::Library,
}

impl Mlx5dv {
    /// Whether this libmlx5 can register for Data Direct (both calls present).
    pub fn has_data_direct(&self) -> bool {
        self.data_direct_path.is_some() && self.reg_dmabuf_mr.is_some()
    }
}

static MLX5: OnceLock<Result<Mlx5dv, String>> = OnceLock::new();

fn candidates() -> Vec<String> {
    match torchcomms_cvars::current().torchcomms_mlx5_lib() {
        Some(p) if !p.trim().is_empty() => vec![p.to_string()],
        _ => vec!["libmlx5.so.1".into(), "libmlx5.so".into()],
    }
}

/// The process's libmlx5, loaded on first use, or why there is none.
pub fn mlx5dv() -> Result<&'static Mlx5dv, String> {
    MLX5.get_or_init(|| load(&candidates()))
        .as_ref()
        .map_err(Clone::clone)
}

/// Opens the first of `paths` that loads and looks its symbols up (not cached: the
/// process-wide copy is [`mlx5dv`]).
pub fn load(paths: &[String]) -> Result<Mlx5dv, String> {
    let mut tried = Vec::new();
    for path in paths {
        // SAFETY: libmlx5's constructors register the mlx5 provider with libibverbs (which it
        // links); loading it is what every mlx5dv user does.
        let lib = match unsafe { libloading::Library::new(path) } {
            Ok(lib) => lib,
            Err(e) => {
                let detail = std::error::Error::source(&e).map(|s| format!(" ({s})"));
                tried.push(format!("{path}: {e}{}", detail.unwrap_or_default()));
                continue;
            }
        };
        // SAFETY: the C types are those of infiniband/mlx5dv.h (rdma-core 52).
        let is_supported = match unsafe { lib.get::<IsSupportedFn>(b"mlx5dv_is_supported\0") } {
            Ok(f) => *f,
            Err(e) => return Err(format!("libmlx5 at {path} lacks mlx5dv_is_supported: {e}")),
        };
        // SAFETY: as above; missing optional symbols are `None`.
        let data_direct_path =
            unsafe { lib.get::<DataDirectPathFn>(b"mlx5dv_get_data_direct_sysfs_path\0") }
                .ok()
                .map(|f| *f);
        // SAFETY: as above.
        let reg_dmabuf_mr = unsafe { lib.get::<RegDmabufMrFn>(b"mlx5dv_reg_dmabuf_mr\0") }
            .ok()
            .map(|f| *f);
        return Ok(Mlx5dv {
            path: path.clone(),
            is_supported,
            data_direct_path,
            reg_dmabuf_mr,
            _lib: lib,
        });
    }
    Err(format!("libmlx5 not found: {}", tried.join("; ")))
}

/// How GPU memory (a dma-buf) is registered on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DmabufRegistration {
    /// `ibv_reg_dmabuf_mr`.
    Verbs,
    /// `mlx5dv_reg_dmabuf_mr` with `MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT`.
    DataDirect,
}

/// The registration a device uses: Data Direct where the device has a Data Direct path,
/// libmlx5 can register with it and `CTRAN_IB_DATA_DIRECT` allows it; plain verbs otherwise.
pub fn dmabuf_registration(
    device_has_data_direct: bool,
    mlx5_registers_data_direct: bool,
    allowed: bool,
) -> DmabufRegistration {
    if device_has_data_direct && mlx5_registers_data_direct && allowed {
        DmabufRegistration::DataDirect
    } else {
        DmabufRegistration::Verbs
    }
}

/// The Data Direct sysfs path of an open mlx5 device, if it has one (`device` and `ctx` are
/// live: the device the context was opened on).
pub(crate) fn data_direct_path(
    device: *mut sys::ibv_device,
    ctx: *mut sys::ibv_context,
) -> Option<String> {
    let mlx5 = mlx5dv().ok()?;
    let query = mlx5.data_direct_path?;
    // SAFETY: a live device of this process's libibverbs.
    if !unsafe { (mlx5.is_supported)(device) } {
        return None;
    }
    let mut buf = [0 as c_char; 256];
    // SAFETY: a live context; the buffer's length is passed.
    let rc = unsafe { query(ctx, buf.as_mut_ptr(), buf.len()) };
    if rc != 0 {
        return None;
    }
    // A path that filled the buffer is cut rather than read past its end.
    buf[buf.len() - 1] = 0;
    // SAFETY: NUL-terminated within the buffer (the line above).
    let path = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(path.to_string_lossy().into_owned())
}
