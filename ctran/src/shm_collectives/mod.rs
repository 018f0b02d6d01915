//! Collectives that read peers' shared-memory buffers directly, for communicators whose ranks
//! all share one host. Each rank owns two collective buffers; successive rounds alternate
//! between them, so a rank can fill round `k+1` while slower peers still read round `k`, and one
//! arrival barrier per round (two for all_reduce) is all the synchronisation needed.
//!
//! all_reduce: every rank copies its chunk in (prescaled), then reduces one slice of the chunk
//! straight from every peer's buffer in rank order, then copies every reduced slice out. Each
//! slice is reduced by exactly one rank, so all ranks end with bitwise the same result.
//!
//! Large messages skip the shared buffers when every local rank can read the others' memory
//! (cross-memory attach, probed at init; see [`crate::transport::shm::cma`]): ranks publish their buffers'
//! addresses with the first barrier and copy straight from each other's buffers, one copy
//! instead of two. all_reduce then reduces its own slice in place, reading the peers' pieces of
//! it through a small cache-resident buffer, and reads every other reduced slice from its owner;
//! a closing barrier keeps every buffer valid until all peers finished reading it.
//!
//! Every rank publishes what it is about to do (sequence number, collective, its size, a hash of
//! the rest) with the first barrier, and checks everyone's against its own, so ranks that
//! disagree fail with a [`ShmFail::Mismatch`] naming the peer and the sizes rather than reading
//! past a buffer or waiting for rounds that never come.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::algos::ctx::{chunks, combine, combine_input, finish, load_input, partition, prescale};
use crate::comm::stable_hash::StableHasher;
use crate::comm::Op;
use crate::error::{Error, Result};
use crate::kernels::Reducer;
use crate::span::Span;
use crate::transport::shm::node::{Node, WaitEnd};
use crate::transport::shm::{cma, ShmTransport};
use crate::transport::TransportError;

/// Whether `op` has a shared-memory form; all_to_all has one only through cross-memory attach
/// (`cma`), the other collectives always.
pub fn runs(op: &Op, cma: bool) -> bool {
    match op {
        Op::AllReduce { .. }
        | Op::Reduce { .. }
        | Op::ReduceScatter { .. }
        | Op::AllGather { .. }
        | Op::Broadcast { .. } => true,
        Op::AllToAll { .. } => cma,
        _ => false,
    }
}

/// Runs `op` (one [`runs`] accepts) over shared memory among `nranks` ranks. The outer error:
/// its arguments were refused before anything moved.
pub fn run(cx: &mut ShmCtx<'_>, op: &Op, nranks: usize) -> Result<Result<(), ShmFail>> {
    let reducer = |dtype, op| Reducer::new(dtype, op, nranks);
    Ok(match op {
        Op::AllReduce { buf, dtype, op } => all_reduce(cx, *buf, &reducer(*dtype, *op)?),
        Op::Reduce {
            buf,
            dtype,
            op,
            root,
        } => reduce(cx, *buf, &reducer(*dtype, *op)?, *root),
        Op::ReduceScatter {
            inputs,
            output,
            dtype,
            op,
        } => reduce_scatter(cx, inputs, *output, &reducer(*dtype, *op)?),
        Op::AllGather { input, outputs } => all_gather(cx, *input, outputs),
        Op::Broadcast { buf, root } => broadcast(cx, *buf, *root),
        Op::AllToAll { inputs, outputs } => all_to_all(cx, inputs, outputs),
        other => {
            return Err(Error::NotSupported(format!(
                "{} as a shared-memory collective",
                other.name()
            )))
        }
    })
}

/// Why a shared-memory collective stopped.
#[derive(Debug)]
pub enum ShmFail {
    /// The deadline passed while waiting for `waiting_for`.
    Deadline {
        /// The first rank that had not arrived.
        waiting_for: Option<usize>,
    },
    /// A peer failed.
    Peer(TransportError),
    /// Ranks disagree about the operation (sizes, element type, reduce op, root, or which
    /// operation it is).
    Mismatch {
        /// The (global) rank whose description differs from this rank's.
        peer: usize,
        /// What differs.
        detail: String,
    },
}

