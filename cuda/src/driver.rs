//! The GPU runtime, loaded at run time: the driver and the devices this process sees, and each
//! device's context. CUDA through cudarc's `result` layer; HIP through `torchcomms-hip` (the
//! [`platform`](crate::platform) of the process decides). Streams and events are in
//! [`crate::stream`], memory in [`crate::memory`], kernels in [`crate::module`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys};

use super::error::{CudaError, DriverResultExt, Result};
use super::libs;
use super::platform::{platform, Platform};

/// The loaded runtime: its version and the devices this process sees.
#[derive(Debug)]
pub struct Driver {
    /// CUDA or HIP.
    pub platform: Platform,
    /// `cuDriverGetVersion` (13000 for CUDA 13.0) or `hipDriverGetVersion`.
    pub version: i32,
    /// Visible devices.
    pub device_count: u32,
    /// Where `libcuda` (or `libamdhip64`) was found.
    pub path: PathBuf,
    _lib: Option<libloading::Library>,
}

/// Loads and initialises the runtime of this process's platform once; later calls return the
/// same result.
pub fn driver() -> Result<&'static Driver> {
    match platform() {
        Platform::Cuda => cuda_driver(),
        Platform::Hip => hip_driver(),
    }
}

/// Whether the CUDA driver loads and sees a GPU (what `auto` asks first).
pub(crate) fn cuda_sees_a_gpu() -> bool {
    cuda_driver().is_ok_and(|d| d.device_count > 0)
}

