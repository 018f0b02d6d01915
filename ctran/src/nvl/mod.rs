//! The NVLink transport: ranks of one host whose GPUs reach each other's memory move data with
//! kernels that load and store peer memory directly (CUDA IPC), synchronised by flags in peer
//! memory. Nothing on the host waits for the device: an operation is one kernel launch on the
//! comm's stream, ordered after the caller's stream like NCCL's (a synchronous one-kernel op on
//! the caller's stream itself), and capturable in CUDA graphs.
//!
//! At comm creation every rank allocates a flag array and an arena (two halves for staged
//! collectives, a ring per peer for sends and receives, the low-latency region, the pipeline's
//! scratch) and exchanges their IPC handles;
//! the transport is on only when every rank is on this host, sees every peer's device and can
//! reach it (`cuDeviceCanAccessPeer`); otherwise the caller keeps the host-transport path (the
//! GPE). [`plan`] says how each collective maps onto the kernels (small all_reduces take the
//! low-latency kernel, the rest the collective kernel); [`registry`] caches the IPC
//! handles of user buffers for direct mode. Large all_reduces run [`pipeline`]d instead: copy
//! engines move the data on side streams, kernels only reduce and order.
//!
//! Memory: the flag array (80 KiB), the arena (`2 x CTRAN_NVL_STAGED_MAX_BYTES` plus
//! `CTRAN_NVL_P2P_SLOTS x CTRAN_NVL_P2P_SLOT_BYTES` per peer plus the low-latency region,
//! `4 x CTRAN_NVL_LL_MAX_BYTES` per rank, plus `CTRAN_NVL_PIPE_BYTES` of pipeline scratch) and
//! nothing per operation: direct mode works in the user's buffers.

pub mod kernels;
pub mod pipeline;
pub mod plan;
pub mod registry;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::algos::select::Hints;
use crate::comm::{Comm, KeepAlive};
use crate::cuda::ipc::{self, Mapped, HANDLE_BYTES};
use crate::cuda::{Context, CudaError, DeviceBuffer, Event, PinnedBuffer, RawStream, Stream};
use crate::error::{Error, Result};
use crate::gpe::{cuda_err, DeviceStatus, GpeRequest, OpState};
use crate::{Op, P2p, Span};
use kernels::{
    LlParams, NvlKernels, P2pOp, P2pParams, PipeSync, Sync, COUNTER_BYTES, FLAG_BYTES, MAX_BLOCKS,
    MAX_P2P, MAX_RANKS,
};

use pipeline::{Lane, Step};
use plan::{Layout, Mode};
use registry::{Record, Registry, RECORD_BYTES};

/// How the transport is set up (from the `CTRAN_NVL_*` cvars).
#[derive(Debug, Clone)]
pub struct NvlConfig {
    /// Largest per-rank input of a staged collective; larger ones go direct.
    pub staged_max_bytes: usize,
    /// Largest all_reduce input of the low-latency path (0: off).
    pub ll_max_bytes: usize,
    /// Bytes of one slot of a point-to-point ring.
    pub p2p_slot_bytes: usize,
    /// Slots per peer.
    pub p2p_slots: usize,
    /// Blocks of staged and p2p kernels (0: one per multiprocessor); direct ones run twice as
    /// many (at most 256).
    pub blocks: usize,
    /// `auto`, `staged` or `direct`.
    pub mode: String,
    /// Device memory the transport may allocate per comm.
    pub budget_bytes: usize,
    /// Scratch of the pipelined all_reduce (0: off).
    pub pipe_bytes: usize,
    /// Its largest chunk (0: automatic).
    pub pipe_chunk_bytes: usize,
    /// The smallest all_reduce `auto` pipelines.
    pub pipe_min_bytes: usize,
}

/// Most blocks of a staged collective when `CTRAN_NVL_BLOCKS` is 0.
const STAGED_BLOCKS: u64 = 64;

/// The arena of one comm's transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Arena {
    /// Bytes in all.
    bytes: usize,
    /// Of which the pipeline's scratch (its tail).
    pipe_bytes: usize,
}

impl Arena {
    /// Everything the configuration asks for.
    fn all(config: &NvlConfig, nranks: usize) -> Arena {
        let rest = 2 * config.staged_max_bytes
            + nranks * config.p2p_slots * config.p2p_slot_bytes
            + plan::ll_region_bytes(config.ll_max_bytes, nranks) as usize;
        Arena {
            bytes: rest + config.pipe_bytes,
            pipe_bytes: config.pipe_bytes,
        }
    }