/// Which collective a published descriptor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
enum Kind {
    AllReduce = 1,
    Reduce = 2,
    ReduceScatter = 3,
    AllGather = 4,
    Broadcast = 5,
    AllToAll = 6,
}

impl Kind {
    fn name(code: u64) -> &'static str {
        match code {
            1 => "all_reduce",
            2 => "reduce",
            3 => "reduce_scatter",
            4 => "all_gather",
            5 => "broadcast",
            6 => "all_to_all",
            _ => "nothing",
        }
    }
}

/// Element type and reduce op, which every rank of a reduction must agree on.
fn red_args(red: &Reducer) -> StableHasher {
    StableHasher::new().str(&format!("{:?}/{:?}", red.dtype(), red.op()))
}

/// What this rank is about to do, as it publishes it.
#[derive(Debug, Clone, Copy)]
struct Desc {
    kind: Kind,
    bytes: usize,
    args: u64,
}

/// What a shared-memory collective needs besides its buffers.
pub struct ShmCtx<'a> {
    /// The transport (segment, counters).
    pub shm: &'a mut ShmTransport,
    /// When to give up.
    pub deadline: Instant,
    /// The operation's sequence number (ranks check that they agree on it).
    pub seq: u64,
    /// Reports dead peers while waiting.
    pub alive: &'a mut dyn FnMut() -> Result<(), TransportError>,
    /// Told when this rank starts to wait for its peers ([`Waiting::Begins`], at the first
    /// poll that finds them not ready) and when a wait lasts ([`Waiting::Lasts`], after
    /// [`LONG_WAIT`]), in every wait. The progress thread does its trace's writing there,
    /// where it only waits anyway: the oldest of the earlier operations' unwritten records at
    /// the first, all of them and this operation's start at the second (a hang always waits
    /// that long, so a live dump shows it started; an operation whose peers are on time never
    /// does, and its record is written whole after it completed).
    pub waiting: &'a mut dyn FnMut(Waiting),
}

/// How far a wait of a shared-memory collective has gone (see [`ShmCtx::waiting`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// The first poll found the peers not ready.
    Begins,
    /// The peers were not ready for [`LONG_WAIT`].
    Lasts,
}

/// How long a wait goes on before it counts as [`Waiting::Lasts`]: several times the whole
/// of a small operation whose peers are on time (3 to 8 us with 2 to 8 ranks on one host).
pub const LONG_WAIT: Duration = Duration::from_micros(50);

/// Polls of a wait before it reads the clock to see whether it lasts: a poll costs tens of
/// nanoseconds, a clock read as much.
const POLLS_BEFORE_CLOCK: u32 = 16;

/// [`Node::wait_for`](Node::wait_for) that tells `waiting` how far it has gone.
fn wait_telling(
    node: &Node,
    waiting: &mut dyn FnMut(Waiting),
    mut done: impl FnMut(&Node) -> bool,
    deadline: Instant,
    alive: &mut dyn FnMut() -> Result<(), TransportError>,
) -> Result<(), WaitEnd> {
    let mut misses = 0u32;
    // When the wait counts as lasting (the clock is read from the 16th poll on).
    let mut lasts_at: Option<Instant> = None;
    let mut told_lasts = false;
    let telling = |n: &Node| {
        if done(n) {
            return true;
        }
        misses += 1;
        if misses == 1 {
            waiting(Waiting::Begins);
        } else if !told_lasts && misses >= POLLS_BEFORE_CLOCK {
            let at = *lasts_at.get_or_insert_with(|| Instant::now() + LONG_WAIT);
            if Instant::now() >= at {
                told_lasts = true;
                waiting(Waiting::Lasts);
            }
        }
        false
    };
    node.wait_for(telling, deadline, alive)
}

