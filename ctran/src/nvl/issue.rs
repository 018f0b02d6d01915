//! Issuing one operation: choose its mode, plan its launch (exchanging buffer addresses
//! where direct or pipelined), order it on the device after the comm's previous operation and
//! the caller's stream, launch it, and keep its buffers alive until its event completes.

use std::sync::Arc;
use std::time::Duration;

use super::kernels::{self, LlParams, P2pOp, P2pParams, Sync, MAX_P2P};
use super::pipeline::Step;
use super::plan::{self, Mode};
use super::{cuda, Inner, Nvl};
use crate::algos::select::Hints;
use crate::comm::KeepAlive;
use crate::cuda::{CudaError, Event, RawStream};
use crate::error::{Error, Result};
use crate::gpe::{DeviceStatus, GpeRequest, OpState};
use crate::{Op, P2p, Span};

impl Nvl {
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
                // A broadcast moves bytes: its "reduction" only carries the flags.
                let (buf, dtype, rop, root) = match op {
                    Op::AllReduce { buf, dtype, op } => (buf, *dtype, *op, None),
                    Op::Broadcast { buf, root } => {
                        (buf, crate::DataType::U8, crate::ReduceOp::Sum, Some(*root))
                    }
                    _ => unreachable!("mode() pipelines all_reduce and broadcast only"),
                };
                // A bad dtype or operator fails alike on every rank, before the exchange.
                let reduction = plan::reduction(sync, dtype, rop, self.layout.nranks)?;
                let reduction = Box::new(reduction);
                let planned = match self.exchange(op, &mut inner.registry, timeout)? {
                    Ok(peers) => self
                        .pipeline(buf, root, &peers)
                        // Sizes differ: every rank has every rank's size, so all fail
                        // here and meet at the barriers of an empty schedule.
                        .map_err(|err| (err, 0)),
                    // Only this rank failed (mapping a peer's buffer): peers run the
                    // whole schedule, so run its flags too, moving nothing.
                    Err(err) => Err((err, buf.len())),
                };
                match planned {
                    Ok(steps) => Launch::Pipeline(dtype, reduction, steps),
                    Err((err, agreed)) => {
                        let released = self.launch_now(
                            &Launch::Pipeline(dtype, reduction, self.syncs_only(root, agreed)),
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

    /// Drops the buffers of completed operations.
    fn reap(&self, inner: &mut Inner) {
        while let Some((ev, _)) = inner.pending.front() {
            if !crate::cuda::graph::relaxed(|| ev.query()).unwrap_or(true) {
                break;
            }
            inner.pending.pop_front();
        }
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

enum Launch {
    /// Element type, parameters, blocks.
    Coll(crate::DataType, Box<kernels::CollParams>, u32),
    /// Element type, parameters, blocks (the staged grid: see the LL kernel).
    Ll(crate::DataType, Box<LlParams>, u32),
    P2p(Box<P2pParams>),
    /// Element type, the reduction's operator fields, the steps.
    Pipeline(crate::DataType, Box<kernels::CollParams>, Vec<Step>),
}
