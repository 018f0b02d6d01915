//! One-sided windows over NVLink: every rank exposes one device buffer of the same size (CUDA
//! IPC, through the transport's registration cache) and a signal array, and maps its peers'.
//! A put is a copy-engine copy into the peer's window on the caller's stream; a signal adds one
//! to the peer's slot for this rank after the stream's earlier work; a wait holds the stream
//! until the slot this rank keeps for the peer exceeds the signals consumed so far. Nothing
//! waits on the host, every operation is stream-ordered, and all of them replay correctly in
//! CUDA graphs (signals add and waits count on the device).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::kernels::MAX_RANKS;
use super::registry::{Record, MIN_EXPORT_BYTES, RECORD_BYTES};
use super::{cuda, Nvl};
use crate::comm::KeepAlive;
use crate::cuda::ipc;
use crate::cuda::kernels::{load_once, PerDevice};
use crate::cuda::{
    self as cu, Context, DeviceBuffer, Event, Function, Module, PinnedBuffer, RawStream,
};
use crate::error::{Error, Result};
use crate::gpe::{DeviceStatus, GpeRequest, OpState};

/// Source of the window kernels: the CUDA/HIP compatibility header, then `kernels/window.cu`.
pub(crate) fn window_source() -> &'static str {
    static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    crate::cuda::kernels::with_compat(&SOURCE, &[include_str!("kernels/window.cu")])
}
pub(crate) const WINDOW_SOURCE_NAME: &str = "ctran/src/nvl/kernels/window.cu";

/// Bytes of a window's signal allocation: the signal slots, then the consumed counters. CUDA
/// IPC exports allocations of at least [`MIN_EXPORT_BYTES`], so it is that large.
const SIGNAL_BYTES: usize = MIN_EXPORT_BYTES as usize;
/// Where the consumed counters start in it.
const CONSUMED_AT: u64 = (MAX_RANKS * 8) as u64;
/// Where the table of every rank's window (as mapped here) starts in it, for the all-gather
/// kernel; the table of peers' slots for this rank follows (see `kernels/window.cu`).
const BASES_AT: u64 = (3 * MAX_RANKS * 8) as u64;
/// Copy blocks of an all-gather, over all ranks (all resident at once: the kernel spins).
const ALLGATHER_BLOCKS: usize = 64;
/// Bytes of one rank's part of the exchange: ok flag, window length, the window's record and
/// the signal array's.
const WIRE_BYTES: usize = 4 + 8 + 2 * RECORD_BYTES;
/// Puts up to this size copy with one block of threads (and carry their signal in the same
/// launch); larger ones take a copy engine, which starts later but moves data faster.
pub const SMALL_PUT_BYTES: usize = 64 << 10;
/// Threads of the small-put kernel.
const PUT_THREADS: u32 = 512;

#[derive(Debug)]
struct WindowKernels {
    _module: Module,
    signal: Function,
    wait: Function,
    put: Function,
    allgather: Function,
}

fn window_kernels(ctx: &Arc<Context>) -> crate::cuda::error::Result<Arc<WindowKernels>> {
    static LOADED: PerDevice<WindowKernels> = PerDevice::new();
    load_once(
        &LOADED,
        ctx,
        WINDOW_SOURCE_NAME,
        window_source(),
        |module, _| {
            Ok(WindowKernels {
                signal: module.function("tc_win_signal")?,
                wait: module.function("tc_win_wait")?,
                put: module.function("tc_win_put")?,
                allgather: module.function("tc_win_allgather")?,
                _module: module,
            })
        },
    )
}

/// One window of an NVLink communicator.
#[derive(Debug)]
pub struct NvlWindow {
    ctx: Arc<Context>,
    kernels: Arc<WindowKernels>,
    rank: usize,
    nranks: usize,
    comm_name: String,
    /// Bytes of every rank's window.
    len: usize,
    /// Every rank's window as mapped here (this rank's own buffer at `rank`).
    bases: [u64; MAX_RANKS],
    /// This rank's signal slots (slot q: signals from rank q), then its consumed counters.
    signals: DeviceBuffer,
    /// Where the slot each peer keeps for this rank is mapped here.
    peer_slots: [u64; MAX_RANKS],
    status: Arc<PinnedBuffer>,
    /// The device words a wait reports through and polls (from the transport's).
    status_ptr: u64,
    abort_ptr: u64,
    /// Buffers of puts in flight, dropped once their event completed.
    pending: Mutex<VecDeque<(Arc<Event>, KeepAlive)>>,
}

