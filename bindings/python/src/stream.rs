//! torch's current CUDA stream of a communicator's device, read once per operation and per
//! `wait()`: CUDA operations run after the work issued on it so far, and `wait()` orders it
//! after the operation (ProcessGroupNCCL's and upstream's semantics).

use std::sync::OnceLock;

use pyo3::prelude::*;

/// How a communicator reads the current stream: nothing on CPU; on CUDA torch's
/// `_cuda_getCurrentRawStream(index)` (a plain int, no `Stream` object: a fraction of a
/// microsecond instead of several), or `torch.cuda.current_stream(device)` where that function
/// is missing or the device has no index.
#[derive(Debug)]
enum Reader {
    Cpu,
    Raw { func: Py<PyAny>, index: i64 },
    Stream,
}

/// The current-stream reader of one communicator, set up on first use.
#[derive(Debug, Default)]
pub(crate) struct CurrentStream(OnceLock<Reader>);

impl CurrentStream {
    /// The raw `cudaStream_t` of torch's current stream on `device`, or `None` on CPU.
    pub(crate) fn read(&self, py: Python<'_>, device: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        let reader = match self.0.get() {
            Some(r) => r,
            None => {
                let r = reader(py, device)?;
                self.0.get_or_init(|| r)
            }
        };
        match reader {
            Reader::Cpu => Ok(None),
            Reader::Raw { func, index } => Ok(Some(func.call1(py, (*index,))?.extract(py)?)),
            Reader::Stream => {
                let stream = py
                    .import("torch")?
                    .getattr("cuda")?
                    .call_method1("current_stream", (device,))?;
                Ok(Some(stream.getattr("cuda_stream")?.extract()?))
            }
        }
    }
}

fn reader(py: Python<'_>, device: &Bound<'_, PyAny>) -> PyResult<Reader> {
    if device.getattr("type")?.extract::<String>()? != "cuda" {
        return Ok(Reader::Cpu);
    }
    let index: Option<i64> = device.getattr("index")?.extract()?;
    let func = py
        .import("torch")?
        .getattr("_C")?
        .getattr("_cuda_getCurrentRawStream")
        .ok();
    Ok(match (func, index) {
        (Some(func), Some(index)) => Reader::Raw {
            func: func.unbind(),
            index,
        },
        _ => Reader::Stream,
    })
}
