//! The GPU runtime under the vendor backend: CUDA for `nccl`, HIP for `rccl` (AMD GPUs, which
//! ROCm's PyTorch calls `cuda`). Streams, events, device memory, copies and the kernels of
//! reductions NCCL lacks go through [`Gpu`], so the rest of the backend is one code for both.
//!
//! Stream handles cross this boundary as [`RawStream`] (a `CUstream` or a `hipStream_t`, 0 for
//! the null stream): PyTorch's current stream arrives that way from Python on either platform.
//!
//! HIP creates streams, events and memory on the calling thread's current device, so the HIP
//! half binds the device first (a split may run on another thread than the parent's creation).
//!
//! The HIP half has never run on an AMD GPU (docs/amd.md): on machines without one, opening a
//! device reports "ROCm not found" or "no AMD GPU".

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use torchcomms_core::{DataType, ReduceOp};
use torchcomms_cuda::{self as cuda, RawStream};
use torchcomms_hip as hip;

use crate::sys::Vendor;

/// An error of either runtime.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuError {
    /// From the CUDA driver or NVRTC.
    #[error(transparent)]
    Cuda(#[from] cuda::CudaError),
    /// From the HIP runtime or hiprtc.
    #[error(transparent)]
    Hip(#[from] hip::HipError),
}

/// One device of either runtime.
#[derive(Debug, Clone)]
pub(crate) enum Gpu {
    /// An NVIDIA GPU (its primary context).
    Cuda(Arc<cuda::Context>),
    /// An AMD GPU (HIP's state is per thread: [`Gpu::bind`] selects it).
    Hip {
        /// HIP's device ordinal.
        ordinal: u32,
    },
}

/// A stream the backend owns.
#[derive(Debug)]
pub(crate) enum GpuStream {
    /// CUDA.
    Cuda(cuda::Stream),
    /// HIP.
    Hip(hip::Stream),
}

/// An event without timing.
#[derive(Debug)]
pub(crate) enum GpuEvent {
    /// CUDA.
    Cuda(cuda::Event),
    /// HIP.
    Hip(hip::Event),
}

/// Device memory, freed on drop.
#[derive(Debug)]
pub(crate) enum GpuBuffer {
    /// CUDA.
    Cuda(cuda::DeviceBuffer),
    /// HIP.
    Hip(hip::DeviceBuffer),
}

fn hip_stream(s: RawStream) -> *mut c_void {
    s.0 as usize as *mut c_void
}

impl Gpu {
    /// Device `ordinal` of the runtime `vendor`'s library runs on, current on this thread.
    pub(crate) fn open(vendor: Vendor, ordinal: u32) -> Result<Gpu, GpuError> {
        let gpu = match vendor {
            Vendor::Nccl => Gpu::Cuda(cuda::Context::get(ordinal)?),
            Vendor::Rccl => {
                hip::availability()?;
                Gpu::Hip { ordinal }
            }
        };
        gpu.bind()?;
        Ok(gpu)
    }

    /// Makes the device current on this thread.
    pub(crate) fn bind(&self) -> Result<(), GpuError> {
        match self {
            Gpu::Cuda(ctx) => Ok(ctx.bind()?),
            Gpu::Hip { ordinal } => Ok(hip::set_device(*ordinal as usize)?),
        }
    }

    /// A non-blocking stream, of the highest priority with `high`.
    pub(crate) fn stream(&self, high: bool) -> Result<GpuStream, GpuError> {
        Ok(match self {
            Gpu::Cuda(ctx) => GpuStream::Cuda(cuda::Stream::new(ctx, high)?),
            Gpu::Hip { .. } => {
                self.bind()?;
                GpuStream::Hip(hip::Stream::with_priority(high)?)
            }
        })
    }

    /// An event.
    pub(crate) fn event(&self) -> Result<GpuEvent, GpuError> {
        Ok(match self {
            Gpu::Cuda(ctx) => GpuEvent::Cuda(cuda::Event::new(ctx)?),
            Gpu::Hip { .. } => {
                self.bind()?;
                GpuEvent::Hip(hip::Event::new()?)
            }
        })
    }

    /// `bytes` of device memory (uninitialised).
    pub(crate) fn alloc(&self, bytes: usize) -> Result<GpuBuffer, GpuError> {
        Ok(match self {
            Gpu::Cuda(ctx) => GpuBuffer::Cuda(cuda::DeviceBuffer::alloc(ctx, bytes)?),
            Gpu::Hip { .. } => {
                self.bind()?;
                GpuBuffer::Hip(hip::DeviceBuffer::new(bytes)?)
            }
        })
    }

    /// `bytes` of device memory set to zero.
    pub(crate) fn zeroed(&self, bytes: usize) -> Result<GpuBuffer, GpuError> {
        Ok(match self {
            Gpu::Cuda(ctx) => GpuBuffer::Cuda(cuda::DeviceBuffer::zeroed(ctx, bytes)?),
            Gpu::Hip { .. } => {
                self.bind()?;
                GpuBuffer::Hip(hip::DeviceBuffer::zeroed(bytes)?)
            }
        })
    }

    /// Lets this thread query events while another captures a graph in global mode.
    pub(crate) fn relax_capture_mode_for_this_thread(&self) -> Result<(), GpuError> {
        match self {
            Gpu::Cuda(_) => Ok(cuda::relax_capture_mode_for_this_thread()?),
            Gpu::Hip { .. } => Ok(hip::relax_capture_mode_for_this_thread()?),
        }
    }

    /// Whether `stream` is capturing a graph.
    pub(crate) fn is_capturing(&self, stream: RawStream) -> Result<bool, GpuError> {
        match self {
            Gpu::Cuda(_) => Ok(stream.is_capturing()?),
            // SAFETY: a stream of this device, from the caller (PyTorch) or ours.
            Gpu::Hip { .. } => Ok(unsafe { hip::stream_is_capturing(hip_stream(stream)) }?),
        }
    }

    /// Copies `bytes` from `src` to `dst` on `stream`.
    ///
    /// # Safety
    /// Both ranges must hold `bytes` until the copy has run.
    pub(crate) unsafe fn copy_async(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
        stream: RawStream,
    ) -> Result<(), GpuError> {
        match self {
            // SAFETY: forwarded to the caller.
            Gpu::Cuda(_) => Ok(unsafe { cuda::copy_async(dst, src, bytes, stream) }?),
            // SAFETY: forwarded to the caller.
            Gpu::Hip { .. } => Ok(unsafe { hip::copy_async(dst, src, bytes, hip_stream(stream)) }?),
        }
    }

    /// `dst = a ⊕ b` over `n` elements of `dtype` (the pairwise step of `op`) with the project's
    /// reduction kernels (`reduce.cu`), on `stream`.
    ///
    /// # Safety
    /// `dst`, `a` and `b` must be device addresses holding `n` elements until the kernel has
    /// run; `dst` may equal `a` or `b`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn combine(
        &self,
        dtype: DataType,
        op: ReduceOp,
        dst: u64,
        a: u64,
        b: u64,
        n: usize,
        stream: RawStream,
    ) -> Result<(), GpuError> {
        match self {
            Gpu::Cuda(ctx) => {
                let k = cuda::ReduceKernels::get(ctx)?;
                // SAFETY: forwarded to the caller.
                Ok(unsafe { k.combine(dtype, op, dst, a, b, n, stream) }?)
            }
            Gpu::Hip { ordinal } => {
                let (name, _) = cuda::kernels::combine_kernel(dtype, op)?;
                if n == 0 {
                    return Ok(());
                }
                let f = HipReduce::get(*ordinal)?.function(&name)?;
                let count = n as u64;
                let mut args = [&dst, &a, &b, &count].map(|v| v as *const u64 as *mut c_void);
                let block = cuda::kernels::BLOCK;
                let grid = u32::try_from(n.div_ceil(block as usize).min(1024)).unwrap_or(1024);
                // SAFETY: the kernel takes (T*, const T*, const T*, u64): four values, here;
                // the caller vouches for the buffers; the module stays loaded (static).
                Ok(unsafe { f.launch(grid, block, hip_stream(stream), &mut args) }?)
            }
        }
    }
}