    /// What fits in `CTRAN_NVL_BUDGET_BYTES` with the flags: all of it, or all but the
    /// pipeline's scratch (the pipeline is then off, not the transport); `None` when not even
    /// that fits.
    fn within_budget(config: &NvlConfig, nranks: usize) -> Option<Arena> {
        let all = Arena::all(config, nranks);
        let rest = all.bytes - all.pipe_bytes;
        if all.bytes + FLAG_BYTES <= config.budget_bytes {
            Some(all)
        } else if rest + FLAG_BYTES <= config.budget_bytes {
            Some(Arena {
                bytes: rest,
                pipe_bytes: 0,
            })
        } else {
            None
        }
    }
}

/// Offsets in the mapped status page.
const STATUS: usize = 0;
const ABORT: usize = 64;

/// One rank's card in the setup exchange.
const CARD_BYTES: usize = 8 + 8 + 32 + 8 + 2 * HANDLE_BYTES + 8;

/// The NVLink transport of one communicator on one device.
#[derive(Debug)]
pub struct Nvl {
    comm: Arc<Comm>,
    /// Carries the per-operation address exchanges of direct mode, apart from the comm's own
    /// host operations so the two never interleave differently on different ranks.
    control: Comm,
    ctx: Arc<Context>,
    kernels: Arc<NvlKernels>,
    /// Blocks of staged collectives.
    grid: u32,
    /// Blocks of point-to-point launches and of the pipeline's reductions.
    sm_grid: u32,
    /// Blocks of direct collectives (a superset of `grid`'s).
    direct_grid: u32,
    layout: Layout,
    p2p_ring: [u64; MAX_RANKS],
    config: NvlConfig,
    flags: DeviceBuffer,
    counters: DeviceBuffer,
    _arena: DeviceBuffer,
    peer_flags: [u64; MAX_RANKS],
    _peers: Vec<Mapped>,
    status: Arc<PinnedBuffer>,
    pre: Event,
    /// Orders the stream an operation runs on after the one holding the comm's latest.
    join: Event,
    /// The pipeline's side lanes (scatter, reduce, gather), and the event that orders lanes.
    lanes: [Stream; 3],
    order: Event,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    /// Buffers of operations in flight, dropped once their event has completed.
    pending: VecDeque<(Arc<Event>, KeepAlive)>,
    /// The caller's stream that holds the comm's latest operation, when a synchronous one ran
    /// there instead of on the comm's stream; `None` when the comm's stream holds it.
    tail: Option<RawStream>,
}

fn cuda(op: &str, rank: usize) -> impl Fn(CudaError) -> Error + '_ {
    move |e| cuda_err(op, rank, e)
}

