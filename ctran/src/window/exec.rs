//! How the progress thread runs window operations, in issue order. Puts and signals are posted
//! and stay in flight (a put over TCP finishes when its data left this rank, one by cross-memory
//! attach when written); a wait for a signal and a deregistration block the thread until done,
//! so an operation issued after them starts after them, each with the operation's deadline.

use std::time::{Duration, Instant};

use super::op::WindowOp;
use crate::error::{Error, Result};
use crate::transport::mapper::Mapper;
use crate::transport::{RegionId, RemoteKey, ReqId, SignalKind, Transport, TransportError};

/// What became of a window operation.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// It completed.
    Done,
    /// Its requests finish later (the executor keeps them in flight).
    InFlight(Vec<ReqId>),
}

/// Where a window operation runs.
pub(crate) struct WinCtx<'a> {
    pub(crate) net: &'a mut Mapper,
    pub(crate) comm: u64,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) seq: u64,
    pub(crate) timeout: Duration,
    pub(crate) deadline: Instant,
}

impl WinCtx<'_> {
    fn timeout_error(&self, op: &WindowOp, peer: usize) -> Error {
        Error::Timeout {
            op: op.name().into(),
            seq: self.seq,
            rank: self.rank,
            peer: Some(peer),
            timeout: self.timeout,
        }
    }

    /// Moves bytes until `done` holds, the deadline passes or `peer` is lost.
    fn wait_until(
        &mut self,
        op: &WindowOp,
        peers: &[usize],
        mut done: impl FnMut(&Mapper) -> std::result::Result<bool, Error>,
        err: &impl Fn(TransportError) -> Error,
    ) -> Result<()> {
        loop {
            if done(self.net)? {
                return Ok(());
            }
            for &p in peers {
                self.net.peer_alive(p).map_err(err)?;
            }
            let now = Instant::now();
            if now >= self.deadline {
                return Err(self.timeout_error(op, peers.first().copied().unwrap_or(0)));
            }
            let until = self.deadline.min(now + Duration::from_millis(20));
            self.net.progress(until, false).map_err(err)?;
        }
    }
}

/// Runs `op`; `err` turns transport failures into errors naming the operation.
pub(crate) fn run(
    cx: &mut WinCtx<'_>,
    op: &WindowOp,
    err: impl Fn(TransportError) -> Error,
) -> Result<Outcome> {
    match op {
        WindowOp::Register { buf, key_out, sink } => {
            let (_, key) = cx
                .net
                .register_region(*buf, cx.comm, sink.clone())
                .map_err(&err)?;
            key_out.copy_from_slice(&key.to_bytes());
            Ok(Outcome::Done)
        }
        WindowOp::Put {
            src,
            peer,
            key,
            offset,
        } => {
            check_key(cx, key, *peer)?;
            Ok(
                match cx.net.post_put(*peer, *src, key, *offset).map_err(&err)? {
                    Some(req) => Outcome::InFlight(vec![req]),
                    None => Outcome::Done,
                },
            )
        }
        WindowOp::LocalPut { src, dst } => {
            dst.copy_from(src);
            Ok(Outcome::Done)
        }
        WindowOp::Signal { peer, key } => {
            check_key(cx, key, *peer)?;
            let req = cx
                .net
                .post_signal(*peer, key, SignalKind::Signal, 1)
                .map_err(&err)?;
            Ok(Outcome::InFlight(vec![req]))
        }
        WindowOp::WaitSignal {
            region,
            peer,
            target,
            staged,
        } => {
            let (region, peer, target) = (*region, *peer, *target);
            let reached = |net: &Mapper| {
                let (signals, _) = net
                    .region_counters(region, peer)
                    .ok_or_else(|| unregistered(region))?;
                Ok(signals >= target)
            };
            cx.wait_until(op, &[peer], reached, &err)?;
            if let Some(w) = staged {
                w.sink
                    .fill(w.slot, peer, target)
                    .map_err(Error::NotSupported)?;
            }
            Ok(Outcome::Done)
        }
        WindowOp::Deregister { region, keys } => {
            let region = *region;
            let peers: Vec<usize> = (0..cx.size).filter(|&p| p != cx.rank).collect();
            let mut reqs = Vec::new();
            for &p in &peers {
                let key = keys.get(p).ok_or_else(|| {
                    Error::invalid("keys", format!("{} window keys", cx.size), keys.len())
                })?;
                reqs.push(
                    cx.net
                        .post_signal(p, key, SignalKind::Fence, 1)
                        .map_err(&err)?,
                );
            }
            cx.wait_until(
                op,
                &peers,
                |net| {
                    for &p in &peers {
                        if net
                            .region_counters(region, p)
                            .ok_or_else(|| unregistered(region))?
                            .1
                            < 1
                        {
                            return Ok(false);
                        }
                    }
                    Ok(true)
                },
                &err,
            )?;
            let mut left = reqs;
            // The fences' own requests: finished once written.
            while let Some(&r) = left.first() {
                if cx.net.test(r).map_err(&err)? {
                    left.remove(0);
                } else if Instant::now() >= cx.deadline {
                    return Err(cx.timeout_error(op, cx.net.peer_of(r).unwrap_or(0)));
                } else {
                    let until = cx.deadline.min(Instant::now() + Duration::from_millis(20));
                    cx.net.progress(until, false).map_err(&err)?;
                }
            }
            cx.net.deregister_region(region);
            Ok(Outcome::Done)
        }
        WindowOp::Forget { region } => {
            cx.net.deregister_region(*region);
            Ok(Outcome::Done)
        }
    }
}

fn unregistered(region: RegionId) -> Error {
    Error::invalid(
        "window",
        "a registered window",
        format!("region {} (deregistered)", region.0),
    )
}

/// A key must be the target's, of this communicator.
fn check_key(cx: &WinCtx<'_>, key: &RemoteKey, peer: usize) -> Result<()> {
    if key.comm != cx.comm || key.rank as usize != peer {
        return Err(Error::invalid(
            "window key",
            format!("a key of rank {peer} of this communicator"),
            format!("a key of rank {}", key.rank),
        ));
    }
    Ok(())
}
