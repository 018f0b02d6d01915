//! What an algorithm sees while it runs: who it is, its deadline, a transport, staging memory,
//! and helpers that turn transport failures into errors naming the op, its sequence number and
//! the peer.

use std::time::{Duration, Instant};

use crate::algos::staging::Staging;
use crate::error::{Error, Result};
use crate::kernels::Reducer;
use crate::span::Span;
use crate::transport::{OpTag, ReqId, Transport, TransportError};

/// The running context of one operation.
#[derive(Debug)]
pub struct OpCtx<'a> {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// Operation name (for errors).
    pub op: &'static str,
    /// Sequence number (for errors).
    pub seq: u64,
    /// When the operation must have finished.
    pub deadline: Instant,
    /// The timeout the deadline came from (for errors).
    pub timeout: Duration,
    /// What peers must be running too: every message of this operation carries it, and a
    /// message of another operation fails it.
    pub tag: OpTag,
    net: &'a mut dyn Transport,
    /// Scratch memory.
    pub staging: &'a mut Staging,
}

impl<'a> OpCtx<'a> {
    /// A context for one operation.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rank: usize,
        size: usize,
        op: &'static str,
        seq: u64,
        timeout: Duration,
        net: &'a mut dyn Transport,
        staging: &'a mut Staging,
    ) -> OpCtx<'a> {
        let deadline = Instant::now() + timeout;
        OpCtx {
            rank,
            size,
            op,
            seq,
            deadline,
            timeout,
            tag: OpTag::internal(),
            net,
            staging,
        }
    }

    /// The same context for the operation `tag` names (the communicator's own work otherwise).
    pub fn with_tag(mut self, tag: OpTag) -> OpCtx<'a> {
        self.tag = tag;
        self
    }

    /// Turns a transport failure into an engine error with this operation's context.
    pub fn error(&self, e: TransportError) -> Error {
        transport_error(self.op, self.seq, self.rank, e)
    }

    /// Posts a send.
    pub fn send(&mut self, peer: usize, data: Span) -> Result<ReqId> {
        self.net
            .post_send(peer, data, self.tag, self.tag.delivery())
            .map_err(|e| self.error(e))
    }

    /// Posts a receive of exactly `data.len()` bytes.
    pub fn recv(&mut self, peer: usize, data: Span) -> Result<ReqId> {
        self.net
            .post_recv(peer, data, self.tag)
            .map_err(|e| self.error(e))
    }

    /// Waits for one request, moving every other posted request forward meanwhile.
    pub fn wait(&mut self, req: ReqId) -> Result<()> {
        self.progress_until(|net| net.test(req), |net| net.peer_of(req))
    }

    /// Moves every posted request forward until `done` says so, failing at the deadline
    /// (naming the peer `waited_on` gives).
    fn progress_until(
        &mut self,
        mut done: impl FnMut(&mut dyn Transport) -> std::result::Result<bool, TransportError>,
        waited_on: impl Fn(&dyn Transport) -> Option<usize>,
    ) -> Result<()> {
        loop {
            match done(&mut *self.net) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(self.error(e)),
            }
            if Instant::now() >= self.deadline {
                return Err(Error::Timeout {
                    op: self.op.into(),
                    seq: self.seq,
                    rank: self.rank,
                    peer: waited_on(&*self.net),
                    timeout: self.timeout,
                });
            }
            self.net
                .progress(self.deadline, false)
                .map_err(|e| self.error(e))?;
        }
    }

    /// Whether `req` has finished, after one pass that moves every posted request forward
    /// without blocking. `Ok(true)` is reported once; the request is forgotten then.
    pub fn test(&mut self, req: ReqId) -> Result<bool> {
        self.net
            .progress(Instant::now(), false)
            .map_err(|e| self.error(e))?;
        self.net.test(req).map_err(|e| self.error(e))
    }

    /// Waits until every receiver accepted this rank's confirmed sends (see
    /// [`OpTag::needs_confirmation`]), so a rank whose part was only sending fails with a
    /// receiver that refused its message instead of succeeding alone.
    pub fn wait_confirmed(&mut self) -> Result<()> {
        self.progress_until(|net| net.unconfirmed().map(|waiting| !waiting), |_| None)
    }

    /// Waits for every request in `reqs` and empties it.
    pub fn wait_all(&mut self, reqs: &mut Vec<ReqId>) -> Result<()> {
        for req in reqs.drain(..) {
            self.wait(req)?;
        }
        Ok(())
    }

    /// Sends `send` to `to` and receives `recv` from `from` concurrently.
    pub fn sendrecv(&mut self, to: usize, send: Span, from: usize, recv: Span) -> Result<()> {
        let r = self.recv(from, recv)?;
        let s = self.send(to, send)?;
        self.wait(r)?;
        self.wait(s)
    }
}

/// Splits `count` elements into `parts` contiguous ranges of near-equal size; returns
/// `(offset, len)` in bytes for elements of `elem_bytes`.
pub fn partition(count: usize, parts: usize, elem_bytes: usize) -> Vec<(usize, usize)> {
    let base = count / parts;
    let extra = count % parts;
    let mut off = 0;
    (0..parts)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let r = (off * elem_bytes, len * elem_bytes);
            off += len;
            r
        })
        .collect()
}