impl Nvl {
    /// Sets the transport up for `comm` on device `ctx`; every rank of the comm must call it.
    /// `Ok(None)` when some rank cannot use it (then none does).
    pub fn start(comm: &Arc<Comm>, ctx: &Arc<Context>, config: NvlConfig) -> Result<Option<Nvl>> {
        let (rank, size) = (comm.rank(), comm.size());
        let e = cuda("new_comm", rank);
        let p2p_bytes = size * config.p2p_slots * config.p2p_slot_bytes;
        let mut why_not = None;
        if size > MAX_RANKS {
            why_not = Some(format!(
                "{size} ranks (the NVLink kernels address at most {MAX_RANKS})"
            ));
        }
        let Arena {
            bytes: arena_bytes,
            pipe_bytes,
        } = Arena::within_budget(&config, size).unwrap_or_else(|| {
            let a = Arena::all(&config, size);
            why_not = Some(format!(
                "its arena ({} bytes without the pipeline's scratch) exceeds CTRAN_NVL_BUDGET_BYTES ({})",
                a.bytes - a.pipe_bytes,
                config.budget_bytes
            ));
            a
        });
        if pipe_bytes < config.pipe_bytes {
            tracing::info!(
                rank,
                "nvl: no pipelined all_reduce: its scratch (CTRAN_NVL_PIPE_BYTES) does not fit in CTRAN_NVL_BUDGET_BYTES"
            );
        }
        let flags = DeviceBuffer::zeroed(ctx, FLAG_BYTES).map_err(&e)?;
        let counters = DeviceBuffer::zeroed(ctx, COUNTER_BYTES).map_err(&e)?;
        // A rank that cannot take part allocates no arena (only a token to export): the budget
        // holds even for the moment before the verdict.
        let arena_alloc = if why_not.is_none() { arena_bytes } else { 0 };
        let arena = DeviceBuffer::zeroed(ctx, arena_alloc.max(16)).map_err(&e)?;
        let flags_out = ipc::export(ctx, flags.as_ptr()).map_err(&e)?;
        let arena_out = ipc::export(ctx, arena.as_ptr()).map_err(&e)?;
        let bus = ipc::pci_bus_id(ctx).map_err(&e)?;
        // The card: host, eligibility, device, SMs, handles, arena size.
        let mut card = Vec::with_capacity(CARD_BYTES);
        card.extend_from_slice(&crate::comm::host_id().to_le_bytes());
        card.extend_from_slice(&u64::from(why_not.is_none()).to_le_bytes());
        let mut busb = [0u8; 32];
        busb[..bus.len().min(31)].copy_from_slice(&bus.as_bytes()[..bus.len().min(31)]);
        card.extend_from_slice(&busb);
        card.extend_from_slice(&(ctx.sm_count().max(1) as u64).to_le_bytes());
        card.extend_from_slice(&flags_out.handle);
        card.extend_from_slice(&arena_out.handle);
        card.extend_from_slice(&(arena_bytes as u64).to_le_bytes());
        let cards = comm.all_gather_bytes(&card, None)?;
        let cards: Vec<&[u8]> = cards.chunks_exact(CARD_BYTES).collect();
        let word = |c: &[u8], at: usize| u64::from_le_bytes(c[at..at + 8].try_into().expect("8"));
        let me = cards[rank];
        let mut ok = why_not.is_none();
        let mut sms = u64::MAX;
        let mut peers = Vec::new();
        let mut peer_flags = [0u64; MAX_RANKS];
        let mut arenas = [0u64; MAX_RANKS];
        for (q, c) in cards.iter().enumerate() {
            ok &= word(c, 0) == word(me, 0)
                && word(c, 8) == 1
                && word(c, 56 + 2 * HANDLE_BYTES) == arena_bytes as u64;
            sms = sms.min(word(c, 48));
            if !ok || q >= MAX_RANKS {
                ok = false;
                continue;
            }
            if q == rank {
                peer_flags[q] = flags.as_ptr();
                arenas[q] = arena.as_ptr();
                continue;
            }
            let bus_q = String::from_utf8_lossy(&c[16..48])
                .trim_end_matches('\0')
                .to_string();
            if !ipc::can_access(ctx, &bus_q).unwrap_or(false) {
                if why_not.is_none() {
                    why_not = Some(format!(
                        "device {bus} cannot reach rank {q}'s device {bus_q}"
                    ));
                }
                ok = false;
                continue;
            }
            let mut h = [0u8; HANDLE_BYTES];
            h.copy_from_slice(&c[56..56 + HANDLE_BYTES]);
            let mut ha = [0u8; HANDLE_BYTES];
            ha.copy_from_slice(&c[56 + HANDLE_BYTES..56 + 2 * HANDLE_BYTES]);
            match (Mapped::open(ctx, &h), Mapped::open(ctx, &ha)) {
                (Ok(f), Ok(a)) => {
                    peer_flags[q] = f.ptr();
                    arenas[q] = a.ptr();
                    peers.push(f);
                    peers.push(a);
                }
                (r1, r2) => {
                    let err = r1
                        .err()
                        .or(r2.err())
                        .map(|e| e.to_string())
                        .unwrap_or_default();
                    why_not.get_or_insert(format!("mapping rank {q}'s memory: {err}"));
                    ok = false;
                }
            }
        }
        // Everyone must agree: one more exchange of the local verdicts.
        let verdicts = comm.all_gather_bytes(&[u8::from(ok)], None)?;
        if verdicts.contains(&0) {
            tracing::info!(
                rank,
                reason = why_not.as_deref().unwrap_or("a peer cannot"),
                "nvl: off"
            );
            return Ok(None);
        }
        let control = comm
            .split(
                &(0..size).collect::<Vec<_>>(),
                &format!("{}.nvl", comm.name()),
                None,
                false,
            )?
            .ok_or_else(|| Error::NotSupported("nvl: control comm missing".into()))?;
        let clamp = |b: u64| b.clamp(1, MAX_BLOCKS as u64) as u32;
        // Staged collectives run fewer blocks than the GPU has multiprocessors: on 2 H200, 64
        // blocks took 9.5-10.7 us from 8 B to 256 KB against 10.5-11.6 with 132, and 2 MB in
        // 16.6 against 17.6 us (docs/perf/gpu.md). Point-to-point transfers and the pipeline's
        // reductions move more bytes per launch and keep one block per multiprocessor.
        let (grid, sm_grid) = match config.blocks {
            0 => (clamp(sms.min(STAGED_BLOCKS)), clamp(sms)),
            b => (clamp(b as u64), clamp(b as u64)),
        };
        // Direct mode runs twice as many blocks as the GPU has multiprocessors: a 1 GB
        // all_reduce on 2 H200 moved 337 GB/s with 256 blocks against 316 with one per SM,
        // while 256 blocks doubled the 8 KB latency (11 to 22 us). Staged collectives keep
        // `grid`: the arena halves are safe only if every staged op cuts the arena with the
        // same grid, and blocks 0..grid take part in every collective (direct ones too), so
        // their epochs (and halves) stay in step.
        let direct_grid = (sm_grid * 2).min(MAX_BLOCKS as u32);
        let kernels = NvlKernels::get(ctx).map_err(&e)?;
        let status = Arc::new(PinnedBuffer::alloc(ctx, 128).map_err(&e)?);
        // The arena: staged halves, send rings, LL region, then the pipeline's scratch.
        let coll_bytes = 2 * config.staged_max_bytes as u64;
        let ll_bytes = plan::ll_region_bytes(config.ll_max_bytes, size);
        let mut p2p_ring = [0u64; MAX_RANKS];
        let mut ll = [0u64; MAX_RANKS];
        let mut scratch = [0u64; MAX_RANKS];
        for q in 0..size {
            p2p_ring[q] = arenas[q] + coll_bytes;
            ll[q] = p2p_ring[q] + p2p_bytes as u64;
            scratch[q] = ll[q] + ll_bytes;
        }
        let lane = || Stream::new(ctx, false).map_err(&e);
        tracing::info!(rank, grid, sm_grid, direct_grid, "nvl: on");
        Ok(Some(Nvl {
            comm: Arc::clone(comm),
            control,
            ctx: Arc::clone(ctx),
            kernels,
            grid,
            sm_grid,
            direct_grid,
            layout: Layout {
                rank,
                nranks: size,
                arena: arenas,
                half: config.staged_max_bytes as u64,
                scratch,
                scratch_bytes: pipe_bytes,
                ll,
                ll_slot: plan::ll_slot_bytes(config.ll_max_bytes),
            },
            p2p_ring,
            config,
            flags,
            counters,
            _arena: arena,
            peer_flags,
            _peers: peers,
            pre: Event::new(ctx).map_err(&e)?,
            join: Event::new(ctx).map_err(&e)?,
            lanes: [lane()?, lane()?, lane()?],
            order: Event::new(ctx).map_err(&e)?,
            status,
            inner: Mutex::new(Inner {
                registry: Registry::new(ctx),
                pending: VecDeque::new(),
                tail: None,
            }),
        }))
    }

