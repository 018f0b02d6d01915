//! Streams and events of either runtime. Streams that belong to someone else (PyTorch's
//! current stream) are plain [`RawStream`] values: this layer records events on them and makes
//! them wait, but never destroys them.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::driver::Context;
use super::error::{DriverResultExt, Result};
use super::platform::{platform, Platform};

/// A stream this layer does not own, as callers pass it: a `CUstream` (or `hipStream_t`) as an
/// integer (`torch.cuda.current_stream().cuda_stream`); 0 is the legacy default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RawStream(pub u64);

impl RawStream {
    /// The legacy default stream.
    pub const DEFAULT: RawStream = RawStream(0);

    pub(super) fn raw(self) -> sys::CUstream {
        self.0 as usize as sys::CUstream
    }

    pub(super) fn hip(self) -> *mut c_void {
        self.0 as usize as *mut c_void
    }

    /// Makes the stream wait (on the device) for `event`'s last record.
    pub fn wait_event(self, event: &Event) -> Result<()> {
        match &event.inner {
            // SAFETY: the caller vouches for the stream (it came from its owner); the event is
            // alive (borrowed).
            EventInner::Cuda(raw) => unsafe {
                result::stream::wait_event(
                    self.raw(),
                    *raw,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            }
            .call("cuStreamWaitEvent"),
            EventInner::Hip(ev) => {
                // SAFETY: as above.
                Ok(unsafe { torchcomms_hip::stream_wait_event(self.hip(), ev) }?)
            }
        }
    }

    /// Blocks the host until the stream's work is done.
    pub fn synchronize(self) -> Result<()> {
        match platform() {
            Platform::Cuda => {
                // SAFETY: as for wait_event.
                unsafe { result::stream::synchronize(self.raw()) }.call("cuStreamSynchronize")
            }
            // SAFETY: as for wait_event.
            Platform::Hip => Ok(unsafe { torchcomms_hip::stream_synchronize(self.hip()) }?),
        }
    }

    /// Holds the stream (in the GPU's front end, no kernel) until the 64-bit word at device
    /// address `addr` reaches `value` (`cuStreamWaitValue64`/`hipStreamWaitValue64`,
    /// greater-or-equal). Waiting there occupies no SM and lets the GPU switch to other
    /// processes' contexts meanwhile, which a spinning kernel does not reliably allow.
    ///
    /// # Safety
    /// `addr` must be 8 aligned bytes of device-accessible memory (mapped pinned host memory
    /// counts) that stay allocated until the wait has passed; someone must raise the word, or
    /// the stream waits forever.
    pub unsafe fn wait_value_geq(self, addr: u64, value: u64) -> Result<()> {
        match platform() {
            Platform::Cuda => {
                let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
                // SAFETY: forwarded to the caller.
                unsafe { sys::cuStreamWaitValue64_v2(self.raw(), addr, value, geq) }
                    .result()
                    .call("cuStreamWaitValue64")
            }
            Platform::Hip => {
                // SAFETY: forwarded to the caller.
                Ok(unsafe { torchcomms_hip::stream_wait_value64(self.hip(), addr, value) }?)
            }
        }
    }

    /// True while the stream is capturing a graph.
    pub fn is_capturing(self) -> Result<bool> {
        if platform() == Platform::Hip {
            // SAFETY: the caller vouches for the stream.
            return Ok(unsafe { torchcomms_hip::stream_is_capturing(self.hip()) }?);
        }
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: writes one enum.
        unsafe { sys::cuStreamIsCapturing(self.raw(), &mut status) }
            .result()
            .call("cuStreamIsCapturing")?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
}

/// A stream's handle in its runtime.
#[derive(Debug)]
enum StreamInner {
    Cuda(sys::CUstream),
    Hip(torchcomms_hip::Stream),
}

/// A stream owned by this layer (non-blocking: no implicit ordering with the default stream).
#[derive(Debug)]
pub struct Stream {
    ctx: Arc<Context>,
    inner: StreamInner,
}

// SAFETY: CUDA and HIP streams may be used from any thread of the process.
unsafe impl Send for Stream {}
// SAFETY: every method is a runtime call that is thread-safe on the same stream.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a non-blocking stream on `ctx`; `high_priority` asks for the greatest priority.
    pub fn new(ctx: &Arc<Context>, high_priority: bool) -> Result<Stream> {
        ctx.bind()?;
        if ctx.platform() == Platform::Hip {
            return Ok(Stream {
                ctx: Arc::clone(ctx),
                inner: StreamInner::Hip(torchcomms_hip::Stream::with_priority(high_priority)?),
            });
        }
        use result::stream::StreamKind;
        let raw = if high_priority {
            let (_least, greatest) =
                result::stream::get_priority_range().call("cuCtxGetStreamPriorityRange")?;
            result::stream::create_with_priority(StreamKind::NonBlocking, greatest)
                .call("cuStreamCreateWithPriority")?
        } else {
            result::stream::create(StreamKind::NonBlocking).call("cuStreamCreate")?
        };
        Ok(Stream {
            ctx: Arc::clone(ctx),
            inner: StreamInner::Cuda(raw),
        })
    }

    /// This stream as a [`RawStream`] (valid while `self` lives).
    pub fn as_raw(&self) -> RawStream {
        match &self.inner {
            StreamInner::Cuda(raw) => RawStream(*raw as usize as u64),
            StreamInner::Hip(s) => RawStream(s.as_raw() as usize as u64),
        }
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // HIP's stream is destroyed by its own drop.
        let StreamInner::Cuda(raw) = self.inner else {
            return;
        };
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: we created the stream and nobody else destroys it.
            unsafe { result::stream::destroy(raw) }.call("cuStreamDestroy")
        });
        if let Err(e) = r {
            tracing::warn!("dropping a CUDA stream: {e}");
        }
    }
}

