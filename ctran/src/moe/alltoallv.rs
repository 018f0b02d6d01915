//! `device_alltoallv_single` on CUDA between ranks that map each other's memory: three kernels
//! on the caller's stream (`kernels/alltoallv.cu`) exchange the counts through every rank's
//! symmetric region and copy the rows straight into the receivers' outputs. The counts never
//! reach the host, and a capture records the kernels like any others (CUDA graphs).
//!
//! At issue every rank exposes its output (CUDA IPC, cached like the NVLink transport's user
//! buffers) through one host all-gather; a rank whose output cannot be exported (an allocation
//! under 2 MiB) makes every rank take the GPU progress engine's path instead
//! ([`DeviceAllToAllv::run`] returns false everywhere).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::symmetric::{SymmetricRegion, MAX_RANKS};
use super::words::{AbortWord, ErrorWords};
use crate::comm::Comm;
use crate::cuda::kernels::{load_once, PerDevice};
use crate::cuda::{Context, DeviceRepr, Event, Function, Module, RawStream};
use crate::error::{Error, Result};
use crate::gpe::cuda_err;
use crate::nvl::registry::{Record, Registry, RECORD_BYTES};

/// Source of the kernels: the CUDA/HIP compatibility header, `kernels/report.cuh`, then
/// `kernels/alltoallv.cu`.
pub fn alltoallv_source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    crate::cuda::kernels::with_compat(
        &SOURCE,
        &[
            include_str!("kernels/report.cuh"),
            include_str!("kernels/alltoallv.cu"),
        ],
    )
}
/// Its name in logs and cache files.
pub const ALLTOALLV_SOURCE_NAME: &str = "ctran/src/moe/kernels/alltoallv.cu";

// Fields mirror the CUDA struct of the same name in alltoallv.cu, which documents them.
#[allow(missing_docs)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct A2avParams {
    pub rank: u32,
    pub size: u32,
    pub row_bytes: u64,
    pub in_rows: u64,
    pub out_rows: u64,
    pub input: u64,
    pub in_counts: u64,
    pub out_counts: u64,
    pub timeout_ns: u64,
    pub err: u64,
    pub abort: u64,
    pub region: [u64; MAX_RANKS],
    pub output: [u64; MAX_RANKS],
}

// SAFETY: plain old data laid out as the CUDA struct (repr(C), u32 pair then u64 fields).
unsafe impl DeviceRepr for A2avParams {}

#[derive(Debug)]
struct Kernels {
    ctx: Arc<Context>,
    _module: Module,
    counts: Function,
    send: Function,
    recv: Function,
}

impl Kernels {
    fn get(ctx: &Arc<Context>) -> crate::cuda::error::Result<Arc<Kernels>> {
        static LOADED: PerDevice<Kernels> = OnceLock::new();
        load_once(
            &LOADED,
            ctx,
            ALLTOALLV_SOURCE_NAME,
            alltoallv_source(),
            |module, _| {
                Ok(Kernels {
                    ctx: Arc::clone(ctx),
                    counts: module.function("a2av_counts")?,
                    send: module.function("a2av_send")?,
                    recv: module.function("a2av_recv")?,
                    _module: module,
                })
            },
        )
    }
}

/// One device all_to_all_v: device addresses and sizes (rows of `row_bytes`).
#[derive(Debug, Clone, Copy)]
pub struct DynamicArgs {
    /// Rows to send, packed by destination.
    pub input: u64,
    /// Rows `input` holds.
    pub in_rows: usize,
    /// Where rows land, packed by source.
    pub output: u64,
    /// Rows `output` holds.
    pub out_rows: usize,
    /// Bytes per row.
    pub row_bytes: usize,
    /// int64 per destination, read on the device.
    pub in_counts: u64,
    /// int64 per source, written on the device.
    pub out_counts: u64,
}

/// The count matrix (two parities), the flags and the state of every rank's region.
fn region_bytes(size: usize) -> usize {
    (2 * size * (size + 1) + 2 * size + 2) * 8
}

/// Device all_to_all_v of one communicator whose ranks map each other's memory.
#[derive(Debug)]
pub struct DeviceAllToAllv {
    region: SymmetricRegion,
    registry: Mutex<Registry>,
    kernels: Arc<Kernels>,
    /// Code and three details of the first device error (mapped host memory).
    err: ErrorWords,
    /// Recorded after the last operation: drop waits for it before freeing memory.
    last: Event,
    rank: usize,
    size: usize,
    timeout: Duration,
    /// Raised when the communicator aborts.
    abort: Arc<AbortWord>,
    comm: String,
}

