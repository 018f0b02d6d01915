//! NCCL's C API, looked up once from the library found at run time (PyTorch's bundled
//! `nvidia/nccl/lib/libnccl.so.2`, `NCCL_LIB_PATH`, or the system's). Required symbols fail the
//! load as a value; optional ones (newer than NCCL 2.12) are `None` when absent. Nothing else in
//! the crate declares a foreign function.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

use torchcomms_cuda::libs;

use crate::error::NcclError;

/// `ncclComm_t`.
pub(crate) type ncclComm_t = *mut c_void;
/// `cudaStream_t` (the same handle as a driver `CUstream`).
pub(crate) type cudaStream_t = *mut c_void;
/// `ncclResult_t`.
pub(crate) type ncclResult_t = c_int;
/// `ncclDataType_t`.
pub(crate) type ncclDataType_t = c_int;
/// `ncclRedOp_t`.
pub(crate) type ncclRedOp_t = c_int;

pub(crate) const NCCL_SUCCESS: ncclResult_t = 0;
pub(crate) const NCCL_IN_PROGRESS: ncclResult_t = 7;
/// `NCCL_SPLIT_NOCOLOR`.
pub(crate) const NCCL_SPLIT_NOCOLOR: c_int = -1;

pub(crate) const NCCL_INT8: ncclDataType_t = 0;
pub(crate) const NCCL_UINT8: ncclDataType_t = 1;
pub(crate) const NCCL_INT32: ncclDataType_t = 2;
pub(crate) const NCCL_INT64: ncclDataType_t = 4;
pub(crate) const NCCL_FLOAT16: ncclDataType_t = 6;
pub(crate) const NCCL_FLOAT32: ncclDataType_t = 7;
pub(crate) const NCCL_FLOAT64: ncclDataType_t = 8;
pub(crate) const NCCL_BFLOAT16: ncclDataType_t = 9;

pub(crate) const NCCL_SUM: ncclRedOp_t = 0;
pub(crate) const NCCL_PROD: ncclRedOp_t = 1;
pub(crate) const NCCL_MAX: ncclRedOp_t = 2;
pub(crate) const NCCL_MIN: ncclRedOp_t = 3;
pub(crate) const NCCL_AVG: ncclRedOp_t = 4;

/// `ncclScalarHostImmediate`.
pub(crate) const NCCL_SCALAR_HOST_IMMEDIATE: c_int = 1;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ncclUniqueId {
    pub(crate) internal: [u8; 128],
}

impl std::fmt::Debug for ncclUniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ncclUniqueId(..)")
    }
}

type Coll = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
type Rooted = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
type Bcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
type Gather = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
type P2p = unsafe extern "C" fn(
    *mut c_void,
    usize,
    ncclDataType_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;

/// NCCL's entry points.
#[derive(Debug)]
pub(crate) struct Nccl {
    pub(crate) path: PathBuf,
    pub(crate) version: c_int,
    pub(crate) get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> ncclResult_t,
    pub(crate) comm_init_rank:
        unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> ncclResult_t,
    pub(crate) comm_destroy: unsafe extern "C" fn(ncclComm_t) -> ncclResult_t,
    pub(crate) comm_abort: unsafe extern "C" fn(ncclComm_t) -> ncclResult_t,
    pub(crate) comm_get_async_error:
        unsafe extern "C" fn(ncclComm_t, *mut ncclResult_t) -> ncclResult_t,
    pub(crate) get_error_string: unsafe extern "C" fn(ncclResult_t) -> *const c_char,
    pub(crate) red_op_create_pre_mul_sum: unsafe extern "C" fn(
        *mut ncclRedOp_t,
        *mut c_void,
        ncclDataType_t,
        c_int,
        ncclComm_t,
    ) -> ncclResult_t,
    pub(crate) red_op_destroy: unsafe extern "C" fn(ncclRedOp_t, ncclComm_t) -> ncclResult_t,
    pub(crate) all_reduce: Coll,
    pub(crate) reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        cudaStream_t,
    ) -> ncclResult_t,
    pub(crate) reduce: Rooted,
    pub(crate) broadcast: Bcast,
    pub(crate) all_gather: Gather,
    pub(crate) send: unsafe extern "C" fn(
        *const c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        cudaStream_t,
    ) -> ncclResult_t,
    pub(crate) recv: P2p,
    pub(crate) group_start: unsafe extern "C" fn() -> ncclResult_t,
    pub(crate) group_end: unsafe extern "C" fn() -> ncclResult_t,
    /// NCCL 2.18+.
    pub(crate) comm_split: Option<
        unsafe extern "C" fn(
            ncclComm_t,
            c_int,
            c_int,
            *mut ncclComm_t,
            *mut c_void,
        ) -> ncclResult_t,
    >,
    /// NCCL 2.14+.
    pub(crate) comm_finalize: Option<unsafe extern "C" fn(ncclComm_t) -> ncclResult_t>,
    /// NCCL 2.13+.
    pub(crate) get_last_error: Option<unsafe extern "C" fn(ncclComm_t) -> *const c_char>,
    _lib: libloading::Library,
}

/// Which library the backend drives. RCCL is AMD's port of NCCL and exports NCCL's API under
/// the same names and types, so one table of symbols and one backend serve both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// NVIDIA's NCCL (`libnccl.so.2`), backend `nccl`.
    Nccl,
    /// AMD's RCCL (`librccl.so.1`, ROCm), backend `rccl`.
    Rccl,
}