impl std::fmt::Debug for ShmCtx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmCtx")
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl ShmCtx<'_> {
    fn n(&self) -> usize {
        self.shm.node.nlocal()
    }

    fn me(&self) -> usize {
        self.shm.node.me
    }

    /// The buffer of rank `i` for the current round.
    fn buf(&self, i: usize) -> Span {
        self.shm.node.coll(i, (self.shm.coll_rounds % 2) as usize)
    }

    fn capacity(&self) -> usize {
        self.shm.node.layout().sizes.coll_bytes
    }

    fn next_round(&mut self) {
        self.shm.coll_rounds += 1;
    }

    /// Global rank of local rank `l`.
    fn global(&self, l: usize) -> usize {
        self.shm.global_of[l]
    }

    /// Whether a message of `bytes` goes by cross-memory attach. Callers pass a size every rank
    /// agrees on (checked with the first barrier), so all take the same path.
    fn use_cma(&self, bytes: usize) -> bool {
        self.shm.cma && bytes >= self.shm.cma_min_bytes.max(1)
    }

    /// Publishes `d` and `blocks` (buffers peers may read directly) with the next barrier.
    fn publish(&mut self, d: Desc, blocks: &[Span]) {
        let b = ((self.shm.arrivals + 1) % 2) as usize;
        self.shm.published = b;
        let node = &self.shm.node;
        let desc = node.desc(node.me, b);
        desc.seq.store(self.seq, Ordering::Relaxed);
        desc.kind.store(d.kind as u64, Ordering::Relaxed);
        desc.bytes.store(d.bytes as u64, Ordering::Relaxed);
        desc.args.store(d.args, Ordering::Relaxed);
        for (j, s) in blocks.iter().enumerate() {
            let blk = node.block(node.me, b, j);
            blk.addr.store(s.addr() as u64, Ordering::Relaxed);
            blk.len.store(s.len() as u64, Ordering::Relaxed);
        }
    }

    /// After the barrier that went with [`ShmCtx::publish`]: checks that every rank published
    /// the same operation, sequence number and arguments as this one, and that rank `j`'s size
    /// is `expect(j)`.
    fn check(&self, d: Desc, expect: impl Fn(usize) -> usize) -> Result<(), ShmFail> {
        let node = &self.shm.node;
        let b = self.shm.published;
        for j in (0..self.n()).filter(|&j| j != self.me()) {
            let p = node.desc(j, b);
            let (seq, kind) = (
                p.seq.load(Ordering::Relaxed),
                p.kind.load(Ordering::Relaxed),
            );
            let bytes = p.bytes.load(Ordering::Relaxed) as usize;
            let what = Kind::name(d.kind as u64);
            let detail = if seq != self.seq || kind != d.kind as u64 {
                format!(
                    "this rank runs {what} (seq {}) while the peer runs {} (seq {seq}) \
                     over shared memory",
                    self.seq,
                    Kind::name(kind)
                )
            } else if bytes != expect(j) {
                format!(
                    "{what} sizes disagree: this rank expects {} bytes from the peer, \
                     the peer has {bytes}",
                    expect(j)
                )
            } else if p.args.load(Ordering::Relaxed) != d.args {
                format!("{what} arguments disagree (element type, reduce op, root or block sizes)")
            } else {
                continue;
            };
            return Err(ShmFail::Mismatch {
                peer: self.global(j),
                detail,
            });
        }
        Ok(())
    }

    /// Block `k` that local rank `j` published for this operation: (address, length).
    fn peer_block(&self, j: usize, k: usize) -> (usize, usize) {
        let b = self.shm.published;
        let blk = self.shm.node.block(j, b, k);
        (
            blk.addr.load(Ordering::Relaxed) as usize,
            blk.len.load(Ordering::Relaxed) as usize,
        )
    }

    /// Copies `local.len()` bytes from `offset` into block `k` of local rank `j` (published
    /// with the last barrier and checked to be long enough).
    fn read(&mut self, j: usize, k: usize, offset: usize, local: Span) -> Result<(), ShmFail> {
        let (addr, len) = self.peer_block(j, k);
        if offset + local.len() > len {
            return Err(ShmFail::Mismatch {
                peer: self.global(j),
                detail: format!(
                    "the peer's buffer has {len} bytes, this rank needs {} from offset {offset}",
                    local.len()
                ),
            });
        }
        let pid = self.shm.node.control(j).pid.load(Ordering::Relaxed);
        cma::read(pid, addr + offset, local)
            .map(|()| cma::count(local.len()))
            .map_err(|e| {
                // A peer that died is the likely cause; its closed connection says so for sure.
                let cause = (self.alive)().err();
                ShmFail::Peer(cause.unwrap_or_else(|| TransportError::PeerLost {
                    peer: self.global(j),
                    reason: format!("cross-memory read of its buffer failed: {e}"),
                }))
            })
    }

    /// Announces this rank's arrival and waits for everyone's.
    fn barrier(&mut self) -> Result<(), ShmFail> {
        self.shm.arrivals += 1;
        let target = self.shm.arrivals;
        let node = &self.shm.node;
        node.control(node.me)
            .arrived
            .store(target, Ordering::Release);
        node.ring_others();
        let all_in = |n: &Node| {
            (0..n.nlocal()).all(|i| n.control(i).arrived.load(Ordering::Acquire) >= target)
        };
        match wait_telling(node, self.waiting, all_in, self.deadline, self.alive) {
            Ok(()) => Ok(()),
            Err(WaitEnd::Failed(e)) => Err(ShmFail::Peer(e)),
            Err(WaitEnd::Deadline) => {
                let late = (0..node.nlocal())
                    .find(|&i| node.control(i).arrived.load(Ordering::Acquire) < target);
                Err(ShmFail::Deadline {
                    waiting_for: late.map(|l| self.shm.global_of[l]),
                })
            }
        }
    }
}