    fn sync(&self, timeout: Duration) -> Sync {
        Sync {
            flags: self.flags.as_ptr(),
            peer_flags: self.peer_flags,
            counters: self.counters.as_ptr(),
            status: self.status.device_ptr() + STATUS as u64,
            abort_flag: self.status.device_ptr() + ABORT as u64,
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            rank: self.layout.rank as u32,
            nranks: self.layout.nranks as u32,
        }
    }

    /// Makes every waiting kernel of this comm give up (their operations fail as aborted).
    pub fn abort(&self) {
        // SAFETY: 4 aligned bytes of our mapped page; kernels only read this word.
        unsafe { std::ptr::write_volatile(self.status.as_ptr().add(ABORT).cast::<u32>(), 1) };
    }

    /// The mode `op` runs in, the same on every rank; an unknown or inapplicable hint is an
    /// error that lists the valid ones.
    fn mode(&self, op: &Op, hints: Hints<'_>) -> Result<Mode> {
        let staged =
            plan::staged_bytes(op, hints.uniform).filter(|&b| b <= self.config.staged_max_bytes);
        let low_latency = matches!(op, Op::AllReduce { buf, .. }
            if self.config.ll_max_bytes > 0 && buf.len() <= self.config.ll_max_bytes);
        // Whether the scratch holds chunks does not depend on the size: ask for none, so the
        // check allocates nothing on the latency path.
        let pipelinable = matches!(op, Op::AllReduce { .. }) && self.chunking(0).is_some();
        // Auto pipelines only where it was measured to win: two GPUs (docs/perf/gpu.md). More
        // ranks may ask for it by cvar or hint.
        let auto = || match op {
            Op::AllReduce { buf, .. }
                if pipelinable
                    && self.layout.nranks == 2
                    && buf.len() >= self.config.pipe_min_bytes =>
            {
                Mode::Pipelined
            }
            _ if low_latency => Mode::LowLatency,
            _ if staged.is_some() => Mode::Staged,
            _ => Mode::Direct,
        };
        let Some(asked) = hints.algo else {
            // The cvar: staged where the op can be, pipelined all_reduce where it can be, direct
            // elsewhere.
            return Ok(match (self.config.mode.as_str(), staged) {
                ("pipelined", _) if pipelinable => Mode::Pipelined,
                ("low_latency", _) if low_latency => Mode::LowLatency,
                ("direct", _) => Mode::Direct,
                ("staged", Some(_)) => Mode::Staged,
                ("staged", None) => Mode::Direct,
                _ => auto(),
            });
        };
        let refuse = |expected: String| {
            Err(Error::invalid(
                format!("{} algo", op.name()),
                expected,
                asked,
            ))
        };
        match asked {
            "auto" | "" => Ok(auto()),
            "low_latency" | "ll" if low_latency => Ok(Mode::LowLatency),
            "staged" | "one_shot" if staged.is_some() => Ok(Mode::Staged),
            "direct" | "two_shot" => Ok(Mode::Direct),
            "pipelined" if pipelinable => Ok(Mode::Pipelined),
            "pipelined" => refuse(format!(
                "auto, staged or direct: pipelined is for all_reduce over at least two ranks with CTRAN_NVL_PIPE_BYTES of scratch (it is {})",
                self.config.pipe_bytes
            )),
            "low_latency" | "ll" => refuse(format!(
                "auto, staged or direct: low_latency is for all_reduce of at most {} bytes (CTRAN_NVL_LL_MAX_BYTES)",
                self.config.ll_max_bytes
            )),
            "staged" | "one_shot" => refuse(format!(
                "direct or two_shot: staged takes equal blocks of at most {} bytes per rank (CTRAN_NVL_STAGED_MAX_BYTES)",
                self.config.staged_max_bytes
            )),
            _ => refuse(
                "one of auto, low_latency (ll; all_reduce), staged (one_shot), direct (two_shot), pipelined (all_reduce) for GPU buffers over NVLink"
                    .into(),
            ),
        }
    }