impl Vendor {
    /// The backend's registered name.
    pub fn backend_name(self) -> &'static str {
        match self {
            Vendor::Nccl => "nccl",
            Vendor::Rccl => "rccl",
        }
    }
}

/// Loads NCCL once: `NCCL_LIB_PATH` (a file or folder), then the usual folders (see
/// [`torchcomms_cuda::libs`]), then the system loader.
pub(crate) fn nccl() -> Result<&'static Nccl, NcclError> {
    library(Vendor::Nccl)
}

/// Loads `vendor`'s library once; a failure is kept and returned to every later caller. RCCL is
/// looked for as every ROCm library is (`RCCL_LIB_PATH`, then [`torchcomms_hip::sys::open`]'s
/// folders: `LD_LIBRARY_PATH`, `$ROCM_PATH/lib`, `/opt/rocm/lib`, the system loader).
pub(crate) fn library(vendor: Vendor) -> Result<&'static Nccl, NcclError> {
    static NCCL: OnceLock<Result<Nccl, NcclError>> = OnceLock::new();
    static RCCL: OnceLock<Result<Nccl, NcclError>> = OnceLock::new();
    let cell = match vendor {
        Vendor::Nccl => &NCCL,
        Vendor::Rccl => &RCCL,
    };
    cell.get_or_init(|| load(vendor))
        .as_ref()
        .map_err(Clone::clone)
}

fn load(vendor: Vendor) -> Result<Nccl, NcclError> {
    let (path, lib) = match vendor {
        Vendor::Nccl => {
            let opened = libs::open(
                "libnccl (NCCL)",
                Some("NCCL_LIB_PATH"),
                &["libnccl.so.2", "libnccl.so"],
            )
            .map_err(|e| NcclError::Load(Box::new(e)))?;
            (opened.path, opened.lib)
        }
        Vendor::Rccl => torchcomms_hip::sys::open(
            "librccl (RCCL)",
            torchcomms_cvars::current().rccl_lib_path(),
            &["librccl.so.1", "librccl.so"],
        )
        .map_err(|e| NcclError::RcclLoad(Box::new(e)))?,
    };
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the type written at the use site is the symbol's C prototype from nccl.h.
            match unsafe { lib.get(concat!($name, "\0").as_bytes()) } {
                Ok(s) => *s,
                Err(e) => {
                    return Err(NcclError::Symbol {
                        name: $name,
                        path: path.display().to_string(),
                        reason: e.to_string(),
                    })
                }
            }
        }};
    }
    macro_rules! opt_sym {
        ($name:literal) => {{
            // SAFETY: as for sym!.
            unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .ok()
                .map(|s| *s)
        }};
    }
    let get_version: unsafe extern "C" fn(*mut c_int) -> ncclResult_t = sym!("ncclGetVersion");
    let mut version = 0;
    // SAFETY: writes one int.
    let rc = unsafe { get_version(&mut version) };
    if rc != NCCL_SUCCESS {
        return Err(NcclError::Symbol {
            name: "ncclGetVersion",
            path: path.display().to_string(),
            reason: format!("returned {rc}"),
        });
    }
    Ok(Nccl {
        version,
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        comm_destroy: sym!("ncclCommDestroy"),
        comm_abort: sym!("ncclCommAbort"),
        comm_get_async_error: sym!("ncclCommGetAsyncError"),
        get_error_string: sym!("ncclGetErrorString"),
        red_op_create_pre_mul_sum: sym!("ncclRedOpCreatePreMulSum"),
        red_op_destroy: sym!("ncclRedOpDestroy"),
        all_reduce: sym!("ncclAllReduce"),
        reduce_scatter: sym!("ncclReduceScatter"),
        reduce: sym!("ncclReduce"),
        broadcast: sym!("ncclBroadcast"),
        all_gather: sym!("ncclAllGather"),
        send: sym!("ncclSend"),
        recv: sym!("ncclRecv"),
        group_start: sym!("ncclGroupStart"),
        group_end: sym!("ncclGroupEnd"),
        comm_split: opt_sym!("ncclCommSplit"),
        comm_finalize: opt_sym!("ncclCommFinalize"),
        get_last_error: opt_sym!("ncclGetLastError"),
        path,
        _lib: lib,
    })
}

impl Nccl {
    /// "2.28.9" from `ncclGetVersion`'s code.
    pub(crate) fn version_string(&self) -> String {
        let v = self.version;
        if v >= 10000 {
            format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
        } else {
            format!("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100)
        }
    }

    /// NCCL's text for a result code, and its last error message for `comm`.
    pub(crate) fn describe(&self, rc: ncclResult_t, comm: ncclComm_t) -> String {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string.
        let text = unsafe { cstr((self.get_error_string)(rc)) };
        let last = match self.get_last_error {
            // SAFETY: returns a NUL-terminated string owned by NCCL (may be empty).
            Some(f) => unsafe { cstr(f(comm)) },
            None => String::new(),
        };
        if last.is_empty() {
            format!("{text} (ncclResult {rc})")
        } else {
            format!("{text} (ncclResult {rc}): {last}")
        }
    }
}

/// Copies a C string (null gives "").
///
/// # Safety
/// `p` is null or points at a NUL-terminated string.
unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: forwarded to the caller.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Whether NCCL can be loaded here.
pub fn is_available() -> bool {
    nccl().is_ok()
}