/// The cache-resident buffer peers' data is read into before it is combined.
fn scratch(cx: &mut ShmCtx<'_>) -> Span {
    // SAFETY: the buffer belongs to the transport, which the progress thread owns and lends to
    // this collective alone; it is neither resized nor otherwise touched while the span is used.
    unsafe { Span::from_slice(&mut cx.shm.cma_buf) }
}

/// `dst ⊕= prescale(peer j's block k from offset)`, through the scratch buffer in pieces.
fn combine_from_peer(
    cx: &mut ShmCtx<'_>,
    red: &Reducer,
    dst: Span,
    j: usize,
    k: usize,
    offset: usize,
) -> Result<(), ShmFail> {
    let es = red.dtype().size_bytes();
    let tmp = scratch(cx);
    let piece = (tmp.len() / es).max(1) * es;
    for (o, l) in chunks(dst.len(), piece) {
        let t = tmp.sub(0, l);
        cx.read(j, k, offset + o, t)?;
        combine_input(red, dst.sub(o, l), t);
    }
    Ok(())
}

/// `dst = prescale(own) ⊕ prescale(block k of every peer, from offset)`, combined in pieces that
/// stay in cache across peers, peers in rank order. `dst` may be `own` itself.
fn reduce_from_peers(
    cx: &mut ShmCtx<'_>,
    red: &Reducer,
    dst: Span,
    own: Span,
    k: usize,
    offset: usize,
) -> Result<(), ShmFail> {
    let (n, me) = (cx.n(), cx.me());
    let es = red.dtype().size_bytes();
    let piece = (cx.shm.cma_buf.len() / es).max(1) * es;
    for (o, l) in chunks(dst.len(), piece) {
        let d = dst.sub(o, l);
        let src = own.sub(o, l);
        if d == src {
            prescale(red, d);
        } else {
            load_input(red, d, src);
        }
        for j in (0..n).filter(|&j| j != me) {
            combine_from_peer(cx, red, d, j, k, offset + o)?;
        }
        finish(red, d);
    }
    Ok(())
}