    /// Issues `op` on `stream` (the comm's) after the caller's stream. Every rank issues the
    /// same operations in the same order. A synchronous operation (`sync_op`: the caller waits
    /// for it at once) that is one kernel runs on the caller's stream itself: the same order,
    /// three driver calls fewer (no hop to the comm's stream and back).
    #[allow(clippy::too_many_arguments)]
    pub fn issue(
        &self,
        op: &Op,
        caller: RawStream,
        stream: RawStream,
        timeout: Duration,
        hints: Hints<'_>,
        keep: KeepAlive,
        sync_op: bool,
    ) -> Result<GpeRequest> {
        let name = op.name();
        let rank = self.layout.rank;
        let e = cuda(name, rank);
        let device = DeviceStatus {
            word: Arc::clone(&self.status),
            comm: self.comm.name().into(),
            timeout,
        };
        if let Some(err) = device.error(name, rank) {
            return Err(err);
        }
        let captured = caller.is_capturing().map_err(&e)?;
        let sync = self.sync(timeout);
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        self.reap(&mut inner);
        self.ctx.bind().map_err(&e)?;
        // None: point to point, which has no modes.
        let mode = if op.is_p2p() {
            None
        } else {
            Some(self.mode(op, hints)?)
        };
        let on_caller = sync_op
            && !captured
            && caller != stream
            && matches!(mode, Some(Mode::LowLatency | Mode::Staged));
        let runs_on = if on_caller { caller } else { stream };
        // A captured operation runs at replay, after whatever ran before the capture.
        if !captured {
            self.follow_tail(&mut inner, runs_on, stream).map_err(&e)?;
        }
        let launch: Launch = match mode {
            None => Launch::P2p(Box::new(self.p2p_params(op, sync)?)),
            Some(Mode::Pipelined) => {
                let Op::AllReduce {
                    buf,
                    dtype,
                    op: rop,
                } = op
                else {
                    unreachable!("mode() pipelines all_reduce only");
                };
                // A bad dtype or operator fails alike on every rank, before the exchange.
                let reduction = plan::reduction(sync, *dtype, *rop, self.layout.nranks)?;
                let reduction = Box::new(reduction);
                let planned = match self.exchange(op, &mut inner.registry, timeout)? {
                    Ok(peers) => self
                        .pipeline(buf, &peers)
                        // Sizes differ: every rank has every rank's size, so all fail
                        // here and meet at the barriers of an empty schedule.
                        .map_err(|err| (err, 0)),
                    // Only this rank failed (mapping a peer's buffer): peers run the
                    // whole schedule, so run its flags too, moving nothing.
                    Err(err) => Err((err, buf.len())),
                };
                match planned {
                    Ok(steps) => Launch::Pipeline(*dtype, reduction, steps),
                    Err((err, agreed)) => {
                        let released = self.launch_now(
                            &Launch::Pipeline(*dtype, reduction, self.syncs_only(agreed)),
                            caller,
                            stream,
                        );
                        if let Err(e2) = released {
                            tracing::warn!("nvl: releasing peers after an error: {e2}");
                        }
                        return Err(err);
                    }
                }
            }
            Some(Mode::LowLatency) => {
                let (dtype, p) = plan::low_latency(op, &self.layout, sync)?;
                Launch::Ll(dtype, Box::new(p), self.grid)
            }
            Some(Mode::Staged) => {
                let (dtype, p) = plan::staged(op, &self.layout, sync)?;
                Launch::Coll(dtype, Box::new(p), self.grid)
            }
            Some(Mode::Direct) => {
                let planned = self
                    .exchange(op, &mut inner.registry, timeout)?
                    .and_then(|peers| {
                        let at = |q: usize, i: usize| peers[q].get(i).map_or(0, |a| a.0);
                        let len = |q: usize, i: usize| peers[q].get(i).map_or(0, |a| a.1);
                        plan::direct(op, &self.layout, sync, &at, &len)
                    });
                match planned {
                    Ok((dtype, p)) => Launch::Coll(dtype, Box::new(p), self.direct_grid),
                    Err(err) => {
                        // Peers have planned and will launch: meet them at both barriers
                        // with nothing to move, so they finish, and report the error here.
                        let mut p = kernels::CollParams::new(sync);
                        p.end_barrier = 1;
                        let stream_err = self.launch_now(
                            &Launch::Coll(crate::DataType::U8, Box::new(p), self.direct_grid),
                            caller,
                            stream,
                        );
                        if let Err(e2) = stream_err {
                            tracing::warn!("nvl: releasing peers after an error: {e2}");
                        }
                        return Err(err);
                    }
                }
            }
        };
        let done = Arc::new(Event::new(&self.ctx).map_err(&e)?);
        self.launch_now(&launch, caller, runs_on)?;
        done.record(runs_on).map_err(&e)?;
        if !captured {
            inner.pending.push_back((Arc::clone(&done), keep));
        }
        let state = Arc::new(OpState::on_device(device));
        let request = GpeRequest::new(name, done, state, caller, rank, captured);
        Ok(if on_caller {
            request.on_caller_stream()
        } else {
            request
        })
    }

