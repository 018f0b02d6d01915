//! Starting the transport: every rank allocates its flag array and arena, exports their IPC
//! handles in a card, maps every peer's, and all ranks agree on whether the transport is on.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::kernels::{NvlKernels, COUNTER_BYTES, FLAG_BYTES, MAX_BLOCKS, MAX_RANKS};
use super::plan::{self, Layout};
use super::registry::Registry;
use super::{cuda, Inner, Nvl, NvlConfig};
use crate::comm::Comm;
use crate::cuda::ipc::{self, Mapped, HANDLE_BYTES};
use crate::cuda::{Context, DeviceBuffer, Event, PinnedBuffer, Stream};
use crate::error::{Error, Result};

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

/// One rank's card in the setup exchange.
const CARD_BYTES: usize = 8 + 8 + 32 + 8 + 2 * HANDLE_BYTES + 8;

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
            pipe_bcast_min_bytes: 128 << 20,
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