/// In-place all_reduce of `buf`.
pub fn all_reduce(cx: &mut ShmCtx<'_>, buf: Span, red: &Reducer) -> Result<(), ShmFail> {
    let d = Desc {
        kind: Kind::AllReduce,
        bytes: buf.len(),
        args: red_args(red).finish(),
    };
    // Its cross-memory path reads every byte twice (inputs, then results), so it pays off
    // later than the single-read collectives'.
    if cx.use_cma(buf.len() / 2) {
        all_reduce_cma(cx, buf, red, d)
    } else {
        all_reduce_slots(cx, buf, red, d)
    }
}

/// Bits of [`crate::transport::shm::layout::Control::progress`] that count bytes.
const PROGRESS_BITS: u32 = 40;

/// all_reduce by cross-memory attach: each rank reduces its slice in place, piece by piece,
/// reading the peers' copies of each piece, and announces how far it got; in between it copies
/// the pieces peers have finished into its own buffer. A finished piece of peer `j` is safe to
/// overwrite here because `j` read this rank's copy of it before reducing it, and it is likely
/// still in the shared cache when it is read. Pieces are reduced own-first, then peers in rank
/// order, each by exactly one rank, so every rank ends with bitwise the same result.
fn all_reduce_cma(cx: &mut ShmCtx<'_>, buf: Span, red: &Reducer, d: Desc) -> Result<(), ShmFail> {
    let (n, me) = (cx.n(), cx.me());
    let es = red.dtype().size_bytes();
    cx.publish(d, &[buf]);
    // The tag is the number of the barrier below; announcing "nothing reduced yet" under it
    // before the barrier means no peer can mistake an old value for this operation's, even
    // when the counter's top bits wrapped around since.
    let tag = ((cx.shm.arrivals + 1) & ((1 << (64 - PROGRESS_BITS)) - 1)) << PROGRESS_BITS;
    cx.shm
        .node
        .control(me)
        .progress
        .store(tag, Ordering::Release);
    cx.barrier()?;
    cx.check(d, |_| buf.len())?;
    let slices = partition(buf.len() / es, n, es);
    let (so, sl) = slices[me];
    let mine = buf.sub(so, sl);
    let piece = (cx.shm.cma_buf.len() / es).max(1) * es;
    // Bytes of each peer's slice already copied here.
    let mut copied = vec![0usize; n];
    copied[me] = sl;
    let progress = |cx: &ShmCtx<'_>, j: usize| -> usize {
        let v = cx.shm.node.control(j).progress.load(Ordering::Acquire);
        if v & !((1 << PROGRESS_BITS) - 1) == tag {
            (v & ((1 << PROGRESS_BITS) - 1)) as usize
        } else {
            0
        }
    };
    // Copies whatever peers finished; returns whether everything is here.
    let drain = |cx: &mut ShmCtx<'_>, copied: &mut [usize]| -> Result<bool, ShmFail> {
        let mut all = true;
        for j in (0..n).filter(|&j| j != me) {
            let (po, pl) = slices[j];
            let upto = progress(cx, j).min(pl);
            if upto > copied[j] {
                let from = copied[j];
                cx.read(j, 0, po + from, buf.sub(po + from, upto - from))?;
                copied[j] = upto;
            }
            all &= copied[j] == pl;
        }
        Ok(all)
    };
    for (o, l) in chunks(sl, piece) {
        let dst = mine.sub(o, l);
        prescale(red, dst);
        for j in (0..n).filter(|&j| j != me) {
            combine_from_peer(cx, red, dst, j, 0, so + o)?;
        }
        finish(red, dst);
        let node = &cx.shm.node;
        node.control(me)
            .progress
            .store(tag | (o + l) as u64, Ordering::Release);
        node.ring_others();
        drain(cx, &mut copied)?;
    }
    while !drain(cx, &mut copied)? {
        let want: Vec<usize> = slices.iter().map(|&(_, l)| l).collect();
        let ready = |nd: &Node| {
            (0..n).filter(|&j| copied[j] < want[j]).any(|j| {
                let v = nd.control(j).progress.load(Ordering::Acquire);
                v & !((1 << PROGRESS_BITS) - 1) == tag
                    && ((v & ((1 << PROGRESS_BITS) - 1)) as usize) > copied[j]
            })
        };
        let node = &cx.shm.node;
        match wait_telling(node, cx.waiting, ready, cx.deadline, cx.alive) {
            Ok(()) => {}
            Err(WaitEnd::Failed(e)) => return Err(ShmFail::Peer(e)),
            Err(WaitEnd::Deadline) => {
                let late = (0..n).find(|&j| j != me && copied[j] < slices[j].1);
                return Err(ShmFail::Deadline {
                    waiting_for: late.map(|l| cx.global(l)),
                });
            }
        }
    }
    // Keep this rank's slice unchanged until every peer has it.
    cx.barrier()
}