impl Nvl {
    /// Makes a window of `len` bytes at device address `addr` (collective: every rank calls it
    /// with its own buffer; ranks whose sizes differ all fail, naming them).
    pub fn new_window(&self, addr: u64, len: usize, timeout: Duration) -> Result<NvlWindow> {
        let rank = self.layout.rank;
        let nranks = self.layout.nranks;
        let e = cuda("new_window", rank);
        let kernels = window_kernels(&self.ctx).map_err(&e)?;
        let signals = DeviceBuffer::zeroed(&self.ctx, SIGNAL_BYTES).map_err(&e)?;
        let mut failure: Option<String> = None;
        let record = {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            inner.registry.expose(addr, len).unwrap_or_else(|err| {
                failure = Some(err.to_string());
                Record::default()
            })
        };
        let signal_record = match ipc::export(&self.ctx, signals.as_ptr()) {
            Ok(x) => Record {
                handle: x.handle,
                base: x.base,
                buffer_id: x.buffer_id,
                offset: signals.as_ptr() - x.base,
                len: SIGNAL_BYTES as u64,
            },
            Err(err) => {
                failure.get_or_insert(err.to_string());
                Record::default()
            }
        };
        let mut wire = Vec::with_capacity(WIRE_BYTES);
        wire.extend_from_slice(&u32::from(failure.is_none()).to_le_bytes());
        wire.extend_from_slice(&(len as u64).to_le_bytes());
        record.write(&mut wire);
        signal_record.write(&mut wire);
        let all = self.control.all_gather_bytes(&wire, Some(timeout))?;
        let parts: Vec<&[u8]> = all.chunks_exact(WIRE_BYTES).collect();
        let lens: Vec<u64> = parts
            .iter()
            .map(|w| u64::from_le_bytes(w[4..12].try_into().expect("8 bytes")))
            .collect();
        if lens.iter().any(|&l| l != len as u64) {
            return Err(Error::InvalidArgument {
                arg: "tensor".into(),
                expected: format!(
                    "a window of the same size on every rank (rank {rank}: {len} bytes)"
                ),
                got: format!("windows of {lens:?} bytes by rank"),
            });
        }
        if let Some(q) = parts.iter().position(|w| w[0..4] != 1u32.to_le_bytes()) {
            return Err(Error::NotSupported(format!(
                "[rank {rank}] new_window: rank {q} cannot export its window over CUDA IPC{}",
                failure.map(|f| format!(" ({f})")).unwrap_or_default()
            )));
        }
        let mut bases = [0u64; MAX_RANKS];
        let mut peer_slots = [0u64; MAX_RANKS];
        let mut mapped = Ok(());
        for (q, w) in parts.iter().enumerate() {
            if q == rank {
                bases[q] = addr;
                peer_slots[q] = signals.as_ptr() + 8 * rank as u64;
                continue;
            }
            let data = Record::read(&w[12..]);
            let sig = Record::read(&w[12 + RECORD_BYTES..]);
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let map = |reg: &mut super::registry::Registry| {
                Ok::<_, crate::cuda::CudaError>((reg.resolve(q, &data)?, reg.resolve(q, &sig)?))
            };
            // A mapping of memory the peer freed since can overlap its new allocations.
            let found = map(&mut inner.registry).or_else(|_| {
                inner.registry.forget(q);
                map(&mut inner.registry)
            });
            match found {
                Ok((b, sg)) => {
                    bases[q] = b;
                    peer_slots[q] = sg + 8 * rank as u64;
                }
                Err(err) => {
                    mapped = Err(format!("mapping rank {q}'s window: {err}"));
                    break;
                }
            }
        }
        // Every rank learns whether every rank mapped its peers, so all fail together.
        let flag = [u8::from(mapped.is_ok())];
        let flags = self.control.all_gather_bytes(&flag, Some(timeout))?;
        if let Some(q) = flags.iter().position(|&f| f != 1) {
            return Err(Error::Cuda {
                op: "new_window".into(),
                rank,
                detail: match mapped {
                    Err(why) => why,
                    Ok(()) => format!("rank {q} could not map its peers' windows"),
                },
            });
        }
        // The tables the all-gather kernel reads: every rank's window, every peer's slot for us.
        let table: Vec<u8> = bases
            .iter()
            .chain(peer_slots.iter())
            .flat_map(|w| w.to_le_bytes())
            .collect();
        signals
            .write(BASES_AT as usize, &table)
            .map_err(cuda("new_window", rank))?;
        let sync = self.sync(timeout);
        Ok(NvlWindow {
            ctx: Arc::clone(&self.ctx),
            kernels,
            rank,
            nranks,
            comm_name: self.comm.name().into(),
            len,
            bases,
            signals,
            peer_slots,
            status: Arc::clone(&self.status),
            status_ptr: sync.status,
            abort_ptr: sync.abort_flag,
            pending: Mutex::new(VecDeque::new()),
        })
    }
}