/// `(offset, len)` pieces of at most `chunk` bytes covering `len` bytes (none for 0 bytes).
pub fn chunks(len: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len)
        .step_by(chunk.max(1))
        .map(move |o| (o, chunk.min(len - o)))
}

/// `dst ⊕= src` where `src` is a partial result (staging) and `dst` is separate memory.
pub fn combine(red: &Reducer, dst: Span, src: Span) {
    debug_assert!(!dst.overlaps(&src));
    // SAFETY: `dst` and `src` are disjoint (one is staging owned by the progress thread) and the
    // engine is the only user of both while the operation runs.
    unsafe { dst.with_mut_slice(|d| src.with_slice(|s| red.combine(d, s))) }
}

/// `dst ⊕= prescale(src)` where `src` is a rank's raw input.
pub fn combine_input(red: &Reducer, dst: Span, src: Span) {
    debug_assert!(!dst.overlaps(&src));
    // SAFETY: as in `combine`.
    unsafe { dst.with_mut_slice(|d| src.with_slice(|s| red.combine_input(d, s))) }
}

/// `dst = srcs[0] ⊕ srcs[1] ⊕ …` for partials, in that order, in one pass per few sources.
pub fn fold(red: &Reducer, dst: Span, srcs: &[Span]) {
    debug_assert!(srcs.iter().all(|s| !dst.overlaps(s)));
    // SAFETY: `dst` overlaps no source (staging or buffers the operation reads but no longer
    // writes), and the engine is the only user of all of them while the operation runs.
    unsafe { dst.with_mut_slice(|d| Span::with_slices(srcs, |s| red.fold(d, s))) }
}

/// `dst ⊕= srcs[0] ⊕ srcs[1] ⊕ …` for partials, in that order, in one pass per few sources.
pub fn fold_onto(red: &Reducer, dst: Span, srcs: &[Span]) {
    debug_assert!(srcs.iter().all(|s| !dst.overlaps(s)));
    // SAFETY: as in `fold`.
    unsafe { dst.with_mut_slice(|d| Span::with_slices(srcs, |s| red.fold_onto(d, s))) }
}

/// `dst = prescale(src)`.
pub fn load_input(red: &Reducer, dst: Span, src: Span) {
    debug_assert!(!dst.overlaps(&src));
    // SAFETY: as in `combine`.
    unsafe { dst.with_mut_slice(|d| src.with_slice(|s| red.load_input(d, s))) }
}

/// Applies the per-input scaling in place.
pub fn prescale(red: &Reducer, buf: Span) {
    if red.needs_prescale() {
        // SAFETY: the engine is the only user of `buf` while the operation runs.
        unsafe { buf.with_mut_slice(|b| red.prescale_in_place(b)) }
    }
}

/// Applies the final post-processing (integer average) in place.
pub fn finish(red: &Reducer, buf: Span) {
    if red.needs_finish() {
        // SAFETY: the engine is the only user of `buf` while the operation runs.
        unsafe { buf.with_mut_slice(|b| red.finish(b)) }
    }
}

/// `dst = finish(prescale(src))`: one rank's input as the final result (a single-rank
/// reduction); `dst` may be `src` itself.
pub fn load_result(red: &Reducer, dst: Span, src: Span) {
    if dst.addr() == src.addr() && dst.len() == src.len() {
        prescale(red, dst);
    } else {
        load_input(red, dst, src);
    }
    finish(red, dst);
}

/// Turns a transport failure into an engine error with this operation's context.
pub(crate) fn transport_error(op: &str, seq: u64, rank: usize, e: TransportError) -> Error {
    let mismatch = |peer: usize, detail: String| Error::Mismatch {
        op: op.into(),
        seq,
        rank,
        peer,
        detail,
    };
    match e {
        TransportError::PeerLost { peer, reason } => Error::PeerLost {
            op: op.into(),
            seq,
            rank,
            peer,
            reason,
        },
        TransportError::SizeMismatch {
            peer,
            expected,
            got,
        } => mismatch(
            peer,
            format!("this rank expected {expected} bytes, the peer sent {got}"),
        ),
        TransportError::PostedMismatch {
            peer,
            sending,
            posted,
        } => mismatch(
            peer,
            format!("this rank sends {sending} bytes, the peer posted a receive of {posted}"),
        ),
        TransportError::Disagree {
            peer,
            expected,
            got,
        } => mismatch(
            peer,
            format!(
                "ranks disagree about the operation: this rank runs {expected}, peer {peer} \
                 runs {got}"
            ),
        ),
        TransportError::Unsupported(what) => {
            Error::NotSupported(format!("{} on rank {}: {what}", op, rank))
        }
        TransportError::Aborted => Error::Aborted {
            comm: String::new(),
            reason: format!("{} (seq {}) interrupted on rank {}", op, seq, rank),
        },
    }
}