/// all_reduce through the shared buffers. Per round: copy in only the slices peers reduce,
/// reduce this rank's slice from its own buffer and the peers' shared copies, then copy every
/// reduced slice out.
fn all_reduce_slots(cx: &mut ShmCtx<'_>, buf: Span, red: &Reducer, d: Desc) -> Result<(), ShmFail> {
    let (n, me) = (cx.n(), cx.me());
    let es = red.dtype().size_bytes();
    let chunk = (cx.capacity() / es) * es;
    for (off, len) in chunks(buf.len(), chunk) {
        let slices = partition(len / es, n, es);
        for &(so, sl) in slices
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != me)
            .map(|(_, s)| s)
        {
            load_input(red, cx.buf(me).sub(so, sl), buf.sub(off + so, sl));
        }
        if off == 0 {
            cx.publish(d, &[]);
        }
        cx.barrier()?;
        if off == 0 {
            cx.check(d, |_| buf.len())?;
        }
        let (so, sl) = slices[me];
        let acc = cx.buf(me).sub(so, sl);
        let own = buf.sub(off + so, sl);
        // (The fused three-operand kernel measured slower here than load + combine.)
        load_input(red, acc, own);
        for j in (0..n).filter(|&j| j != me) {
            combine(red, acc, cx.buf(j).sub(so, sl));
        }
        finish(red, acc);
        cx.barrier()?;
        for (j, &(so, sl)) in slices.iter().enumerate() {
            buf.sub(off + so, sl).copy_from(&cx.buf(j).sub(so, sl));
        }
        cx.next_round();
    }
    Ok(())
}

/// all_gather (blocks may differ in size): `outputs[j]` receives rank `j`'s input.
pub fn all_gather(cx: &mut ShmCtx<'_>, input: Span, outputs: &[Span]) -> Result<(), ShmFail> {
    let me = cx.me();
    let lens: Vec<usize> = outputs.iter().map(Span::len).collect();
    let d = Desc {
        kind: Kind::AllGather,
        bytes: input.len(),
        args: StableHasher::new().usizes(&lens).finish(),
    };
    let expect = |j: usize| lens[j];
    if cx.use_cma(lens.iter().sum()) {
        cx.publish(d, &[input]);
        cx.barrier()?;
        cx.check(d, expect)?;
        outputs[me].copy_from(&input);
        for (j, out) in outputs.iter().enumerate().filter(|&(j, _)| j != me) {
            cx.read(j, 0, 0, *out)?;
        }
        return cx.barrier();
    }
    let longest = lens.iter().copied().max().unwrap_or(0);
    let cap = cx.capacity();
    for off in (0..longest).step_by(cap) {
        let piece = |s: &Span| s.sub(off.min(s.len()), s.len().saturating_sub(off).min(cap));
        let mine = piece(&input);
        cx.buf(me).copy_from(&mine);
        if off == 0 {
            cx.publish(d, &[]);
        }
        cx.barrier()?;
        if off == 0 {
            cx.check(d, expect)?;
        }
        for (j, out) in outputs.iter().enumerate() {
            let dst = piece(out);
            dst.copy_from(&cx.buf(j).sub(0, dst.len()));
        }
        cx.next_round();
    }
    Ok(())
}