    /// Orders `runs_on`, where the next operation will run, after the comm's latest
    /// operation, when another stream holds it; `runs_on` holds the latest from now on.
    /// Every operation goes through here before it launches anything (releases of peers after
    /// an error included), so the comm's operations stay in one order on the device.
    fn follow_tail(
        &self,
        inner: &mut Inner,
        runs_on: RawStream,
        comm_stream: RawStream,
    ) -> std::result::Result<(), CudaError> {
        let holder = inner.tail.unwrap_or(comm_stream);
        if holder != runs_on {
            self.join.record(holder)?;
            runs_on.wait_event(&self.join)?;
        }
        inner.tail = (runs_on != comm_stream).then_some(runs_on);
        Ok(())
    }

    /// Orders `stream` after `caller` (unless they are one stream) and launches on `stream`.
    fn launch_now(&self, launch: &Launch, caller: RawStream, stream: RawStream) -> Result<()> {
        let e = cuda("nvl launch", self.layout.rank);
        if caller != stream {
            self.pre.record(caller).map_err(&e)?;
            stream.wait_event(&self.pre).map_err(&e)?;
        }
        match launch {
            // SAFETY: the buffers are the op's tensors (kept alive by the caller's keepalive
            // until the op's event), the arena, flags and counters of this comm (alive while it
            // is, and Drop waits for the stream), and peers' memory mapped by IPC; every rank
            // launches the same plan.
            Launch::Coll(dtype, p, grid) => unsafe { self.kernels.coll(*dtype, *grid, p, stream) },
            // SAFETY: as above; every rank launches the LL kernel on the same `grid`.
            Launch::Ll(dtype, p, grid) => unsafe { self.kernels.ll(*dtype, *grid, p, stream) },
            // SAFETY: as above.
            Launch::P2p(p) => unsafe { self.kernels.p2p(self.sm_grid, p, stream) },
            Launch::Pipeline(dtype, reduction, steps) => {
                self.run_pipeline(*dtype, reduction, steps, stream)
            }
        }
        .map_err(&e)
    }

    /// The chunking of a pipelined all_reduce of `bytes`, if it can run.
    fn chunking(&self, bytes: usize) -> Option<pipeline::Chunking> {
        pipeline::chunking(
            bytes,
            self.layout.nranks,
            self.layout.scratch_bytes,
            self.config.pipe_chunk_bytes,
        )
    }

    /// The steps of a pipelined all_reduce of `buf` given every rank's buffer (`peers`, from
    /// the exchange); an error when some rank's buffer has another size.
    fn pipeline(&self, buf: &Span, peers: &Peers) -> Result<Vec<Step>> {
        let rank = self.layout.rank;
        let mut bufs = [0; MAX_RANKS];
        for (q, list) in peers.iter().enumerate() {
            let (at, len) = list.first().copied().unwrap_or((0, 0));
            if len != buf.len() {
                return Err(Error::invalid(
                    "all_reduce tensor",
                    format!("{len} bytes, as rank {q} has"),
                    format!("{} bytes on rank {rank}", buf.len()),
                ));
            }
            bufs[q] = if q == rank { buf.addr() as u64 } else { at };
        }
        let chunking = self
            .chunking(buf.len())
            .expect("mode() checked the scratch");
        Ok(pipeline::schedule(
            &self.layout,
            &bufs,
            buf.len(),
            &chunking,
        ))
    }

    /// The flag steps of a pipelined all_reduce of `bytes` (0: the two barriers alone), which
    /// release peers that run the same schedule when this rank cannot move data.
    fn syncs_only(&self, bytes: usize) -> Vec<Step> {
        let Some(chunking) = self.chunking(bytes) else {
            return Vec::new();
        };
        pipeline::schedule(&self.layout, &[0; MAX_RANKS], bytes, &chunking)
            .into_iter()
            .filter(|s| matches!(s, Step::Sync { .. } | Step::Order { .. }))
            .collect()
    }

