//! GPU communicators that span hosts whose GPUs are joined by NVLink inside each host: each
//! peer is reached the fast way it can be. Ranks of one host talk over NVLink ([`Nvl`] on a
//! per-host sub-communicator), ranks of different hosts over TCP (a [`Gpe`] on a sub-communicator
//! of the ranks with the same local index on every host).
//!
//! - all_reduce runs in three stages on the comm's stream: all_reduce inside the host over
//!   NVLink; all_reduce across hosts over TCP of one slice per local rank (so the L ranks of a
//!   host carry 1/L of the bytes each, in parallel); then each local rank broadcasts its slice to
//!   the others over NVLink.
//! - all_gather (equal blocks): all_gather over TCP among the ranks of one local index, then
//!   over NVLink inside each host; broadcast: over TCP among the ranks of the root's local index,
//!   then over NVLink from that rank inside each host.
//! - send, recv and the ops of a batch whose peer shares the host go over NVLink; the rest of a
//!   batch goes through the caller's GPE afterwards. Every rank splits a batch the same way (by
//!   host), so the two ends of each transfer always take the same path.
//! - Every other operation: the caller's GPE over the host transports, for every peer.
//!
//! Used when the ranks sit on at least two hosts, every host has the same number of ranks (at
//! least two), and NVLink works on every host; otherwise [`Mixed::start`] says no on every rank.

use std::sync::Arc;
use std::time::Duration;

use crate::algos::select::Hints;
use crate::comm::{host_id, Comm, KeepAlive};
use crate::cuda::{Context, RawStream};
use crate::error::{Error, Result};
use crate::gpe::{Gpe, GpeConfig, GpeRequest};
use crate::nvl::{Nvl, NvlConfig};
use crate::span::Span;
use crate::types::ReduceOp;
use crate::{Op, P2p};

/// The per-host NVLink transport and the cross-host engine of one communicator.
#[derive(Debug)]
pub struct Mixed {
    /// Host index and local rank of every rank of the communicator.
    place: Vec<(usize, usize)>,
    /// The ranks of every host, by local rank.
    members: Vec<Vec<usize>>,
    /// This rank's host index and local rank.
    host: usize,
    local: usize,
    /// Ranks per host.
    local_size: usize,
    /// NVLink among the ranks of this host; dropped before the cross engine (field order).
    nvl: Nvl,
    /// This rank's peers with the same local index on the other hosts, over TCP.
    cross: Gpe,
    local_comm: Arc<Comm>,
    cross_comm: Arc<Comm>,
}

/// Where each rank sits: (host index in order of first appearance, local rank), from every
/// rank's host id.
fn places(hosts: &[u64]) -> (Vec<(usize, usize)>, Vec<Vec<usize>>) {
    let mut order: Vec<u64> = Vec::new();
    let mut members: Vec<Vec<usize>> = Vec::new();
    let mut place = Vec::with_capacity(hosts.len());
    for (r, h) in hosts.iter().enumerate() {
        let i = order.iter().position(|x| x == h).unwrap_or_else(|| {
            order.push(*h);
            members.push(Vec::new());
            order.len() - 1
        });
        place.push((i, members[i].len()));
        members[i].push(r);
    }
    (place, members)
}

/// `peer`'s local rank when it sits on `host`.
fn local_index(place: &[(usize, usize)], host: usize, peer: usize) -> Option<usize> {
    place.get(peer).filter(|p| p.0 == host).map(|p| p.1)
}

/// The last of an operation's `stages` (in stream order), reporting all of them and ordering
/// `caller` after the whole operation.
fn chain(caller: RawStream, mut stages: Vec<GpeRequest>) -> GpeRequest {
    let last = stages.pop().expect("an operation has a stage");
    last.finishing(caller, stages)
}

/// A batch cut by where each peer sits, for a rank on `host`: the ops with a peer on this host
/// (peers renumbered as local ranks) and the rest (peers unchanged), each in batch order.
fn split_batch(ops: &[P2p], place: &[(usize, usize)], host: usize) -> (Vec<P2p>, Vec<P2p>) {
    let (mut local, mut remote) = (Vec::new(), Vec::new());
    for p in ops {
        let (P2p::Send { peer, .. } | P2p::Recv { peer, .. }) = p;
        match (local_index(place, host, *peer), *p) {
            (Some(peer), P2p::Send { buf, .. }) => local.push(P2p::Send { buf, peer }),
            (Some(peer), P2p::Recv { buf, .. }) => local.push(P2p::Recv { buf, peer }),
            (None, p) => remote.push(p),
        }
    }
    (local, remote)
}