/// broadcast of `root`'s `buf` (`root` is a local index).
pub fn broadcast(cx: &mut ShmCtx<'_>, buf: Span, root: usize) -> Result<(), ShmFail> {
    let me = cx.me();
    let d = Desc {
        kind: Kind::Broadcast,
        bytes: buf.len(),
        args: StableHasher::new().u64(root as u64).finish(),
    };
    if cx.use_cma(buf.len()) {
        cx.publish(d, &[buf]);
        cx.barrier()?;
        cx.check(d, |_| buf.len())?;
        if me != root {
            cx.read(root, 0, 0, buf)?;
        }
        return cx.barrier();
    }
    for (off, len) in chunks(buf.len(), cx.capacity()) {
        if me == root {
            cx.buf(me).copy_from(&buf.sub(off, len));
        }
        if off == 0 {
            cx.publish(d, &[]);
        }
        cx.barrier()?;
        if off == 0 {
            cx.check(d, |_| buf.len())?;
        }
        if me != root {
            buf.sub(off, len).copy_from(&cx.buf(root).sub(0, len));
        }
        cx.next_round();
    }
    Ok(())
}

/// reduce_scatter (blocks may differ in size): rank `r` gets the reduction of every rank's
/// `inputs[r]`.
pub fn reduce_scatter(
    cx: &mut ShmCtx<'_>,
    inputs: &[Span],
    output: Span,
    red: &Reducer,
) -> Result<(), ShmFail> {
    let (n, me) = (cx.n(), cx.me());
    let lens: Vec<usize> = inputs.iter().map(Span::len).collect();
    let d = Desc {
        kind: Kind::ReduceScatter,
        bytes: output.len(),
        args: red_args(red).usizes(&lens).finish(),
    };
    let expect = |j: usize| lens[j];
    if cx.use_cma(lens.iter().sum()) {
        cx.publish(d, inputs);
        cx.barrier()?;
        cx.check(d, expect)?;
        // `output` may be this rank's own input block (in place); no peer reads that one.
        reduce_from_peers(cx, red, output, inputs[me], me, 0)?;
        return cx.barrier();
    }
    let es = red.dtype().size_bytes();
    // Each round carries one piece of every block, side by side in the buffer.
    let piece_cap = (cx.capacity() / n / es).max(1) * es;
    let longest = lens.iter().copied().max().unwrap_or(0);
    for off in (0..longest).step_by(piece_cap) {
        let piece = |s: &Span| s.sub(off.min(s.len()), s.len().saturating_sub(off).min(piece_cap));
        for (j, inp) in inputs.iter().enumerate() {
            let src = piece(inp);
            load_input(red, cx.buf(me).sub(j * piece_cap, src.len()), src);
        }
        if off == 0 {
            cx.publish(d, &[]);
        }
        cx.barrier()?;
        if off == 0 {
            cx.check(d, expect)?;
        }
        let dst = piece(&output);
        let len = dst.len();
        let at = me * piece_cap;
        // Reduce in rank order into a scratch slot of our own buffer's block, then copy out:
        // `output` may alias our own input block, which was already copied in.
        let acc = cx.buf(me).sub(at, len);
        for j in (0..n).filter(|&j| j != me) {
            combine(red, acc, cx.buf(j).sub(at, len));
        }
        finish(red, acc);
        dst.copy_from(&acc);
        cx.next_round();
    }
    Ok(())
}

