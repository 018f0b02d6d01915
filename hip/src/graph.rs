//! HIP graphs: capture the work issued on a stream, then replay it (what `torch.cuda.graph`
//! does on ROCm builds of PyTorch), and the per-thread capture mode that lets a watchdog poll
//! events while another thread captures.
//!
//! Never ran on an AMD GPU (docs/amd.md).

use std::ffi::c_void;

use crate::error::Result;
use crate::runtime::availability;
use crate::sys::{self, check};

/// Starts capturing `stream` in `mode` (`HIP_STREAM_CAPTURE_MODE_*`).
///
/// # Safety
/// `stream` must be a live stream of the current device (not the null stream).
pub unsafe fn begin_capture(stream: *mut c_void, mode: i32) -> Result<()> {
    availability()?;
    let hip = sys::hip()?;
    // SAFETY: forwarded to the caller.
    check(hip, "hipStreamBeginCapture", unsafe {
        (hip.hipStreamBeginCapture)(stream, mode)
    })
}

/// Ends the capture of `stream` and instantiates what it captured.
///
/// # Safety
/// As for [`begin_capture`], on the stream a capture was begun on.
pub unsafe fn end_capture(stream: *mut c_void) -> Result<Graph> {
    let hip = sys::hip()?;
    let mut graph = std::ptr::null_mut();
    // SAFETY: forwarded to the caller; `graph` is a valid out-pointer.
    check(hip, "hipStreamEndCapture", unsafe {
        (hip.hipStreamEndCapture)(stream, &mut graph)
    })?;
    let mut exec = std::ptr::null_mut();
    // SAFETY: `graph` was just captured; no error node or log buffer is asked for.
    let made = check(hip, "hipGraphInstantiate", unsafe {
        (hip.hipGraphInstantiate)(
            &mut exec,
            graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    });
    if let Err(e) = made {
        // SAFETY: ours, destroyed once.
        unsafe { (hip.hipGraphDestroy)(graph) };
        return Err(e);
    }
    Ok(Graph { graph, exec })
}

/// Exchanges this thread's capture mode with `mode`, returning the previous one.
pub fn exchange_capture_mode(mode: i32) -> Result<i32> {
    let hip = sys::hip()?;
    let mut m = mode;
    // SAFETY: `m` is a valid in/out pointer.
    check(hip, "hipThreadExchangeStreamCaptureMode", unsafe {
        (hip.hipThreadExchangeStreamCaptureMode)(&mut m)
    })?;
    Ok(m)
}

/// A captured and instantiated graph; destroyed on drop.
#[derive(Debug)]
pub struct Graph {
    graph: sys::HipGraph,
    exec: sys::HipGraphExec,
}

// SAFETY: graph handles may be launched and destroyed from any thread.
unsafe impl Send for Graph {}
// SAFETY: launching an instantiated graph is thread-safe.
unsafe impl Sync for Graph {}

impl Graph {
    /// Replays the graph on `stream`.
    ///
    /// # Safety
    /// `stream` must be null or a live stream of the graph's device.
    pub unsafe fn launch(&self, stream: *mut c_void) -> Result<()> {
        let hip = sys::hip()?;
        // SAFETY: the graph is alive; the caller vouches for the stream.
        check(hip, "hipGraphLaunch", unsafe {
            (hip.hipGraphLaunch)(self.exec, stream)
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Ok(hip) = sys::hip() {
            // SAFETY: ours, each destroyed once.
            let r = check(hip, "hipGraphExecDestroy", unsafe {
                (hip.hipGraphExecDestroy)(self.exec)
            })
            // SAFETY: as above.
            .and(check(hip, "hipGraphDestroy", unsafe {
                (hip.hipGraphDestroy)(self.graph)
            }));
            if let Err(e) = r {
                tracing::warn!("destroying a HIP graph: {e}");
            }
        }
    }
}
