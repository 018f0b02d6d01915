//! The GPU runtime under the vendor backend: the engine's own GPU layer (`torchcomms-cuda`),
//! which drives CUDA for `nccl` and HIP for `rccl` (AMD GPUs, which ROCm's PyTorch calls
//! `cuda`). Streams, events, device memory, copies and the kernels of reductions NCCL lacks go
//! through [`Gpu`], so the rest of the backend is one code for both, and both share the
//! engine's dispatch instead of a copy of it.
//!
//! Stream handles cross this boundary as [`RawStream`] (a `CUstream` or a `hipStream_t`, 0 for
//! the null stream): PyTorch's current stream arrives that way from Python on either platform.
//!
//! The HIP half has never run on an AMD GPU (docs/amd.md): on machines without one, opening a
//! device for rccl reports "ROCm not found" or "no AMD GPU".

use std::sync::Arc;

use torchcomms_core::{DataType, ReduceOp};
use torchcomms_cuda::{self as cuda, Platform, RawStream};
use torchcomms_hip as hip;

use crate::sys::Vendor;

/// An error of either runtime.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuError {
    /// From the CUDA driver or NVRTC.
    #[error(transparent)]
    Cuda(cuda::CudaError),
    /// From the HIP runtime or hiprtc (ROCm absent, no AMD GPU, a failed call).
    #[error(transparent)]
    Hip(hip::HipError),
    /// The library's runtime is not the one this process drives.
    #[error(
        "{vendor} runs on {needs}, but this process drives {drives} (TORCHCOMMS_GPU_PLATFORM)"
    )]
    Platform {
        /// `nccl` or `rccl`.
        vendor: &'static str,
        /// The runtime its library needs.
        needs: &'static str,
        /// The process's runtime.
        drives: &'static str,
    },
}

impl From<cuda::CudaError> for GpuError {
    fn from(e: cuda::CudaError) -> Self {
        match e {
            cuda::CudaError::Hip(h) => GpuError::Hip(h),
            other => GpuError::Cuda(other),
        }
    }
}

/// One device, through the process's runtime.
#[derive(Debug, Clone)]
pub(crate) struct Gpu(Arc<cuda::Context>);

/// A stream the backend owns.
#[derive(Debug)]
pub(crate) struct GpuStream(cuda::Stream);

/// An event without timing.
#[derive(Debug)]
pub(crate) struct GpuEvent(cuda::Event);

/// Device memory, freed on drop.
#[derive(Debug)]
pub(crate) struct GpuBuffer(cuda::DeviceBuffer);

impl Gpu {
    /// Device `ordinal` of the runtime `vendor`'s library runs on, current on this thread.
    pub(crate) fn open(vendor: Vendor, ordinal: u32) -> Result<Gpu, GpuError> {
        let (name, needs) = match vendor {
            Vendor::Nccl => ("nccl", Platform::Cuda),
            Vendor::Rccl => ("rccl", Platform::Hip),
        };
        let drives = cuda::platform();
        if drives != needs {
            if needs == Platform::Hip {
                // Why HIP is not this process's runtime: ROCm absent or no AMD GPU, mostly.
                hip::availability().map_err(GpuError::Hip)?;
            }
            return Err(GpuError::Platform {
                vendor: name,
                needs: needs.name(),
                drives: drives.name(),
            });
        }
        let gpu = Gpu(cuda::Context::get(ordinal)?);
        gpu.bind()?;
        Ok(gpu)
    }

    /// Makes the device current on this thread.
    pub(crate) fn bind(&self) -> Result<(), GpuError> {
        Ok(self.0.bind()?)
    }

    /// A non-blocking stream, of the highest priority with `high`.
    pub(crate) fn stream(&self, high: bool) -> Result<GpuStream, GpuError> {
        Ok(GpuStream(cuda::Stream::new(&self.0, high)?))
    }

    /// An event.
    pub(crate) fn event(&self) -> Result<GpuEvent, GpuError> {
        Ok(GpuEvent(cuda::Event::new(&self.0)?))
    }

    /// `bytes` of device memory (uninitialised).
    pub(crate) fn alloc(&self, bytes: usize) -> Result<GpuBuffer, GpuError> {
        Ok(GpuBuffer(cuda::DeviceBuffer::alloc(&self.0, bytes)?))
    }

    /// `bytes` of device memory set to zero.
    pub(crate) fn zeroed(&self, bytes: usize) -> Result<GpuBuffer, GpuError> {
        Ok(GpuBuffer(cuda::DeviceBuffer::zeroed(&self.0, bytes)?))
    }

    /// Lets this thread query events while another captures a graph in global mode.
    pub(crate) fn relax_capture_mode_for_this_thread(&self) -> Result<(), GpuError> {
        Ok(cuda::relax_capture_mode_for_this_thread()?)
    }

    /// Whether `stream` is capturing a graph.
    pub(crate) fn is_capturing(&self, stream: RawStream) -> Result<bool, GpuError> {
        Ok(stream.is_capturing()?)
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
        // SAFETY: forwarded to the caller.
        Ok(unsafe { cuda::copy_async(dst, src, bytes, stream) }?)
    }

    /// `dst = a ⊕ b` over `n` elements of `dtype` (the pairwise step of `op`) with the project's
    /// reduction kernels (`reduce.cu`, compiled by NVRTC or hiprtc), on `stream`.
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
        let k = cuda::ReduceKernels::get(&self.0)?;
        // SAFETY: forwarded to the caller.
        Ok(unsafe { k.combine(dtype, op, dst, a, b, n, stream) }?)
    }
}

impl GpuStream {
    /// Its handle.
    pub(crate) fn raw(&self) -> RawStream {
        self.0.as_raw()
    }
}

impl GpuEvent {
    /// Records the work enqueued on `stream` so far.
    pub(crate) fn record(&self, stream: RawStream) -> Result<(), GpuError> {
        Ok(self.0.record(stream)?)
    }

    /// Makes later work on `stream` wait for the recorded work.
    pub(crate) fn wait_on(&self, stream: RawStream) -> Result<(), GpuError> {
        Ok(stream.wait_event(&self.0)?)
    }

    /// Whether the recorded work is done.
    pub(crate) fn query(&self) -> Result<bool, GpuError> {
        Ok(self.0.query()?)
    }
}

impl GpuBuffer {
    /// Its device address.
    pub(crate) fn as_ptr(&self) -> u64 {
        self.0.as_ptr()
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
    fn hip_errors_of_the_gpu_layer_stay_hip_errors() {
        let hip_err = hip::HipError::NoDevice {
            detail: "hipInit".into(),
        };
        let e: GpuError = cuda::CudaError::Hip(hip_err).into();
        assert!(
            matches!(e, GpuError::Hip(hip::HipError::NoDevice { .. })),
            "{e}"
        );
    }
}
