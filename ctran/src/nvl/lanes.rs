//! Running a pipelined all_reduce: its schedule ([`super::pipeline`]) issued on the comm's
//! stream and the transport's three side lanes, copy engines moving the data.

use super::exchange::Peers;
use super::kernels::{self, PipeSync, MAX_RANKS};
use super::pipeline::{self, Lane, Step};
use super::Nvl;
use crate::cuda::{CudaError, RawStream};
use crate::error::{Error, Result};
use crate::Span;

impl Nvl {
    /// The chunking of a pipelined all_reduce of `bytes`, if it can run.
    pub(super) fn chunking(&self, bytes: usize) -> Option<pipeline::Chunking> {
        pipeline::chunking(
            bytes,
            self.layout.nranks,
            self.layout.scratch_bytes,
            self.config.pipe_chunk_bytes,
        )
    }

    /// The steps of a pipelined all_reduce of `buf` (a broadcast from `root`) given every
    /// rank's buffer (`peers`, from the exchange); an error when some rank's buffer has
    /// another size.
    pub(super) fn pipeline(
        &self,
        buf: &Span,
        root: Option<usize>,
        peers: &Peers,
    ) -> Result<Vec<Step>> {
        let rank = self.layout.rank;
        let mut bufs = [0; MAX_RANKS];
        for (q, list) in peers.iter().enumerate() {
            let (at, len) = list.first().copied().unwrap_or((0, 0));
            if len != buf.len() {
                let what = if root.is_some() {
                    "broadcast"
                } else {
                    "all_reduce"
                };
                return Err(Error::invalid(
                    format!("{what} tensor"),
                    format!("{len} bytes, as rank {q} has"),
                    format!("{} bytes on rank {rank}", buf.len()),
                ));
            }
            bufs[q] = if q == rank { buf.addr() as u64 } else { at };
        }
        if let Some(root) = root {
            return Ok(pipeline::broadcast_schedule(
                &self.layout,
                &bufs,
                buf.len(),
                root,
            ));
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

    /// The flag steps of a pipelined all_reduce of `bytes` (0: the two barriers alone; a
    /// broadcast from `root`: always those two), which release peers that run the same
    /// schedule when this rank cannot move data.
    pub(super) fn syncs_only(&self, root: Option<usize>, bytes: usize) -> Vec<Step> {
        let steps = match root {
            Some(root) => pipeline::broadcast_schedule(&self.layout, &[0; MAX_RANKS], 0, root),
            None => match self.chunking(bytes) {
                Some(chunking) => {
                    pipeline::schedule(&self.layout, &[0; MAX_RANKS], bytes, &chunking)
                }
                None => return Vec::new(),
            },
        };
        steps
            .into_iter()
            .filter(|s| matches!(s, Step::Sync { .. } | Step::Order { .. }))
            .collect()
    }

    /// Issues a pipeline's steps: lanes are the comm's stream and our three side streams.
    pub(super) fn run_pipeline(
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
                    unsafe { crate::cuda::copy_async(*dst, *src, *len, lane(*l))? }
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
}
