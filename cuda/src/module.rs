//! Kernels: a loaded module (CUBIN or PTX from NVRTC on CUDA, a code object from hiprtc on
//! HIP), its functions, and launches with typed arguments.

use std::ffi::c_void;
use std::sync::Arc;

pub use cudarc::driver::DeviceRepr;
use cudarc::driver::{result, sys};

use super::driver::Context;
use super::error::{CudaError, DriverResultExt, Result};
use super::platform::Platform;
use super::stream::RawStream;

/// A module's handle in its runtime.
#[derive(Debug)]
enum ModuleInner {
    Cuda(sys::CUmodule),
    Hip(torchcomms_hip::Module),
}

/// A loaded module and the functions looked up in it.
#[derive(Debug)]
pub struct Module {
    ctx: Arc<Context>,
    inner: ModuleInner,
}

// SAFETY: modules and their functions may be used from any thread of the context.
unsafe impl Send for Module {}
// SAFETY: as for Send; lookups and launches are thread-safe runtime calls.
unsafe impl Sync for Module {}

impl Module {
    /// Loads a CUBIN or a NUL-terminated PTX image (CUDA), or a code object (HIP).
    pub fn load(ctx: &Arc<Context>, image: &[u8]) -> Result<Module> {
        ctx.bind()?;
        let inner = match ctx.platform() {
            // SAFETY: the driver reads the image during the call only; CUBIN carries its size
            // in its ELF header and PTX is NUL-terminated by our compiler wrapper.
            Platform::Cuda => ModuleInner::Cuda(
                unsafe { result::module::load_data(image.as_ptr().cast::<c_void>()) }
                    .call("cuModuleLoadData")?,
            ),
            Platform::Hip => ModuleInner::Hip(torchcomms_hip::Module::load(image)?),
        };
        Ok(Module {
            ctx: Arc::clone(ctx),
            inner,
        })
    }

    /// Looks up a kernel by its `extern "C"` name.
    pub fn function(&self, name: &str) -> Result<Function> {
        let raw = match &self.inner {
            ModuleInner::Cuda(raw) => *raw,
            ModuleInner::Hip(m) => return Ok(Function::Hip(m.function(name)?)),
        };
        let cname = std::ffi::CString::new(name).map_err(|_| CudaError::BadArgument {
            call: "cuModuleGetFunction",
            detail: format!("kernel name {name:?} holds a NUL"),
        })?;
        // SAFETY: the module is loaded; the name is NUL-terminated.
        let f = unsafe { result::module::get_function(raw, cname) }.call("cuModuleGetFunction")?;
        Ok(Function::Cuda(f))
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let ModuleInner::Cuda(raw) = self.inner else {
            return;
        };
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: our module, unloaded once.
            unsafe { result::module::unload(raw) }.call("cuModuleUnload")
        });
        if let Err(e) = r {
            tracing::warn!("unloading a CUDA module: {e}");
        }
    }
}

/// A kernel of a [`Module`] (valid while the module is loaded).
#[derive(Debug, Clone, Copy)]
pub enum Function {
    /// A `CUfunction`.
    Cuda(sys::CUfunction),
    /// A `hipFunction_t`.
    Hip(torchcomms_hip::Function),
}

// SAFETY: a CUfunction is a handle usable from any thread (HIP's is Send already).
unsafe impl Send for Function {}
// SAFETY: as for Send.
unsafe impl Sync for Function {}

/// Most parameters a kernel of this project takes.
const MAX_KERNEL_ARGS: usize = 8;

/// A launch of a [`Function`] in the making: its arguments in the kernel's parameter order,
/// each a value whose type cudarc's [`DeviceRepr`] vouches can be passed to a kernel (numbers,
/// or `#[repr(C)]` parameter structs that implement it). The values are borrowed until the
/// launch, which copies them.
#[derive(Debug)]
#[must_use = "a launch does nothing until `launch` is called"]
pub struct LaunchArgs<'a> {
    func: Function,
    args: [*mut c_void; MAX_KERNEL_ARGS],
    len: usize,
    _values: std::marker::PhantomData<&'a ()>,
}

impl<'a> LaunchArgs<'a> {
    /// Adds the next argument.
    pub fn arg<T: DeviceRepr>(mut self, value: &'a T) -> Self {
        assert!(
            self.len < MAX_KERNEL_ARGS,
            "kernels take at most {MAX_KERNEL_ARGS} parameters"
        );
        self.args[self.len] = (value as *const T).cast_mut().cast();
        self.len += 1;
        self
    }

    /// Launches on `stream` with a 1-D grid of `grid` blocks of `block` threads.
    ///
    /// # Safety
    /// The arguments' types and order must match the kernel's parameters, and every device
    /// address among them must stay valid, as the kernel uses it, until the kernel finishes.
    /// The module must outlive the launch.
    pub unsafe fn launch(mut self, grid: u32, block: u32, stream: RawStream) -> Result<()> {
        let len = self.len;
        // SAFETY: forwarded to the caller; the argument values are borrowed for 'a, past the
        // call, which copies them.
        unsafe { self.func.launch(grid, block, stream, &mut self.args[..len]) }
    }
}

impl Function {
    /// Starts a launch: add the arguments with [`LaunchArgs::arg`], then launch.
    pub fn args<'a>(&self) -> LaunchArgs<'a> {
        LaunchArgs {
            func: *self,
            args: [std::ptr::null_mut(); MAX_KERNEL_ARGS],
            len: 0,
            _values: std::marker::PhantomData,
        }
    }

    /// Launches on `stream` with a 1-D grid.
    ///
    /// # Safety
    /// `params` must point at values whose types and order match the kernel's parameters, and
    /// every device address among them must stay valid until the kernel finishes. The module
    /// must outlive the launch.
    unsafe fn launch(
        &self,
        grid: u32,
        block: u32,
        stream: RawStream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        match self {
            // SAFETY: forwarded to the caller.
            Function::Cuda(raw) => unsafe {
                result::launch_kernel(*raw, (grid, 1, 1), (block, 1, 1), 0, stream.raw(), params)
            }
            .call("cuLaunchKernel"),
            // SAFETY: forwarded to the caller (HIP takes the same array of argument pointers).
            Function::Hip(f) => Ok(unsafe { f.launch(grid, block, stream.hip(), params) }?),
        }
    }
}