    /// Issues a pipeline's steps: lanes are the comm's stream and our three side streams.
    fn run_pipeline(
        &self,
        dtype: crate::DataType,
        reduction: &kernels::CollParams,
        steps: &[Step],
        main: RawStream,
    ) -> std::result::Result<(), CudaError> {
        let lane = |l: Lane| match l {
            Lane::Main => main,
            Lane::Scatter => self.lanes[0].as_raw(),
            Lane::Reduce => self.lanes[1].as_raw(),
            Lane::Gather => self.lanes[2].as_raw(),
        };
        let elem = dtype.size_bytes();
        for step in steps {
            match step {
                Step::Sync {
                    lane: l,
                    signal,
                    wait,
                    advance,
                } => {
                    let p = PipeSync::new(reduction.sync, *signal, *wait, *advance);
                    // SAFETY: `sync` is this comm's (flags, counters and status outlive the
                    // stream's work: Drop waits for it); peers run the same schedule.
                    unsafe { self.kernels.pipe_sync(&p, lane(*l))? }
                }
                Step::Copy {
                    lane: l,
                    dst,
                    src,
                    len,
                } => {
                    // SAFETY: the schedule copies within this op's buffer (kept alive until
                    // its event) into peers' buffers or scratch, mapped over IPC and writable
                    // between the barriers.
                    unsafe { crate::cuda::driver::copy_async(*dst, *src, *len, lane(*l))? }
                }
                Step::Reduce { dst, srcs, len } => {
                    let mut p = *reduction;
                    p.rsrc[..srcs.len()].copy_from_slice(srcs);
                    p.nsrc = srcs.len() as u32;
                    p.rdst[0] = *dst;
                    p.ndst = 1;
                    p.rcount = (*len / elem) as u64;
                    if p.rcount > 0 {
                        // SAFETY: our buffer's chunk and our scratch, which peers' copies have
                        // filled (the sync before this on the lane waited for them).
                        unsafe {
                            self.kernels
                                .pipe_reduce(dtype, self.sm_grid, &p, lane(Lane::Reduce))?
                        }
                    }
                }
                Step::Order { from, to } => {
                    self.order.record(lane(*from))?;
                    lane(*to).wait_event(&self.order)?;
                }
            }
        }
        Ok(())
    }

    /// Drops the buffers of completed operations.
    fn reap(&self, inner: &mut Inner) {
        while let Some((ev, _)) = inner.pending.front() {
            if !crate::cuda::graph::relaxed(|| ev.query()).unwrap_or(true) {
                break;
            }
            inner.pending.pop_front();
        }
    }

    /// Direct mode's exchange: every rank's exposed buffers, as (address here, length).
    fn exchange(
        &self,
        op: &Op,
        registry: &mut Registry,
        timeout: Duration,
    ) -> Result<Result<Peers>> {
        let rank = self.layout.rank;
        let mine = plan::exposed(op);
        if mine.len() > MAX_RANKS {
            return Err(Error::NotSupported(format!(
                "nvl: {} exposes {} buffers (at most {MAX_RANKS})",
                op.name(),
                mine.len()
            )));
        }
        let mut wire = Vec::with_capacity(8 + MAX_RANKS * RECORD_BYTES);
        let mut records = Vec::new();
        let mut failure = None;
        for s in &mine {
            match registry.expose(s.addr() as u64, s.len()) {
                Ok(r) => records.push(r),
                Err(err) => {
                    failure.get_or_insert(err.to_string());
                    records.push(Record::default());
                }
            }
        }
        wire.extend_from_slice(&(records.len() as u32).to_le_bytes());
        wire.extend_from_slice(&u32::from(failure.is_none()).to_le_bytes());
        for r in &records {
            r.write(&mut wire);
        }
        wire.resize(8 + MAX_RANKS * RECORD_BYTES, 0);
        let all = self.control.all_gather_bytes(&wire, Some(timeout))?;
        let mut out = Vec::with_capacity(self.layout.nranks);
        for (q, w) in all.chunks_exact(wire.len()).enumerate() {
            let count = u32::from_le_bytes(w[0..4].try_into().expect("4")) as usize;
            let ok = u32::from_le_bytes(w[4..8].try_into().expect("4")) == 1;
            if !ok {
                return Err(Error::NotSupported(format!(
                    "{}: rank {q} cannot export its buffers over CUDA IPC{}",
                    op.name(),
                    failure
                        .as_deref()
                        .map(|f| format!(" ({f})"))
                        .unwrap_or_default()
                )));
            }
            let mut list = Vec::with_capacity(count);
            for i in 0..count.min(MAX_RANKS) {
                let r = Record::read(&w[8 + i * RECORD_BYTES..]);
                let addr = if q == rank {
                    if r.len == 0 {
                        0
                    } else {
                        mine[i].addr() as u64
                    }
                } else {
                    match registry.resolve(q, &r) {
                        Ok(a) => a,
                        Err(err) => return Ok(Err(cuda(op.name(), rank)(err))),
                    }
                };
                list.push((addr, r.len as usize));
            }
            out.push(list);
        }
        Ok(Ok(out))
    }