/// An event's handle in its runtime.
#[derive(Debug)]
enum EventInner {
    Cuda(sys::CUevent),
    Hip(torchcomms_hip::Event),
}

/// An event without timing, to order streams and to poll completion.
#[derive(Debug)]
pub struct Event {
    ctx: Arc<Context>,
    inner: EventInner,
}

// SAFETY: CUDA and HIP events may be recorded, queried and waited on from any thread.
unsafe impl Send for Event {}
// SAFETY: as for Send; the runtime synchronises its own state.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event on `ctx` (timing disabled: cheaper to record and query).
    pub fn new(ctx: &Arc<Context>) -> Result<Event> {
        ctx.bind()?;
        let inner = match ctx.platform() {
            Platform::Cuda => EventInner::Cuda(
                result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                    .call("cuEventCreate")?,
            ),
            Platform::Hip => EventInner::Hip(torchcomms_hip::Event::new()?),
        };
        Ok(Event {
            ctx: Arc::clone(ctx),
            inner,
        })
    }

    /// Records the work issued so far on `stream`.
    pub fn record(&self, stream: RawStream) -> Result<()> {
        match &self.inner {
            EventInner::Cuda(raw) => {
                // SAFETY: the event is alive; the caller vouches for the stream.
                unsafe { result::event::record(*raw, stream.raw()) }.call("cuEventRecord")
            }
            // SAFETY: as above.
            EventInner::Hip(ev) => Ok(unsafe { ev.record_raw(stream.hip()) }?),
        }
    }

    /// True once the recorded work is done; an error if that work failed.
    pub fn query(&self) -> Result<bool> {
        let raw = match &self.inner {
            EventInner::Cuda(raw) => *raw,
            EventInner::Hip(ev) => return super::graph::relaxed(|| Ok(ev.is_complete()?)),
        };
        // SAFETY: the event is alive.
        let r = super::graph::relaxed(|| unsafe { result::event::query(raw) });
        match r.call("cuEventQuery") {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_ready() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Blocks the host until the recorded work is done.
    pub fn synchronize(&self) -> Result<()> {
        match &self.inner {
            EventInner::Cuda(raw) => {
                // SAFETY: the event is alive.
                unsafe { result::event::synchronize(*raw) }.call("cuEventSynchronize")
            }
            EventInner::Hip(ev) => Ok(ev.synchronize()?),
        }
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let EventInner::Cuda(raw) = self.inner else {
            return;
        };
        // cuEventDestroy does not wait: resources go once the recorded work is done.
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: we created the event and nobody else destroys it.
            unsafe { result::event::destroy(raw) }.call("cuEventDestroy")
        });
        if let Err(e) = r {
            tracing::warn!("dropping a CUDA event: {e}");
        }
    }
}
