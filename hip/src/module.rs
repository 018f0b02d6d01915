//! Code objects on an AMD GPU: hiprtc's output loaded, its kernels looked up and launched on
//! any stream, and the architecture to compile for.
//!
//! Never ran on an AMD GPU (docs/amd.md); `target_arch`'s parsing of the kernel driver's
//! topology is tested here against its documented format.

use std::ffi::{c_void, CString};
use std::path::Path;

use crate::error::{HipError, Result};
use crate::runtime::availability;
use crate::sys::{self, check};

/// A loaded code object, unloaded on drop.
#[derive(Debug)]
pub struct Module {
    raw: sys::HipModule,
}

// SAFETY: a hipModule_t may be used from any thread; HIP locks internally.
unsafe impl Send for Module {}
// SAFETY: as above (lookups only).
unsafe impl Sync for Module {}

impl Module {
    /// Loads `code` (a code object for the current device's architecture).
    pub fn load(code: &[u8]) -> Result<Module> {
        availability()?;
        let hip = sys::hip()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `code` is a live code object HIP copies.
        check(hip, "hipModuleLoadData", unsafe {
            (hip.hipModuleLoadData)(&mut raw, code.as_ptr().cast())
        })?;
        Ok(Module { raw })
    }

    /// The kernel `name` (`extern "C"`).
    pub fn function(&self, name: &str) -> Result<Function> {
        let hip = sys::hip()?;
        let cname = CString::new(name).map_err(|_| HipError::Nul {
            what: "kernel name",
        })?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the module is live; `cname` outlives the call.
        check(hip, "hipModuleGetFunction", unsafe {
            (hip.hipModuleGetFunction)(&mut raw, self.raw, cname.as_ptr())
        })?;
        Ok(Function { raw })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(hip) = sys::hip() {
            // SAFETY: loaded once, unloaded once; functions of it are not used after.
            if let Err(e) = check(hip, "hipModuleUnload", unsafe {
                (hip.hipModuleUnload)(self.raw)
            }) {
                tracing::warn!("unloading a HIP module: {e}");
            }
        }
    }
}

/// A kernel of a [`Module`] (valid while the module is loaded).
#[derive(Debug, Clone, Copy)]
pub struct Function {
    raw: sys::HipFunction,
}

// SAFETY: a hipFunction_t is a handle usable from any thread.
unsafe impl Send for Function {}
// SAFETY: as for Send.
unsafe impl Sync for Function {}

impl Function {
    /// Launches a 1-D grid of `grid` blocks of `block` threads on `stream` (null: the null
    /// stream). `params` points at each argument's value, in the kernel's order.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters, every device address among them must
    /// stay valid until the kernel has run, the module must outlive the launch, and `stream`
    /// must be null or a live stream of the current device.
    pub unsafe fn launch(
        &self,
        grid: u32,
        block: u32,
        stream: *mut c_void,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let hip = sys::hip()?;
        // SAFETY: forwarded to the caller.
        check(hip, "hipModuleLaunchKernel", unsafe {
            (hip.hipModuleLaunchKernel)(
                self.raw,
                grid.max(1),
                1,
                1,
                block,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}

/// The architecture hiprtc compiles for (`gfx90a`): `TORCHCOMMS_HIP_ARCH`, else the one every
/// GPU node of the kernel driver's topology reports.
pub fn target_arch() -> Result<String> {
    if let Some(a) = torchcomms_cvars::current()
        .torchcomms_hip_arch()
        .filter(|a| !a.is_empty())
    {
        return Ok(a.to_string());
    }
    arch_from_topology(Path::new("/sys/class/kfd/kfd/topology/nodes"))
}

/// The one architecture of the GPU nodes under `nodes` (each `N/properties` holds
/// `gfx_target_version MMmmss`, 0 for CPU nodes).
pub fn arch_from_topology(nodes: &Path) -> Result<String> {
    let unknown = |detail: String| HipError::NoDevice {
        detail: format!("the GPU architecture ({detail}); set TORCHCOMMS_HIP_ARCH, e.g. gfx90a"),
    };
    let entries =
        std::fs::read_dir(nodes).map_err(|e| unknown(format!("{}: {e}", nodes.display())))?;
    let mut archs: Vec<String> = entries
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("properties")).ok())
        .filter_map(|props| {
            props
                .lines()
                .find_map(|l| l.strip_prefix("gfx_target_version "))
                .and_then(|v| v.trim().parse::<u32>().ok())
        })
        .filter(|&v| v != 0)
        .map(gfx_name)
        .collect();
    archs.sort();
    archs.dedup();
    match archs.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(unknown(format!("no GPU node under {}", nodes.display()))),
        many => Err(unknown(format!(
            "GPUs of several kinds: {}",
            many.join(", ")
        ))),
    }
}

/// `gfx_target_version` (major * 10000 + minor * 100 + stepping) as LLVM's target name:
/// 90010 is gfx90a, 90402 gfx942, 110000 gfx1100 (minor and stepping one hex digit each).
pub fn gfx_name(version: u32) -> String {
    let (major, minor, step) = (version / 10000, version / 100 % 100, version % 100);
    format!("gfx{major}{minor:x}{step:x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_versions_name_llvm_targets() {
        assert_eq!(gfx_name(90010), "gfx90a");
        assert_eq!(gfx_name(90402), "gfx942");
        assert_eq!(gfx_name(90008), "gfx908");
        assert_eq!(gfx_name(110000), "gfx1100");
        assert_eq!(gfx_name(100300), "gfx1030");
    }

    #[test]
    fn topology_gives_the_one_gpu_architecture() {
        let dir = std::env::temp_dir().join(format!("tc-kfd-{}", std::process::id()));
        let node = |n: usize, props: &str| {
            let d = dir.join(n.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("properties"), props).unwrap();
        };
        node(0, "cpu_cores_count 64\ngfx_target_version 0\n");
        node(1, "simd_count 440\ngfx_target_version 90010\n");
        node(2, "gfx_target_version 90010\n");
        assert_eq!(arch_from_topology(&dir).unwrap(), "gfx90a");
        node(3, "gfx_target_version 90402\n");
        let e = arch_from_topology(&dir).unwrap_err().to_string();
        assert!(
            e.contains("gfx90a, gfx942") && e.contains("TORCHCOMMS_HIP_ARCH"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let e = arch_from_topology(&dir).unwrap_err().to_string();
        assert!(e.contains("TORCHCOMMS_HIP_ARCH"), "{e}");
    }
}