    fn p2p_params(&self, op: &Op, sync: Sync) -> Result<P2pParams> {
        let list: Vec<(Span, usize, bool)> = match op {
            Op::Send { buf, peer } => vec![(*buf, *peer, true)],
            Op::Recv { buf, peer } => vec![(*buf, *peer, false)],
            Op::Batch { ops } => ops
                .iter()
                .map(|o| match o {
                    P2p::Send { buf, peer } => (*buf, *peer, true),
                    P2p::Recv { buf, peer } => (*buf, *peer, false),
                })
                .collect(),
            _ => Vec::new(),
        };
        if list.len() > MAX_P2P {
            return Err(Error::NotSupported(format!(
                "nvl: a batch of {} transfers (at most {MAX_P2P} per launch)",
                list.len()
            )));
        }
        let mut p = P2pParams {
            sync,
            ring: self.p2p_ring[self.layout.rank],
            peer_ring: self.p2p_ring,
            slot_bytes: self.config.p2p_slot_bytes as u64,
            slots: self.config.p2p_slots as u32,
            nops: 0,
            ops: [P2pOp::default(); MAX_P2P],
        };
        for (buf, peer, is_send) in list {
            if peer >= self.layout.nranks || peer == self.layout.rank {
                return Err(Error::invalid(
                    format!("{} peer", op.name()),
                    format!(
                        "a rank in 0..{} other than {}",
                        self.layout.nranks, self.layout.rank
                    ),
                    peer,
                ));
            }
            p.ops[p.nops as usize] = P2pOp {
                buf: buf.addr() as u64,
                len: buf.len() as u64,
                peer: peer as u32,
                is_send: u32::from(is_send),
            };
            p.nops += 1;
        }
        Ok(p)
    }
}

/// Every rank's exposed buffers as (address here, length), by rank.
type Peers = Vec<Vec<(u64, usize)>>;

enum Launch {
    /// Element type, parameters, blocks.
    Coll(crate::DataType, Box<kernels::CollParams>, u32),
    /// Element type, parameters, blocks (the staged grid: see the LL kernel).
    Ll(crate::DataType, Box<LlParams>, u32),
    P2p(Box<P2pParams>),
    /// Element type, the reduction's operator fields, the steps.
    Pipeline(crate::DataType, Box<kernels::CollParams>, Vec<Step>),
}

impl Drop for Nvl {
    fn drop(&mut self) {
        // The stream belongs to the caller (the GPE's): our memory must outlive the kernels
        // already launched on it, so wait for the last one.
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some((ev, _)) = inner.pending.back() {
            if let Err(e) = ev.synchronize() {
                tracing::warn!("nvl: waiting for the last operation: {e}");
            }
        }
        inner.pending.clear();
        let _ = self.control.finalize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(staged: usize, pipe: usize, budget: usize) -> NvlConfig {
        NvlConfig {
            staged_max_bytes: staged,
            ll_max_bytes: 0,
            p2p_slot_bytes: 1 << 20,
            p2p_slots: 4,
            blocks: 0,
            mode: "auto".into(),
            budget_bytes: budget,
            pipe_bytes: pipe,
            pipe_chunk_bytes: 0,
            pipe_min_bytes: 128 << 20,
        }
    }

    #[test]
    fn the_pipeline_scratch_gives_way_before_the_transport_does() {
        let mib = 1 << 20;
        // The defaults on 8 ranks: 2 x 16 + 8 x 4 + 8 (LL: 2 halves x 8 sources x 512 KiB of
        // lines) + 128 MiB fit in 256.
        let defaults = NvlConfig {
            ll_max_bytes: 256 << 10,
            ..config(16 * mib, 128 * mib, 256 * mib)
        };
        let a = Arena::within_budget(&defaults, 8).expect("fits");
        assert_eq!(
            a,
            Arena {
                bytes: 200 * mib,
                pipe_bytes: 128 * mib
            }
        );
        // Larger staged halves: the scratch no longer fits, the rest does.
        let a = Arena::within_budget(&config(64 * mib, 128 * mib, 256 * mib), 2).expect("fits");
        assert_eq!(
            a,
            Arena {
                bytes: 136 * mib,
                pipe_bytes: 0
            }
        );
        // Not even the staged halves fit: no transport.
        assert_eq!(
            Arena::within_budget(&config(128 * mib, 0, 256 * mib), 2),
            None
        );
    }
}
