//! Run-time loading of libibverbs: one look-up per process, failing as a value.
//!
//! The library is opened once (`OnceLock<Result<Symbols, LoadError>>`), from
//! `TORCHCOMMS_IBVERBS_LIB` when set, else `libibverbs.so.1` (the ABI-stable soname every
//! distribution ships), else `libibverbs.so`. Required symbols missing make the whole library
//! unusable; optional ones (`ibv_reg_dmabuf_mr`, rdma-core 34+) are `None` and the call that
//! needs them returns [`Error::Unsupported`](crate::Error::Unsupported). Nothing here panics.

use std::sync::OnceLock;

use crate::error::LoadError;
use crate::sys;

/// The functions of libibverbs this crate calls, looked up once.
#[derive(Debug)]
pub struct Symbols {
    /// Where the library was found.
    pub path: String,
    pub(crate) get_device_list: sys::ibv_get_device_list_fn,
    pub(crate) free_device_list: sys::ibv_free_device_list_fn,
    pub(crate) open_device: sys::ibv_open_device_fn,
    pub(crate) close_device: sys::ibv_close_device_fn,
    pub(crate) query_device: sys::ibv_query_device_fn,
    pub(crate) query_port: sys::ibv_query_port_fn,
    pub(crate) query_gid: sys::ibv_query_gid_fn,
    pub(crate) alloc_pd: sys::ibv_alloc_pd_fn,
    pub(crate) dealloc_pd: sys::ibv_dealloc_pd_fn,
    pub(crate) reg_mr: sys::ibv_reg_mr_fn,
    pub(crate) dereg_mr: sys::ibv_dereg_mr_fn,
    pub(crate) create_cq: sys::ibv_create_cq_fn,
    pub(crate) destroy_cq: sys::ibv_destroy_cq_fn,
    pub(crate) create_qp: sys::ibv_create_qp_fn,
    pub(crate) modify_qp: sys::ibv_modify_qp_fn,
    pub(crate) destroy_qp: sys::ibv_destroy_qp_fn,
    /// Optional: rdma-core 34 and later.
    pub(crate) reg_dmabuf_mr: Option<sys::ibv_reg_dmabuf_mr_fn>,
    // Kept open for the life of the process: the function pointers above point into it.
    _lib: libloading::Library,
}

static SYMBOLS: OnceLock<Result<Symbols, LoadError>> = OnceLock::new();

/// The library candidates, in order: the override, then the sonames.
fn candidates() -> Vec<String> {
    match torchcomms_cvars::current().torchcomms_ibverbs_lib() {
        Some(p) if !p.trim().is_empty() => vec![p.to_string()],
        _ => vec!["libibverbs.so.1".into(), "libibverbs.so".into()],
    }
}

/// The process's libibverbs, loaded on first use.
pub fn symbols() -> Result<&'static Symbols, LoadError> {
    SYMBOLS
        .get_or_init(|| load(&candidates()))
        .as_ref()
        .map_err(Clone::clone)
}

/// Opens the first of `paths` that loads and looks its symbols up (not cached: the
/// process-wide copy is [`symbols`]).
pub fn load(paths: &[String]) -> Result<Symbols, LoadError> {
    let mut tried = Vec::new();
    for path in paths {
        // SAFETY: opening libibverbs runs its constructors, which only register providers;
        // loading it is what every verbs user does.
        match unsafe { libloading::Library::new(path) } {
            Ok(lib) => return resolve(path, lib),
            Err(e) => {
                // libloading keeps dlerror()'s text in the source.
                let detail = std::error::Error::source(&e).map(|s| format!(" ({s})"));
                tried.push(format!("{path}: {e}{}", detail.unwrap_or_default()));
            }
        }
    }
    Err(LoadError::NotFound {
        tried: tried.join("; "),
    })
}