impl GpuStream {
    /// Its handle.
    pub(crate) fn raw(&self) -> RawStream {
        match self {
            GpuStream::Cuda(s) => s.as_raw(),
            GpuStream::Hip(s) => RawStream(s.as_raw() as usize as u64),
        }
    }
}

impl GpuEvent {
    /// Records the work enqueued on `stream` so far.
    pub(crate) fn record(&self, stream: RawStream) -> Result<(), GpuError> {
        match self {
            GpuEvent::Cuda(e) => Ok(e.record(stream)?),
            // SAFETY: a stream of this event's device (ours or the caller's).
            GpuEvent::Hip(e) => Ok(unsafe { e.record_raw(hip_stream(stream)) }?),
        }
    }

    /// Makes later work on `stream` wait for the recorded work.
    pub(crate) fn wait_on(&self, stream: RawStream) -> Result<(), GpuError> {
        match self {
            GpuEvent::Cuda(e) => Ok(stream.wait_event(e)?),
            // SAFETY: a stream of this event's device (ours or the caller's).
            GpuEvent::Hip(e) => Ok(unsafe { hip::stream_wait_event(hip_stream(stream), e) }?),
        }
    }

    /// Whether the recorded work is done.
    pub(crate) fn query(&self) -> Result<bool, GpuError> {
        match self {
            GpuEvent::Cuda(e) => Ok(e.query()?),
            GpuEvent::Hip(e) => Ok(e.is_complete()?),
        }
    }
}