/// Element range `[start, end)` of slice `l` of `count` elements cut into `parts` near-equal
/// slices (the first `count % parts` one element longer).
fn slice_range(count: usize, parts: usize, l: usize) -> (usize, usize) {
    let (q, r) = (count / parts, count % parts);
    let start = l * q + l.min(r);
    (start, start + q + usize::from(l < r))
}

impl Mixed {
    /// Sets up the per-host and cross-host sub-communicators of `comm`; every rank must call
    /// it. `Ok(None)` on every rank when the layout does not qualify (see the module doc).
    pub fn start(
        comm: &Arc<Comm>,
        ctx: &Arc<Context>,
        nvl: NvlConfig,
        gpe: GpeConfig,
    ) -> Result<Option<Mixed>> {
        let rank = comm.rank();
        let ids: Vec<u64> = comm
            .all_gather_bytes(&host_id().to_le_bytes(), None)?
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let (place, members) = places(&ids);
        let local_size = members[0].len();
        if members.len() < 2 || local_size < 2 || members.iter().any(|m| m.len() != local_size) {
            tracing::info!(
                rank,
                hosts = members.len(),
                "mixed NVLink+TCP: off (needs 2+ hosts with the same number, 2+, of ranks)"
            );
            return Ok(None);
        }
        let (host, local) = place[rank];
        let name = comm.name();
        let split = |ranks: &[usize], what: String| -> Result<Arc<Comm>> {
            comm.split(ranks, &what, None, false)?
                .map(Arc::new)
                .ok_or_else(|| Error::NotSupported(format!("{what}: this rank was left out")))
        };
        let local_comm = split(&members[host], format!("{name}.host{host}"))?;
        let cross_ranks: Vec<usize> = members.iter().map(|m| m[local]).collect();
        let cross_comm = split(&cross_ranks, format!("{name}.cross{local}"))?;
        let nvl = Nvl::start(&local_comm, ctx, nvl)?;
        // One host without NVLink turns it off everywhere: every rank must take the same path.
        let verdicts = comm.all_gather_bytes(&[u8::from(nvl.is_some())], None)?;
        let Some(nvl) = nvl.filter(|_| !verdicts.contains(&0)) else {
            tracing::info!(
                rank,
                "mixed NVLink+TCP: off (NVLink is missing on some host)"
            );
            return Ok(None);
        };
        let cross = Gpe::start(Arc::clone(&cross_comm), ctx, gpe)?;
        tracing::info!(rank, host, local, local_size, "mixed NVLink+TCP: on");
        Ok(Some(Mixed {
            place,
            members,
            host,
            local,
            local_size,
            nvl,
            cross,
            local_comm,
            cross_comm,
        }))
    }

    /// Issues `op` after `caller` when it has a mixed form, on the stream of `world` (the
    /// GPE of the whole communicator, which carries what goes between hosts outside the
    /// cross-host engine): the request of its last stage, which reports the errors of all.
    /// `Ok(None)`: the caller runs it through `world` alone.
    pub fn issue(
        &self,
        op: &Op,
        caller: RawStream,
        world: &Gpe,
        timeout: Duration,
        hints: Hints<'_>,
        keep: &KeepAlive,
    ) -> Result<Option<GpeRequest>> {
        let stream = world.stream();
        let local_peer = |peer: usize| local_index(&self.place, self.host, peer);
        match op {
            Op::AllReduce { buf, dtype, op } => {
                // The average of the hosts' averages is the average only with exact division.
                if matches!(op, ReduceOp::Avg) && !dtype.is_float() {
                    return Ok(None);
                }
                self.all_reduce(*buf, *dtype, *op, caller, stream, timeout, keep)
                    .map(Some)
            }
            Op::AllGather { input, outputs } => {
                self.all_gather(*input, outputs, caller, stream, timeout, keep)
            }
            Op::Broadcast { buf, root } => self
                .broadcast(*buf, *root, caller, stream, timeout, keep)
                .map(Some),
            Op::Send { buf, peer } => local_peer(*peer)
                .map(|peer| {
                    let op = Op::Send { buf: *buf, peer };
                    self.on_nvl(&op, caller, stream, timeout, keep)
                })
                .transpose(),
            Op::Recv { buf, peer } => local_peer(*peer)
                .map(|peer| {
                    let op = Op::Recv { buf: *buf, peer };
                    self.on_nvl(&op, caller, stream, timeout, keep)
                })
                .transpose(),
            Op::Batch { ops } => {
                let (local, remote) = split_batch(ops, &self.place, self.host);
                if local.is_empty() {
                    return Ok(None);
                }
                if !remote.is_empty() {
                    self.refuse_capture("batch_op_issue", caller)?;
                }
                // The NVLink part first, then the rest on the same stream: every rank runs its
                // host's transfers before its cross-host ones, so neither part waits on the
                // other's.
                let first =
                    self.on_nvl(&Op::Batch { ops: local }, caller, stream, timeout, keep)?;
                if remote.is_empty() {
                    return Ok(Some(first));
                }
                let rest = world.issue(
                    Op::Batch { ops: remote },
                    stream,
                    timeout,
                    hints,
                    keep.clone(),
                )?;
                Ok(Some(chain(caller, vec![first, rest])))
            }
            _ => Ok(None),
        }
    }