/// reduce onto `root` (a local index); other ranks' buffers are only read.
pub fn reduce(cx: &mut ShmCtx<'_>, buf: Span, red: &Reducer, root: usize) -> Result<(), ShmFail> {
    let (n, me) = (cx.n(), cx.me());
    let d = Desc {
        kind: Kind::Reduce,
        bytes: buf.len(),
        args: red_args(red).u64(root as u64).finish(),
    };
    if cx.use_cma(buf.len()) {
        cx.publish(d, &[buf]);
        cx.barrier()?;
        cx.check(d, |_| buf.len())?;
        if me == root {
            reduce_from_peers(cx, red, buf, buf, 0, 0)?;
        }
        return cx.barrier();
    }
    let es = red.dtype().size_bytes();
    let chunk = (cx.capacity() / es) * es;
    for (off, len) in chunks(buf.len(), chunk) {
        load_input(red, cx.buf(me).sub(0, len), buf.sub(off, len));
        if off == 0 {
            cx.publish(d, &[]);
        }
        cx.barrier()?;
        if off == 0 {
            cx.check(d, |_| buf.len())?;
        }
        if me == root {
            let acc = cx.buf(me).sub(0, len);
            for j in (0..n).filter(|&j| j != me) {
                combine(red, acc, cx.buf(j).sub(0, len));
            }
            finish(red, acc);
            buf.sub(off, len).copy_from(&acc);
        }
        cx.next_round();
    }
    Ok(())
}

/// all_to_all by cross-memory attach (only when it is available): `outputs[j]` receives rank
/// `j`'s `inputs[me]`, read straight from rank `j`'s memory.
pub fn all_to_all(cx: &mut ShmCtx<'_>, inputs: &[Span], outputs: &[Span]) -> Result<(), ShmFail> {
    let me = cx.me();
    let d = Desc {
        kind: Kind::AllToAll,
        bytes: 0,
        args: 0,
    };
    cx.publish(d, inputs);
    cx.barrier()?;
    cx.check(d, |_| 0)?;
    outputs[me].copy_from(&inputs[me]);
    for (j, out) in outputs.iter().enumerate().filter(|&(j, _)| j != me) {
        let (_, len) = cx.peer_block(j, me);
        if len != out.len() {
            return Err(ShmFail::Mismatch {
                peer: cx.global(j),
                detail: format!(
                    "all_to_all sizes disagree: this rank expects {} bytes from the peer, \
                     the peer sends {len}",
                    out.len()
                ),
            });
        }
        cx.read(j, me, 0, *out)?;
    }
    cx.barrier()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::layout::Sizes;

    fn one_rank_node() -> Node {
        let sizes = Sizes {
            nlocal: 1,
            fifo_slots: 2,
            fifo_slot_bytes: 64,
            coll_bytes: 64,
        };
        let name = format!(
            "/tc-wait-test-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        Node::attach(&name, sizes, 0, Duration::from_millis(1), deadline).unwrap()
    }

    #[test]
    fn a_wait_tells_when_it_begins_and_when_it_lasts() {
        let node = one_rank_node();
        let deadline = Instant::now() + Duration::from_secs(5);
        let t0 = Instant::now();
        let told = std::cell::RefCell::new(Vec::new());
        // Ready only once the wait was told it lasts (a preempted thread may see any time pass
        // between two polls, so readiness by elapsed time alone could skip `Lasts`).
        wait_telling(
            &node,
            &mut |w| told.borrow_mut().push((w, t0.elapsed())),
            |_| told.borrow().iter().any(|(w, _)| *w == Waiting::Lasts),
            deadline,
            &mut || Ok(()),
        )
        .unwrap();
        let mut told = told.into_inner();
        let kinds: Vec<Waiting> = told.iter().map(|(w, _)| *w).collect();
        assert_eq!(kinds, [Waiting::Begins, Waiting::Lasts], "once each");
        assert!(told[1].1 >= LONG_WAIT, "{told:?}");

        // Ready at once: nothing to tell (the trace writes nothing on the path).
        told.clear();
        let t0 = Instant::now();
        let mut polls = 0;
        wait_telling(
            &node,
            &mut |w| told.push((w, t0.elapsed())),
            |_| {
                polls += 1;
                true
            },
            deadline,
            &mut || Ok(()),
        )
        .unwrap();
        assert_eq!((told.len(), polls), (0, 1));
    }
}
