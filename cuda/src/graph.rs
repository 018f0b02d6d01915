//! Graphs (CUDA's or HIP's): capture the work issued on a stream, then replay it.
//!
//! Collectives must run correctly when issued while the caller's stream is capturing (PyTorch's
//! `torch.cuda.graph`). These types let the GPU tests capture and replay like PyTorch does, and
//! let threads that poll events (watchdogs) opt out of a global-mode capture's restrictions.

use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::driver::Context;
use super::error::{DriverResultExt, Result};
use super::platform::{platform, Platform};
use super::stream::RawStream;

/// How a capture treats calls that could implicitly synchronise with it
/// (`CUstreamCaptureMode`). PyTorch's `torch.cuda.graph` uses `Global` by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureMode {
    /// Unsafe calls from any thread fail while the capture runs.
    Global,
    /// Unsafe calls from the capturing thread fail.
    ThreadLocal,
    /// Nothing is forbidden.
    Relaxed,
}

impl CaptureMode {
    fn hip(self) -> i32 {
        use torchcomms_hip::sys as h;
        match self {
            CaptureMode::Global => h::HIP_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => h::HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => h::HIP_STREAM_CAPTURE_MODE_RELAXED,
        }
    }

    fn raw(self) -> sys::CUstreamCaptureMode {
        use sys::CUstreamCaptureMode as M;
        match self {
            CaptureMode::Global => M::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => M::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => M::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

/// Starts capturing the work issued on `stream` (which must not be the legacy default stream).
pub fn begin_capture(ctx: &Arc<Context>, stream: RawStream, mode: CaptureMode) -> Result<()> {
    ctx.bind()?;
    if ctx.platform() == Platform::Hip {
        // SAFETY: the caller vouches for the stream; HIP rejects the null stream.
        return Ok(unsafe { torchcomms_hip::graph::begin_capture(stream.hip(), mode.hip()) }?);
    }
    // SAFETY: the caller vouches for the stream; the driver rejects the default stream.
    unsafe { result::stream::begin_capture(stream.raw(), mode.raw()) }.call("cuStreamBeginCapture")
}

/// Ends the capture started on `stream` and instantiates the captured graph.
pub fn end_capture(ctx: &Arc<Context>, stream: RawStream) -> Result<Graph> {
    ctx.bind()?;
    if ctx.platform() == Platform::Hip {
        // SAFETY: as for begin_capture.
        let hip = unsafe { torchcomms_hip::graph::end_capture(stream.hip()) }?;
        return Ok(Graph {
            ctx: Arc::clone(ctx),
            inner: GraphInner::Hip(hip),
        });
    }
    // SAFETY: as for begin_capture; on success we own the returned graph.
    let graph = unsafe { result::stream::end_capture(stream.raw()) }.call("cuStreamEndCapture")?;
    // SAFETY: `graph` is the valid graph just captured.
    let exec = match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }
        .call("cuGraphInstantiate")
    {
        Ok(exec) => exec,
        Err(e) => {
            // SAFETY: ours, destroyed once.
            let _ = unsafe { result::graph::destroy(graph) };
            return Err(e);
        }
    };
    Ok(Graph {
        ctx: Arc::clone(ctx),
        inner: GraphInner::Cuda { graph, exec },
    })
}

/// Makes this thread exempt from a global-mode capture on another thread: a watchdog that
/// queries events must keep working while the user captures a graph (as PyTorch's does).
pub fn relax_capture_mode_for_this_thread() -> Result<()> {
    if platform() == Platform::Hip {
        return Ok(torchcomms_hip::relax_capture_mode_for_this_thread()?);
    }
    let mut mode = CaptureMode::Relaxed.raw();
    // SAFETY: exchanges one enum of this thread's state.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }
        .result()
        .call("cuThreadExchangeStreamCaptureMode")
}

/// Runs `f` with this thread's capture mode relaxed, then restores it. Event polls go through
/// here: a poll from a thread that is not capturing would otherwise invalidate another thread's
/// global-mode capture (PyTorch guards its own polls the same way).
pub fn relaxed<T>(f: impl FnOnce() -> T) -> T {
    if platform() == Platform::Hip {
        use torchcomms_hip::graph::exchange_capture_mode;
        let before = exchange_capture_mode(CaptureMode::Relaxed.hip());
        let out = f();
        if let Ok(mode) = before {
            let _ = exchange_capture_mode(mode);
        }
        return out;
    }
    let mut mode = CaptureMode::Relaxed.raw();
    // SAFETY: exchanges one enum of this thread's state; restored below.
    let swapped = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }
        .result()
        .is_ok();
    let out = f();
    if swapped {
        // SAFETY: as above; `mode` holds the previous mode.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
    out
}

/// A captured and instantiated graph; replay it with [`Graph::launch`].
#[derive(Debug)]
pub struct Graph {
    ctx: Arc<Context>,
    inner: GraphInner,
}

/// A graph's handles in its runtime.
#[derive(Debug)]
enum GraphInner {
    Cuda {
        graph: sys::CUgraph,
        exec: sys::CUgraphExec,
    },
    Hip(torchcomms_hip::graph::Graph),
}

// SAFETY: graph handles may be launched and destroyed from any thread of the process.
unsafe impl Send for Graph {}
// SAFETY: launching is a thread-safe driver call on an immutable executable graph.
unsafe impl Sync for Graph {}

impl Graph {
    /// Replays the graph on `stream` (stream-ordered, returns at once).
    pub fn launch(&self, stream: RawStream) -> Result<()> {
        self.ctx.bind()?;
        match &self.inner {
            GraphInner::Cuda { exec, .. } => {
                // SAFETY: the executable graph is alive; the caller vouches for the stream.
                unsafe { result::graph::launch(*exec, stream.raw()) }.call("cuGraphLaunch")
            }
            // SAFETY: as above.
            GraphInner::Hip(g) => Ok(unsafe { g.launch(stream.hip()) }?),
        }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let GraphInner::Cuda { graph, exec } = self.inner else {
            return;
        };
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: ours, each destroyed once; the driver waits for launches in flight.
            unsafe { result::graph::exec_destroy(exec) }.call("cuGraphExecDestroy")?;
            // SAFETY: as above.
            unsafe { result::graph::destroy(graph) }.call("cuGraphDestroy")
        });
        if let Err(e) = r {
            tracing::warn!("destroying a CUDA graph: {e}");
        }
    }
}