impl GpuBuffer {
    /// Its device address.
    pub(crate) fn as_ptr(&self) -> u64 {
        match self {
            GpuBuffer::Cuda(b) => b.as_ptr(),
            GpuBuffer::Hip(b) => b.as_raw() as usize as u64,
        }
    }
}

/// `reduce.cu` compiled by hiprtc for one AMD GPU and loaded, with its kernels looked up once.
#[derive(Debug)]
struct HipReduce {
    module: hip::Module,
    functions: Mutex<HashMap<String, hip::Function>>,
}

impl HipReduce {
    /// The kernels of device `ordinal` (current on this thread), compiled and loaded at first
    /// use.
    fn get(ordinal: u32) -> Result<Arc<HipReduce>, GpuError> {
        static LOADED: OnceLock<Mutex<HashMap<u32, Arc<HipReduce>>>> = OnceLock::new();
        let mut map = LOADED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(k) = map.get(&ordinal) {
            return Ok(Arc::clone(k));
        }
        let arch = hip::target_arch()?;
        let code = hip::rtc::compile(
            cuda::kernels::REDUCE_SOURCE_NAME,
            cuda::kernels::REDUCE_SOURCE,
            &arch,
        )?;
        let k = Arc::new(HipReduce {
            module: hip::Module::load(&code)?,
            functions: Mutex::default(),
        });
        map.insert(ordinal, Arc::clone(&k));
        Ok(k)
    }

    fn function(&self, name: &str) -> Result<hip::Function, GpuError> {
        let mut f = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = f.get(name) {
            return Ok(*k);
        }
        let k = self.module.function(name)?;
        f.insert(name.to_string(), k);
        Ok(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::NcclError;

    /// No machine here has an AMD GPU: opening one for rccl reports why, as an error the API
    /// calls "not supported here" and attributes to rccl (with Debian's ROCm installed, as CI
    /// does: "no AMD GPU"; without it: "ROCm not found").
    #[test]
    fn rccl_without_an_amd_gpu_says_why() {
        let err = Gpu::open(Vendor::Rccl, 0).expect_err("no machine here has an AMD GPU");
        let text = err.to_string();
        assert!(
            matches!(
                err,
                GpuError::Hip(
                    hip::HipError::NoDevice { .. } | hip::HipError::LibraryNotFound { .. }
                )
            ),
            "{text}"
        );
        println!("rccl here: {text}");
        let e: torchcomms::Error = NcclError::Gpu {
            op: "opening device 0 for rccl".into(),
            rank: 0,
            comm: "c".into(),
            source: Box::new(err),
        }
        .into();
        assert_eq!(e.kind(), torchcomms::ErrorKind::NotSupported, "{e}");
        assert!(e.to_string().contains("rccl"), "{e}");
    }

    #[test]
    fn hip_streams_travel_as_raw_handles() {
        assert!(hip_stream(RawStream(0)).is_null());
        assert_eq!(hip_stream(RawStream(0x1234)) as usize, 0x1234);
    }
}