impl DeviceAllToAllv {
    /// Sets up the regions on `ctx`'s device; `None` on every rank when some pair of ranks
    /// cannot map each other. Collective over `comm`.
    pub fn new(
        comm: &Comm,
        ctx: &Arc<Context>,
        abort: Arc<AbortWord>,
    ) -> Result<Option<DeviceAllToAllv>> {
        let (rank, size) = (comm.rank(), comm.size());
        let e = |x| cuda_err("device_alltoallv_single", rank, x);
        let region = SymmetricRegion::new(comm, ctx, region_bytes(size), true)?;
        if !region.is_mapped() {
            return Ok(None);
        }
        Ok(Some(DeviceAllToAllv {
            kernels: Kernels::get(ctx).map_err(e)?,
            err: ErrorWords::new(ctx).map_err(e)?,
            last: Event::new(ctx).map_err(e)?,
            registry: Mutex::new(Registry::new(ctx)),
            region,
            rank,
            size,
            timeout: comm.config().timeout,
            abort,
            comm: comm.name().to_string(),
        }))
    }

    /// Runs one operation on `stream`; `Ok(false)` on every rank when some rank's output
    /// cannot be mapped by its peers (then nothing ran: take another path). Collective, in
    /// the communicator's order.
    ///
    /// # Safety
    /// The addresses must be device memory of the sizes `args` gives, alive until the kernels
    /// have run on `stream`.
    pub unsafe fn run(&self, comm: &Comm, args: &DynamicArgs, stream: RawStream) -> Result<bool> {
        // An error an earlier operation's kernels reported fails this one on every rank.
        let pending = self.take_error();
        let e = |x| cuda_err("device_alltoallv_single", self.rank, x);
        let mut registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        let exposed = registry.expose(args.output, args.out_rows * args.row_bytes);
        let mut card = vec![u8::from(exposed.is_ok()), u8::from(pending.is_some())];
        exposed.clone().unwrap_or_default().write(&mut card);
        let cards = comm.all_gather_bytes(&card, None)?;
        let cards: Vec<&[u8]> = cards.chunks_exact(2 + RECORD_BYTES).collect();
        if let Some(e) = pending {
            return Err(e);
        }
        if let Some(q) = cards.iter().position(|c| c[1] != 0) {
            return Err(Error::invalid(
                "device_alltoallv_single",
                "no error on any rank from an earlier device_alltoallv_single",
                format!("rank {q} reported one (raised there)"),
            ));
        }
        if cards.iter().any(|c| c[0] == 0) {
            if let Err(why) = exposed {
                tracing::debug!(
                    rank = self.rank,
                    "device_alltoallv_single through the GPU progress engine: {why}"
                );
            }
            return Ok(false);
        }
        let mut output = [0u64; MAX_RANKS];
        for (q, c) in cards.iter().enumerate() {
            output[q] = if q == self.rank {
                args.output
            } else {
                registry.resolve(q, &Record::read(&c[2..])).map_err(e)?
            };
        }
        drop(registry);
        let p = A2avParams {
            rank: self.rank as u32,
            size: self.size as u32,
            row_bytes: args.row_bytes as u64,
            in_rows: args.in_rows as u64,
            out_rows: args.out_rows as u64,
            input: args.input,
            in_counts: args.in_counts,
            out_counts: args.out_counts,
            timeout_ns: u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX),
            err: self.err.device_ptr(),
            abort: self.abort.device_ptr(),
            region: self.region.peers(),
            output,
        };
        let k = &self.kernels;
        k.ctx.bind().map_err(e)?;
        let blocks = u32::try_from(
            (args.in_rows * args.row_bytes)
                .div_ceil(16384)
                .clamp(1, 132),
        )
        .unwrap_or(132);
        for (f, grid, block) in [(k.counts, 1, 64), (k.send, blocks, 256), (k.recv, 1, 64)] {
            // SAFETY: the kernels take one A2avParams; its addresses are the regions (alive
            // until `last` completes, which drop waits for), the peers' outputs mapped by the
            // registry (kept until this rank drops), and the caller's memory (the caller's
            // promise).
            unsafe { f.args().arg(&p).launch(grid, block, stream) }.map_err(e)?;
        }
        self.last.record(stream).map_err(e)?;
        Ok(true)
    }

    /// An event recorded on `stream` now: it completes with the operations issued there.
    pub fn event_after(&self, stream: RawStream) -> crate::cuda::error::Result<Event> {
        let done = Event::new(&self.kernels.ctx)?;
        done.record(stream)?;
        Ok(done)
    }

    /// The first error the kernels reported since the last call, cleared.
    pub fn take_error(&self) -> Option<Error> {
        let d = self.err.take()?;
        let what = |_| "device_alltoallv_single".to_string();
        if let Some(e) = d.wait_error(what, self.rank, &self.comm, self.timeout) {
            return Some(e);
        }
        let [a, b, c] = d.detail;
        Some(match d.code {
            1 => Error::invalid(
                format!("device_alltoallv_single: input_split_sizes[{a}]"),
                format!("counts >= 0 whose sum is at most input's {c} rows (nothing was sent)"),
                b as i64,
            ),
            _ => Error::invalid(
                format!("device_alltoallv_single: output on rank {a}"),
                format!("room for the rows sent to it ({b} rows; nothing was sent there)"),
                format!("{c} rows"),
            ),
        })
    }
}

impl Drop for DeviceAllToAllv {
    fn drop(&mut self) {
        if let Err(e) = self.last.synchronize() {
            tracing::warn!("device_alltoallv_single: waiting for its last kernel: {e}");
        }
    }
}