fn resolve(path: &str, lib: libloading::Library) -> Result<Symbols, LoadError> {
    macro_rules! required {
        ($name:literal, $ty:ty) => {{
            // SAFETY: the symbol's C type is the one declared in `sys` after verbs.h.
            match unsafe { lib.get::<$ty>(concat!($name, "\0").as_bytes()) } {
                Ok(f) => *f,
                Err(e) => {
                    return Err(LoadError::MissingSymbol {
                        path: path.to_string(),
                        symbol: $name,
                        message: e.to_string(),
                    })
                }
            }
        }};
    }
    // SAFETY: as above; a missing optional symbol is `None`.
    let reg_dmabuf_mr = unsafe { lib.get::<sys::ibv_reg_dmabuf_mr_fn>(b"ibv_reg_dmabuf_mr\0") }
        .ok()
        .map(|f| *f);
    Ok(Symbols {
        path: path.to_string(),
        get_device_list: required!("ibv_get_device_list", sys::ibv_get_device_list_fn),
        free_device_list: required!("ibv_free_device_list", sys::ibv_free_device_list_fn),
        open_device: required!("ibv_open_device", sys::ibv_open_device_fn),
        close_device: required!("ibv_close_device", sys::ibv_close_device_fn),
        query_device: required!("ibv_query_device", sys::ibv_query_device_fn),
        query_port: required!("ibv_query_port", sys::ibv_query_port_fn),
        query_gid: required!("ibv_query_gid", sys::ibv_query_gid_fn),
        alloc_pd: required!("ibv_alloc_pd", sys::ibv_alloc_pd_fn),
        dealloc_pd: required!("ibv_dealloc_pd", sys::ibv_dealloc_pd_fn),
        reg_mr: required!("ibv_reg_mr", sys::ibv_reg_mr_fn),
        dereg_mr: required!("ibv_dereg_mr", sys::ibv_dereg_mr_fn),
        create_cq: required!("ibv_create_cq", sys::ibv_create_cq_fn),
        destroy_cq: required!("ibv_destroy_cq", sys::ibv_destroy_cq_fn),
        create_qp: required!("ibv_create_qp", sys::ibv_create_qp_fn),
        modify_qp: required!("ibv_modify_qp", sys::ibv_modify_qp_fn),
        destroy_qp: required!("ibv_destroy_qp", sys::ibv_destroy_qp_fn),
        reg_dmabuf_mr,
        _lib: lib,
    })
}

/// Whether RDMA through verbs can be used in this process, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Availability {
    /// The library loaded and lists this many devices.
    Available {
        /// Where the library was found.
        path: String,
        /// Devices listed.
        devices: usize,
    },
    /// The library loaded but lists no device.
    NoDevice {
        /// Where the library was found.
        path: String,
    },
    /// The library could not be loaded.
    NoLibrary(LoadError),
    /// The device list could not be read.
    ListFailed(String),
}

impl Availability {
    /// Whether verbs are usable.
    pub fn is_available(&self) -> bool {
        matches!(self, Availability::Available { .. })
    }

    /// Why not (`None` when available): "libibverbs not found: ...", "no RDMA device", ...
    pub fn reason(&self) -> Option<String> {
        match self {
            Availability::Available { .. } => None,
            Availability::NoDevice { path } => {
                Some(format!("no RDMA device (libibverbs at {path} lists none)"))
            }
            Availability::NoLibrary(e) => Some(e.to_string()),
            Availability::ListFailed(e) => Some(e.clone()),
        }
    }
}

/// Whether verbs are usable here and why not: loads the library and lists the devices.
pub fn availability() -> Availability {
    let syms = match symbols() {
        Ok(s) => s,
        Err(e) => return Availability::NoLibrary(e),
    };
    match crate::verbs::DeviceList::get() {
        Ok(list) if list.is_empty() => Availability::NoDevice {
            path: syms.path.clone(),
        },
        Ok(list) => Availability::Available {
            path: syms.path.clone(),
            devices: list.len(),
        },
        Err(e) => Availability::ListFailed(e.to_string()),
    }
}

/// Shorthand for `availability().is_available()`.
pub fn supported() -> bool {
    availability().is_available()
}