impl NvlWindow {
    /// Bytes of every rank's window.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the windows are empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address, in this process, of `rank`'s window (its own buffer for this rank).
    pub fn base(&self, rank: usize) -> Option<u64> {
        (rank < self.nranks).then(|| self.bases[rank])
    }

    fn device_status(&self, timeout: Duration) -> DeviceStatus {
        DeviceStatus {
            word: Arc::clone(&self.status),
            comm: self.comm_name.clone(),
            timeout,
        }
    }

    fn check_peer(&self, op: &str, arg: &str, peer: usize) -> Result<()> {
        if peer >= self.nranks {
            return Err(Error::InvalidArgument {
                arg: arg.into(),
                expected: format!("{op}: a rank in [0, {})", self.nranks),
                got: peer.to_string(),
            });
        }
        Ok(())
    }

    /// Common start of an operation: an earlier device failure fails it, and finished puts
    /// release their buffers.
    fn begin(&self, op: &'static str, stream: RawStream, timeout: Duration) -> Result<bool> {
        if let Some(err) = self.device_status(timeout).error(op, self.rank) {
            return Err(err);
        }
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        while let Some((ev, _)) = pending.front() {
            if !cu::graph::relaxed(|| ev.query()).unwrap_or(true) {
                break;
            }
            pending.pop_front();
        }
        drop(pending);
        self.ctx.bind().map_err(cuda(op, self.rank))?;
        stream.is_capturing().map_err(cuda(op, self.rank))
    }

    /// The request of an operation just enqueued on `stream`.
    fn finish(
        &self,
        op: &'static str,
        stream: RawStream,
        captured: bool,
        keep: KeepAlive,
        timeout: Duration,
    ) -> Result<GpeRequest> {
        let e = cuda(op, self.rank);
        let done = Arc::new(Event::new(&self.ctx).map_err(&e)?);
        done.record(stream).map_err(&e)?;
        if !captured {
            self.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_back((Arc::clone(&done), keep));
        }
        let state = Arc::new(OpState::on_device(self.device_status(timeout)));
        Ok(GpeRequest::new(op, done, state, stream, self.rank, captured).on_caller_stream())
    }

    /// Copies `bytes` at device address `src` into `peer`'s window at byte `offset`, on
    /// `stream` after its earlier work, then (`signal`) adds one to the signal `peer` keeps for
    /// this rank. `keep` holds the source until the copy ran.
    #[allow(clippy::too_many_arguments)]
    pub fn put(
        &self,
        src: u64,
        bytes: usize,
        peer: usize,
        offset: usize,
        signal: bool,
        stream: RawStream,
        keep: KeepAlive,
        timeout: Duration,
    ) -> Result<GpeRequest> {
        self.check_peer("put", "dst_rank", peer)?;
        if offset.checked_add(bytes).is_none_or(|end| end > self.len) {
            return Err(Error::InvalidArgument {
                arg: "target_offset_nelems".into(),
                expected: format!(
                    "put: the data to fit the window of {} bytes on rank {peer}",
                    self.len
                ),
                got: format!("{bytes} bytes at byte offset {offset}"),
            });
        }
        let captured = self.begin("put", stream, timeout)?;
        let e = cuda("put", self.rank);
        let dst = self.bases[peer] + offset as u64;
        if bytes <= SMALL_PUT_BYTES {
            let slot = if signal { self.peer_slots[peer] } else { 0 };
            let len = bytes as u64;
            // SAFETY: the destination lies inside `peer`'s window (checked above) and the slot
            // in its signal array, both mapped while this window lives; the source is the
            // caller's device memory, kept alive by `keep` until the kernel ran.
            unsafe {
                self.kernels
                    .put
                    .args()
                    .arg(&dst)
                    .arg(&src)
                    .arg(&len)
                    .arg(&slot)
                    .launch(1, PUT_THREADS, stream)
            }
            .map_err(&e)?;
        } else {
            // SAFETY: as above, by a copy engine.
            unsafe { cu::copy_async(dst, src, bytes, stream) }.map_err(&e)?;
            if signal {
                self.launch_signal(peer, stream).map_err(&e)?;
            }
        }
        self.finish("put", stream, captured, keep, timeout)
    }