fn cuda_driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let opened = libs::open(
                "libcuda (the CUDA driver)",
                Some("TORCHCOMMS_CUDA_DRIVER_LIB"),
                &["libcuda.so.1", "libcuda.so"],
            )?;
            // SAFETY: only tries to dlopen cudarc's candidate names; the one we opened with
            // RTLD_GLOBAL matches by soname, so cudarc's loader (which panics when it finds
            // nothing) is only used once this returned true.
            if !unsafe { sys::is_culib_present() } {
                return Err(CudaError::LibraryNotFound {
                    lib: "libcuda".into(),
                    reason: "loaded, but not under a name cudarc opens (libcuda.so.1)".into(),
                    searched: opened.path.display().to_string(),
                });
            }
            result::init().call("cuInit")?;
            let mut version = 0i32;
            // SAFETY: writes one int.
            unsafe { sys::cuDriverGetVersion(&mut version) }
                .result()
                .call("cuDriverGetVersion")?;
            let count = result::device::get_count().call("cuDeviceGetCount")?;
            Ok(Driver {
                platform: Platform::Cuda,
                version,
                device_count: u32::try_from(count).unwrap_or(0),
                path: opened.path,
                _lib: Some(opened.lib),
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn hip_driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let count = torchcomms_hip::availability()?;
            Ok(Driver {
                platform: Platform::Hip,
                version: torchcomms_hip::device::driver_version()?,
                device_count: u32::try_from(count).unwrap_or(0),
                path: torchcomms_hip::sys::hip()?.path.clone(),
                _lib: None,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// True when the runtime loads and sees at least one device.
pub fn is_available() -> bool {
    unavailable_reason().is_none()
}

/// Why the GPU runtime cannot be used here, or `None` when it can (tests print this when
/// they skip).
pub fn unavailable_reason() -> Option<String> {
    match driver() {
        Err(e) => Some(e.to_string()),
        Ok(d) if d.device_count == 0 => Some(format!(
            "the {} runtime loaded but sees no device",
            d.platform.name()
        )),
        Ok(_) => None,
    }
}

/// How a context reaches its device.
#[derive(Debug)]
enum Handle {
    /// The device's primary context (the one PyTorch uses), retained for the process's life.
    Cuda {
        dev: sys::CUdevice,
        raw: sys::CUcontext,
    },
    /// HIP keeps a current device per thread instead of contexts.
    Hip,
}

/// A device as the engine uses it: bound to the calling thread before each runtime call.
#[derive(Debug)]
pub struct Context {
    ordinal: u32,
    handle: Handle,
    name: String,
    cc: (i32, i32),
    sm_count: i32,
}

// SAFETY: a CUcontext and CUdevice are process-wide handles the driver lets any thread use;
// this type never mutates them (HIP's variant holds no handle).
unsafe impl Send for Context {}
// SAFETY: as for Send; every method only reads the handles.
unsafe impl Sync for Context {}

impl Context {
    /// The context of device `ordinal`, made once and shared.
    pub fn get(ordinal: u32) -> Result<Arc<Context>> {
        static CTXS: OnceLock<Mutex<HashMap<u32, Arc<Context>>>> = OnceLock::new();
        let d = driver()?;
        if ordinal >= d.device_count {
            return Err(CudaError::NoDevice {
                ordinal,
                count: d.device_count,
            });
        }
        let mut map = CTXS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(&ordinal) {
            return Ok(Arc::clone(c));
        }
        let ctx = Arc::new(match d.platform {
            Platform::Cuda => Context::cuda(ordinal)?,
            Platform::Hip => Context::hip(ordinal)?,
        });
        map.insert(ordinal, Arc::clone(&ctx));
        Ok(ctx)
    }

    fn cuda(ordinal: u32) -> Result<Context> {
        let dev = result::device::get(ordinal as i32).call("cuDeviceGet")?;
        // SAFETY: `dev` came from cuDeviceGet. The retain is never released: primary contexts
        // live as long as the process, like PyTorch's.
        let raw = unsafe { result::primary_ctx::retain(dev) }.call("cuDevicePrimaryCtxRetain")?;
        let attr = |a| {
            // SAFETY: `dev` is valid; the attribute is a plain integer query.
            unsafe { result::device::get_attribute(dev, a) }.call("cuDeviceGetAttribute")
        };
        use sys::CUdevice_attribute as A;
        let cc = (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let sm_count = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let name = result::device::get_name(dev).call("cuDeviceGetName")?;
        Ok(Context {
            ordinal,
            handle: Handle::Cuda { dev, raw },
            name,
            cc,
            sm_count,
        })
    }

    fn hip(ordinal: u32) -> Result<Context> {
        let info = torchcomms_hip::device_info(ordinal as i32)?;
        Ok(Context {
            ordinal,
            handle: Handle::Hip,
            name: info.name,
            cc: info.compute_capability,
            sm_count: info.compute_units,
        })
    }

    /// The runtime this context belongs to.
    pub fn platform(&self) -> Platform {
        match self.handle {
            Handle::Cuda { .. } => Platform::Cuda,
            Handle::Hip => Platform::Hip,
        }
    }

    /// Makes this device current on the calling thread (cheap when it already is).
    pub fn bind(&self) -> Result<()> {
        match self.handle {
            Handle::Cuda { raw, .. } => {
                // SAFETY: the context is retained for the life of the process.
                unsafe { result::ctx::set_current(raw) }.call("cuCtxSetCurrent")
            }
            Handle::Hip => Ok(torchcomms_hip::set_device(self.ordinal as usize)?),
        }
    }

    /// Lets kernels and copies of this device reach `peer`'s memory directly (already enabled
    /// is fine).
    pub fn enable_peer_access(&self, peer: &Context) -> Result<()> {
        self.bind()?;
        let Handle::Cuda { raw: peer_raw, .. } = peer.handle else {
            return Ok(torchcomms_hip::device::enable_peer_access(
                peer.ordinal as i32,
            )?);
        };
        // SAFETY: both contexts are retained for the life of the process.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer_raw, 0) };
        if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        r.result().call("cuCtxEnablePeerAccess")
    }

    /// Device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Device name (`NVIDIA H200`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability (9, 0 on Hopper).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    /// Streaming multiprocessors (compute units on AMD GPUs).
    pub fn sm_count(&self) -> i32 {
        self.sm_count
    }

    /// The raw `CUdevice` (HIP names devices by ordinal: the ordinal).
    pub fn device(&self) -> sys::CUdevice {
        match self.handle {
            Handle::Cuda { dev, .. } => dev,
            Handle::Hip => self.ordinal as sys::CUdevice,
        }
    }

    /// The retained CUDA context; `None` on HIP.
    pub(crate) fn cuda_context(&self) -> Option<sys::CUcontext> {
        match self.handle {
            Handle::Cuda { raw, .. } => Some(raw),
            Handle::Hip => None,
        }
    }

    /// Total and free memory of the device, in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (free, total) = match self.handle {
            Handle::Cuda { .. } => result::mem_get_info().call("cuMemGetInfo")?,
            Handle::Hip => torchcomms_hip::device::mem_info()?,
        };
        Ok((total, free))
    }
}