    /// Refuses an op with a cross-host (TCP) stage under CUDA graph capture, before any stage is
    /// launched: the GPE cannot be captured, and every rank must refuse alike, not only those
    /// whose part of the op reaches the GPE (the others would capture NVLink stages that wait
    /// for peers who never launched theirs).
    fn refuse_capture(&self, name: &str, caller: RawStream) -> Result<()> {
        let capturing = caller
            .is_capturing()
            .map_err(|e| crate::gpe::cuda_err(name, self.local, e))?;
        if capturing {
            return Err(Error::NotSupported(format!(
                "{name}: capturing ctran GPU operations across hosts (TCP) in a CUDA graph; \
                 issue it outside the capture"
            )));
        }
        Ok(())
    }

    fn on_nvl(
        &self,
        op: &Op,
        caller: RawStream,
        stream: RawStream,
        timeout: Duration,
        keep: &KeepAlive,
    ) -> Result<GpeRequest> {
        self.nvl.issue(
            op,
            caller,
            stream,
            timeout,
            Hints::default(),
            keep.clone(),
            false,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn all_reduce(
        &self,
        buf: Span,
        dtype: crate::DataType,
        op: ReduceOp,
        caller: RawStream,
        stream: RawStream,
        timeout: Duration,
        keep: &KeepAlive,
    ) -> Result<GpeRequest> {
        self.refuse_capture("all_reduce", caller)?;
        let elem = dtype.size_bytes();
        let count = buf.len() / elem;
        let slice = |l: usize| {
            let (a, b) = slice_range(count, self.local_size, l);
            buf.sub(a * elem, (b - a) * elem)
        };
        // 1. Inside the host, over NVLink.
        let whole = Op::AllReduce { buf, dtype, op };
        let mut parts = vec![self.on_nvl(&whole, caller, stream, timeout, keep)?];
        // 2. Across hosts, this rank's slice over TCP (the factor of PREMUL_SUM is applied once,
        // in stage 1).
        let cross_op = match op {
            ReduceOp::PremulSum { .. } => ReduceOp::Sum,
            o => o,
        };
        let mine = slice(self.local);
        let after = if mine.is_empty() {
            stream
        } else {
            let req = self.cross.issue(
                Op::AllReduce {
                    buf: mine,
                    dtype,
                    op: cross_op,
                },
                stream,
                timeout,
                Hints::default(),
                keep.clone(),
            )?;
            parts.push(req);
            self.cross.stream()
        };
        // 3. Each slice from its owner to the rest of the host, over NVLink.
        for l in 0..self.local_size {
            let s = slice(l);
            if s.is_empty() {
                continue;
            }
            let bcast = Op::Broadcast { buf: s, root: l };
            parts.push(self.on_nvl(&bcast, after, stream, timeout, keep)?);
        }
        Ok(chain(caller, parts))
    }

    /// all_gather with equal blocks: across hosts over TCP among the ranks of this local index
    /// (each gets the blocks of its counterparts), then inside every host over NVLink, one
    /// all_gather per host's set of blocks. `Ok(None)` for unequal or empty blocks.
    fn all_gather(
        &self,
        input: Span,
        outputs: &[Span],
        caller: RawStream,
        stream: RawStream,
        timeout: Duration,
        keep: &KeepAlive,
    ) -> Result<Option<GpeRequest>> {
        let len = input.len();
        if len == 0 || outputs.len() != self.place.len() || outputs.iter().any(|o| o.len() != len) {
            return Ok(None);
        }
        self.refuse_capture("all_gather", caller)?;
        let cross = Op::AllGather {
            input,
            outputs: self
                .members
                .iter()
                .map(|m| outputs[m[self.local]])
                .collect(),
        };
        let mut parts =
            vec![self
                .cross
                .issue(cross, caller, timeout, Hints::default(), keep.clone())?];
        for m in &self.members {
            let local = Op::AllGather {
                input: outputs[m[self.local]],
                outputs: m.iter().map(|&q| outputs[q]).collect(),
            };
            parts.push(self.on_nvl(&local, self.cross.stream(), stream, timeout, keep)?);
        }
        Ok(Some(chain(caller, parts)))
    }

    /// broadcast: across hosts over TCP among the ranks of the root's local index, then inside
    /// every host over NVLink from that local rank.
    fn broadcast(
        &self,
        buf: Span,
        root: usize,
        caller: RawStream,
        stream: RawStream,
        timeout: Duration,
        keep: &KeepAlive,
    ) -> Result<GpeRequest> {
        self.refuse_capture("broadcast", caller)?;
        let (root_host, root_local) = self.place[root];
        let mut parts = Vec::new();
        let mut after = caller;
        if self.local == root_local {
            // In the cross-host comm of this local index, host h is rank h.
            let op = Op::Broadcast {
                buf,
                root: root_host,
            };
            parts.push(
                self.cross
                    .issue(op, caller, timeout, Hints::default(), keep.clone())?,
            );
            after = self.cross.stream();
        }
        let local = Op::Broadcast {
            buf,
            root: root_local,
        };
        parts.push(self.on_nvl(&local, after, stream, timeout, keep)?);
        Ok(chain(caller, parts))
    }

    /// Makes every waiting kernel and transfer of the sub-communicators give up.
    pub fn abort(&self, reason: &str) {
        self.nvl.abort();
        self.local_comm.abort(reason);
        self.cross_comm.abort(reason);
    }

    /// Stops the cross-host engine and closes the sub-communicators.
    pub fn finalize(&self) -> Result<()> {
        self.cross.stop();
        self.cross_comm.finalize()?;
        self.local_comm.finalize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_follow_first_appearance_of_each_host() {
        let (place, members) = places(&[7, 9, 7, 9]);
        assert_eq!(place, vec![(0, 0), (1, 0), (0, 1), (1, 1)]);
        assert_eq!(members, vec![vec![0, 2], vec![1, 3]]);
    }

    #[test]
    fn batches_split_by_host_with_local_peers_renumbered() {
        // Ranks 0 and 2 on host 0, 1 and 3 on host 1; rank 0's batch.
        let (place, _) = places(&[7, 9, 7, 9]);
        let ops = vec![
            P2p::Send {
                buf: Span::EMPTY,
                peer: 1,
            },
            P2p::Recv {
                buf: Span::EMPTY,
                peer: 2,
            },
            P2p::Send {
                buf: Span::EMPTY,
                peer: 3,
            },
            P2p::Send {
                buf: Span::EMPTY,
                peer: 2,
            },
        ];
        let (local, remote) = split_batch(&ops, &place, 0);
        let peers = |v: &[P2p]| -> Vec<(bool, usize)> {
            v.iter()
                .map(|p| match p {
                    P2p::Send { peer, .. } => (true, *peer),
                    P2p::Recv { peer, .. } => (false, *peer),
                })
                .collect()
        };
        assert_eq!(
            peers(&local),
            vec![(false, 1), (true, 1)],
            "rank 2 is local rank 1"
        );
        assert_eq!(peers(&remote), vec![(true, 1), (true, 3)]);
    }

    #[test]
    fn slices_cover_the_buffer_without_overlap() {
        for count in [0, 1, 5, 8, 1001] {
            for parts in [2, 3, 4] {
                let mut next = 0;
                for l in 0..parts {
                    let (a, b) = slice_range(count, parts, l);
                    assert_eq!(a, next);
                    assert!(b - a <= count / parts + 1);
                    next = b;
                }
                assert_eq!(next, count);
            }
        }
    }
}