    fn launch_signal(&self, peer: usize, stream: RawStream) -> crate::cuda::error::Result<()> {
        let slot = self.peer_slots[peer];
        // SAFETY: `slot` is one word of the peer's signal allocation (or ours), mapped while
        // this window lives; the kernel adds to it atomically.
        unsafe { self.kernels.signal.args().arg(&slot).launch(1, 1, stream) }
    }

    /// Adds one to the signal `peer` keeps for this rank, after `stream`'s earlier work (so
    /// after this rank's earlier puts on it).
    pub fn signal(&self, peer: usize, stream: RawStream, timeout: Duration) -> Result<GpeRequest> {
        self.check_peer("signal", "peer_rank", peer)?;
        let captured = self.begin("signal", stream, timeout)?;
        self.launch_signal(peer, stream)
            .map_err(cuda("signal", self.rank))?;
        self.finish("signal", stream, captured, Vec::new(), timeout)
    }

    /// Holds `stream` until `peer` signalled once more than this rank has waited for so far.
    pub fn wait_signal(
        &self,
        peer: usize,
        stream: RawStream,
        timeout: Duration,
    ) -> Result<GpeRequest> {
        self.check_peer("wait_signal", "peer_rank", peer)?;
        let captured = self.begin("wait_signal", stream, timeout)?;
        let slot = self.signals.as_ptr() + 8 * peer as u64;
        let consumed = self.signals.as_ptr() + CONSUMED_AT + 8 * peer as u64;
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: the slot and the counter are words of this window's signal allocation; the
        // status and abort words belong to the transport's mapped page, alive while it is.
        unsafe {
            self.kernels
                .wait
                .args()
                .arg(&slot)
                .arg(&consumed)
                .arg(&self.status_ptr)
                .arg(&self.abort_ptr)
                .arg(&timeout_ns)
                .launch(1, 1, stream)
        }
        .map_err(cuda("wait_signal", self.rank))?;
        self.finish("wait_signal", stream, captured, Vec::new(), timeout)
    }
}

impl NvlWindow {
    /// A persistent all-gather's round in one launch on `stream`: `bytes` at `src` go to byte
    /// `offset` of every rank's window (this rank's own included, unless `src` is already
    /// there). Per peer: a "free" signal, a wait for the peer's, the copy and a "data" signal,
    /// then a wait for the peer's data; signals are consumed as `wait_signal` consumes them.
    pub fn all_gather(
        &self,
        src: u64,
        bytes: usize,
        offset: usize,
        stream: RawStream,
        keep: KeepAlive,
        timeout: Duration,
    ) -> Result<GpeRequest> {
        if offset.checked_add(bytes).is_none_or(|end| end > self.len) {
            return Err(Error::InvalidArgument {
                arg: "input".into(),
                expected: format!(
                    "all_gather_p_exec: a block that fits the window of {} bytes",
                    self.len
                ),
                got: format!("{bytes} bytes at byte offset {offset}"),
            });
        }
        let captured = self.begin("all_gather_p_exec", stream, timeout)?;
        let per = (ALLGATHER_BLOCKS / self.nranks).max(1);
        let geometry = self.nranks as u64 | (self.rank as u64) << 8 | (per as u64) << 16;
        let words = self.signals.as_ptr();
        let (len, off) = (bytes as u64, offset as u64);
        let timeout_ns = timeout.as_nanos().min(u128::from(u64::MAX)) as u64;
        // SAFETY: `words` is this window's signal allocation with its tables (written at
        // creation); every destination lies inside a rank's window (checked above) mapped
        // while this window lives; the source is the caller's device memory, kept alive by
        // `keep` until the kernel ran.
        unsafe {
            self.kernels
                .allgather
                .args()
                .arg(&words)
                .arg(&src)
                .arg(&len)
                .arg(&off)
                .arg(&geometry)
                .arg(&self.status_ptr)
                .arg(&self.abort_ptr)
                .arg(&timeout_ns)
                .launch((per * self.nranks) as u32, PUT_THREADS, stream)
        }
        .map_err(cuda("all_gather_p_exec", self.rank))?;
        self.finish("all_gather_p_exec", stream, captured, keep, timeout)
    }
}

impl Drop for NvlWindow {
    fn drop(&mut self) {
        // Peers' mappings and our signal array must outlive the copies and kernels enqueued.
        let pending = self.pending.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some((ev, _)) = pending.back() {
            if let Err(e) = ev.synchronize() {
                tracing::warn!("nvl window: waiting for the last put: {e}");
            }
        }
        pending.clear();
    }
}
