//! Where the benchmark's tensors live: host memory, or a CUDA device (one per rank). Inputs are
//! made on the host and copied up; results are copied back and checked on the host.

use std::sync::Arc;

use anyhow::{bail, Context as _, Result};
use ctran::cuda::{self, Context, DeviceBuffer, RawStream};
use ctran::{DataType, Device};
use torchcomms::Tensor;

use crate::check::Elem;

/// The memory of one rank.
#[derive(Debug)]
pub(crate) enum Mem {
    /// Host tensors.
    Host,
    /// Tensors on this CUDA device; operations run after the legacy default stream.
    Cuda(Arc<Context>),
}

/// The device rank `local_rank` of this host uses for `--device`: `cuda:N` shifts by the local
/// rank, so `-n 2 --device cuda` puts rank 0 on GPU 0 and rank 1 on GPU 1.
pub(crate) fn rank_device(device: Device, local_rank: usize) -> Result<Device> {
    match device {
        Device::Cpu => Ok(Device::Cpu),
        Device::Cuda(i) => {
            if let Some(why) = cuda::unavailable_reason() {
                bail!("--device {device}: CUDA is not available: {why}");
            }
            let n = cuda::driver()?.device_count as usize;
            Ok(Device::Cuda(((i as usize + local_rank) % n) as u32))
        }
    }
}

impl Mem {
    pub(crate) fn new(device: Device) -> Result<Mem> {
        match device {
            Device::Cpu => Ok(Mem::Host),
            Device::Cuda(i) => Ok(Mem::Cuda(
                Context::get(i).with_context(|| format!("opening {device}"))?,
            )),
        }
    }

    fn device_tensor(ctx: &Arc<Context>, buf: DeviceBuffer, dtype: DataType, n: usize) -> Tensor {
        let p = buf.as_ptr() as usize as *mut u8;
        // SAFETY: the buffer holds n elements of dtype and is the tensor's owner, so it lives
        // as long as the tensor and every operation that holds the owner.
        unsafe { Tensor::from_raw(p, n, dtype, Device::Cuda(ctx.ordinal())) }
            .with_owner(Arc::new(buf))
    }

    /// `n` zeroed elements.
    pub(crate) fn zeros(&self, dtype: DataType, n: usize) -> Result<Tensor> {
        match self {
            Mem::Host => Ok(Tensor::zeros(dtype, n)),
            Mem::Cuda(ctx) => {
                let b = DeviceBuffer::zeroed(ctx, n * dtype.size_bytes())?;
                Ok(Self::device_tensor(ctx, b, dtype, n))
            }
        }
    }

    /// A tensor holding `data`.
    pub(crate) fn upload<T: Elem>(&self, data: Vec<T>) -> Result<Tensor> {
        let host = Tensor::from_vec(data);
        match self {
            Mem::Host => Ok(host),
            Mem::Cuda(ctx) => {
                let n = host.numel();
                // SAFETY: the host tensor owns nbytes initialised bytes at addr.
                let bytes =
                    unsafe { std::slice::from_raw_parts(host.addr() as *const u8, host.nbytes()) };
                let b = DeviceBuffer::from_host(ctx, bytes)?;
                Ok(Self::device_tensor(ctx, b, T::DTYPE, n))
            }
        }
    }

    /// The elements of `t` (after the work the legacy default stream waits for).
    pub(crate) fn download<T: Elem>(&self, t: Tensor) -> Result<Vec<T>> {
        let Mem::Cuda(_) = self else {
            return Ok(t.to_vec()?);
        };
        let owner = t.owner().context("a device tensor without its buffer")?;
        let buf = (**owner)
            .downcast_ref::<DeviceBuffer>()
            .context("a device tensor not made by this benchmark")?;
        let host = Tensor::zeros(t.dtype(), t.numel());
        // SAFETY: `host` is ours alone (fresh) and holds nbytes bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(host.addr() as *mut u8, host.nbytes()) };
        let offset = t.addr() - buf.as_ptr() as usize;
        buf.read(offset, out)?;
        drop(t);
        Ok(host.to_vec()?)
    }

    /// Waits for everything issued on the legacy default stream (so for the operations it was
    /// made to wait for).
    pub(crate) fn sync(&self) -> Result<()> {
        if let Mem::Cuda(ctx) = self {
            ctx.bind()?;
            RawStream::DEFAULT.synchronize()?;
        }
        Ok(())
    }
}
