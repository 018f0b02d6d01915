//! The shared-memory transport for ranks on one host.
//!
//! One segment per communicator and host holds, per ordered pair of local ranks, a
//! single-producer single-consumer FIFO of fixed-size slots (so every generic algorithm and
//! point-to-point transfer runs over shared memory with one copy in and one copy out), and per
//! rank two collective buffers that the shared-memory collectives
//! ([`crate::shm_collectives`]) read from each other directly. Waiting ranks spin briefly, then sleep on a
//! futex doorbell that peers ring, so oversubscribed ranks leave the CPU to the ranks doing work.

pub(crate) mod cma;
mod futex;
pub(crate) mod layout;
pub(crate) mod node;
mod segment;
pub(crate) mod slot;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::shm_collectives::{Lane, Team};
use crate::span::Span;
use crate::transport::{Delivery, OpTag, RemoteKey, ReqId, TransportError, AGREEMENT_CHECK_AFTER};
pub(crate) use layout::Sizes;
use node::{Node, WaitEnd};
use slot::{fifo_used, Slot as SlotHeader};

/// Finds out whether every local rank can read every other's memory: each publishes the address
/// and value of a word of its own, reads every peer's word with `process_vm_readv`, and publishes
/// whether all reads returned the published values; cross-memory attach is used only when every
/// rank succeeded (so all agree). `enabled` false (the cvar) counts as a failed probe.
fn probe_cma(
    node: &Node,
    probe: &u64,
    enabled: bool,
    deadline: Instant,
    alive: node::Alive<'_>,
) -> Result<bool> {
    let me = node.me;
    let n = node.nlocal();
    if enabled {
        cma::allow_siblings();
    }
    let c = node.control(me);
    c.probe_addr
        .store(probe as *const u64 as u64, Ordering::Relaxed);
    c.probe_value.store(*probe, Ordering::Relaxed);
    node.header(2).fetch_add(1, Ordering::AcqRel);
    node.ring_others();
    let timed_out = |what: &str| crate::error::Error::Bootstrap {
        comm: String::new(),
        reason: format!("not every local rank {what} before the deadline"),
    };
    node.wait_for(
        |nd| nd.header(2).load(Ordering::Acquire) as usize == n,
        deadline,
        &mut *alive,
    )
    .map_err(|_| timed_out("published its cross-memory probe"))?;
    let works = enabled
        && (0..n).filter(|&j| j != me).all(|j| {
            let pc = node.control(j);
            let pid = pc.pid.load(Ordering::Relaxed);
            let addr = pc.probe_addr.load(Ordering::Relaxed) as usize;
            let want = pc.probe_value.load(Ordering::Relaxed);
            let mut got = [0u8; 8];
            // SAFETY: `got` is a local array, untouched by anything else during the read.
            let span = unsafe { Span::from_slice(&mut got) };
            match cma::read(pid, addr, span) {
                Ok(()) if u64::from_ne_bytes(got) == want => true,
                Ok(()) => {
                    tracing::info!(peer = j, "cross-memory probe read a wrong value (another pid namespace?); not using it");
                    false
                }
                Err(e) => {
                    tracing::info!(peer = j, "cross-memory attach unavailable ({e}); shared memory copies through its buffers");
                    false
                }
            }
        });
    c.cma_state
        .store(if works { 1 } else { 2 }, Ordering::Release);
    node.ring_others();
    node.wait_for(
        |nd| (0..n).all(|j| nd.control(j).cma_state.load(Ordering::Acquire) != 0),
        deadline,
        &mut *alive,
    )
    .map_err(|_| timed_out("finished its cross-memory probe"))?;
    Ok((0..n).all(|j| node.control(j).cma_state.load(Ordering::Acquire) == 1))
}

/// Removes the segment `name` if it exists (set-up failed: see `Node::attach`).
pub(crate) fn remove_segment(name: &str) {
    segment::Segment::unlink_name(name);
}

/// How much the shared-memory collectives of this process (every communicator together) read
/// straight from other ranks' memory by cross-memory attach; the probes at init are not
/// counted. Two relaxed counters per read; tests use them to show that the path ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmaStats {
    /// Ranges read (each by one or more `process_vm_readv` calls).
    pub reads: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Window puts written (`process_vm_writev`).
    pub puts: u64,
}

/// What this process has read by cross-memory attach so far (see [`CmaStats`]).
pub fn cma_stats() -> CmaStats {
    let (reads, bytes) = cma::counted();
    CmaStats {
        reads,
        bytes,
        puts: cma::puts(),
    }
}

/// Whether `e` is the failure of a local peer already recorded in `dead` (its requests failed
/// when it was first reported; later posts to it fail at once).
fn known_failure(
    dead: &[Option<TransportError>],
    local_of: &[Option<usize>],
    e: &TransportError,
) -> bool {
    !matches!(e, TransportError::Disagree { .. })
        && e.peer()
            .and_then(|p| local_of.get(p).copied().flatten())
            .is_some_and(|l| dead[l].is_some())
}

/// Request ids of this transport live above this bit, apart from the socket transport's.
pub(crate) const ID_BASE: u64 = 1 << 62;

/// Tunables of the shared-memory transport.
#[derive(Debug, Clone)]
pub struct ShmConfig {
    /// Slots per point-to-point FIFO.
    pub fifo_slots: usize,
    /// Bytes per FIFO slot.
    pub fifo_slot_bytes: usize,
    /// Bytes of each of a rank's two collective buffers.
    pub coll_bytes: usize,
    /// How long a waiting rank spins before sleeping (`None`: chosen from cores and ranks).
    pub spin: Option<Duration>,
    /// Read peers' buffers directly (cross-memory attach) when a probe at init works everywhere.
    pub cma: bool,
    /// Messages of at least this many bytes per rank go by cross-memory attach.
    pub cma_min_bytes: usize,
    /// Bytes of the cache-resident buffer that peers' data is read into before it is reduced.
    pub cma_chunk_bytes: usize,
    /// Lanes of the shared-memory collectives, each run by a thread of its own (`None`: the
    /// host's cores per local rank, at most [`MAX_LANES`]). Every local rank must use the same.
    pub lanes: Option<usize>,
    /// Collectives of at least this many bytes are cut into lanes (reductions from a quarter of
    /// it; an all_to_all when its ranks together send this much per rank).
    pub lanes_min_bytes: usize,
}

/// Most lanes a rank runs: past this, one socket's memory is the limit, not the threads.
pub const MAX_LANES: usize = 8;

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            fifo_slots: 4,
            fifo_slot_bytes: 128 << 10,
            coll_bytes: 2 << 20,
            spin: None,
            cma: true,
            cma_min_bytes: 1 << 20,
            cma_chunk_bytes: 256 << 10,
            lanes: None,
            lanes_min_bytes: 2 << 20,
        }
    }
}

#[derive(Debug)]
struct PendingSend {
    id: u64,
    data: Span,
    tag: OpTag,
    sent: usize,
    started: bool,
    /// Whether the receiver's consuming its first slot (which it does only after checking the
    /// tag and size) is awaited.
    delivery: Delivery,
    /// The FIFO position of its first slot.
    first_slot: u64,
}

#[derive(Debug)]
struct PendingRecv {
    id: u64,
    data: Span,
    tag: OpTag,
    got: usize,
    started: bool,
}

/// Shared-memory connections to the ranks of this host.
#[derive(Debug)]
pub struct ShmTransport {
    /// The segment (the shared-memory collectives read peers' buffers through it).
    pub(crate) node: Node,
    /// Local index of each global rank (None: on another host).
    local_of: Vec<Option<usize>>,
    /// Global rank of each local index.
    pub(crate) global_of: Vec<usize>,
    sends: Vec<VecDeque<PendingSend>>,
    recvs: Vec<VecDeque<PendingRecv>>,
    /// Per local peer: FIFO positions of the first slots of confirmed messages it has not
    /// consumed yet.
    unconfirmed: Vec<VecDeque<u64>>,
    /// Per local peer: sends written whose receiver has not accepted them yet
    /// ([`Delivery::Accepted`]): the first slot's FIFO position and the request.
    unaccepted: Vec<VecDeque<(u64, u64)>>,
    /// Since when nothing has moved, while requests wait.
    stalled_since: Option<Instant>,
    next_id: u64,
    pending: HashMap<u64, usize>,
    done: HashSet<u64>,
    failed: HashMap<u64, TransportError>,
    dead: Vec<Option<TransportError>>,
    /// Lane 0 of the shared-memory collectives (the progress thread's).
    pub(crate) first: Lane,
    /// The helper threads that run the other lanes, when the host has cores to spare.
    pub(crate) team: Option<Team>,
    /// The word peers read to probe cross-memory attach; must live as long as the segment.
    _probe: Box<u64>,
}

impl ShmTransport {
    /// Joins the host's segment `name`. `local_ranks` are the global ranks on this host in
    /// increasing order, `size` the communicator size, `rank` this rank, `cores` the cores the
    /// local ranks share. `alive` reports a local peer that died during set-up (see
    /// [`Node::attach`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attach(
        name: &str,
        rank: usize,
        size: usize,
        local_ranks: &[usize],
        cores: usize,
        cfg: &ShmConfig,
        deadline: Instant,
        alive: node::Alive<'_>,
    ) -> Result<ShmTransport> {
        let nlocal = local_ranks.len();
        let me = local_ranks
            .iter()
            .position(|&r| r == rank)
            .expect("this rank is local to itself");
        // Spinning only pays when every local rank has a core of its own.
        let spin = cfg.spin.unwrap_or(if nlocal <= cores {
            Duration::from_micros(30)
        } else {
            Duration::from_micros(2)
        });
        // Helper lanes pay when cores outnumber local ranks.
        let lanes = cfg
            .lanes
            .unwrap_or(cores / nlocal.max(1))
            .clamp(1, MAX_LANES);
        let sizes = Sizes {
            nlocal,
            fifo_slots: cfg.fifo_slots,
            fifo_slot_bytes: cfg.fifo_slot_bytes,
            coll_bytes: cfg.coll_bytes,
            lanes,
        };
        let mut node = Node::attach(name, sizes, me, spin, deadline, &mut *alive)?;
        node.global = local_ranks.to_vec();
        let probe = Box::new(rand::random::<u64>() | 1);
        let cma = probe_cma(&node, &probe, cfg.cma, deadline, alive)?;
        tracing::info!(
            rank,
            local_ranks = nlocal,
            cross_memory_attach = cma,
            lanes,
            "shared memory attached"
        );
        let mut lanes_of_rank = (0..lanes).map(|l| {
            Lane::new(
                node.lane(l),
                lanes,
                cma,
                cfg.cma_min_bytes,
                cfg.cma_chunk_bytes,
            )
        });
        let first = lanes_of_rank.next().expect("at least one lane");
        let helpers: Vec<Lane> = lanes_of_rank.collect();
        let team = if helpers.is_empty() {
            None
        } else {
            Some(
                Team::start(&node, helpers, cfg.lanes_min_bytes, spin)
                    .map_err(|e| Error::io("starting the shared-memory helper threads", e))?,
            )
        };
        let mut local_of = vec![None; size];
        for (i, &g) in local_ranks.iter().enumerate() {
            local_of[g] = Some(i);
        }
        Ok(ShmTransport {
            node,
            local_of,
            global_of: local_ranks.to_vec(),
            sends: (0..nlocal).map(|_| VecDeque::new()).collect(),
            recvs: (0..nlocal).map(|_| VecDeque::new()).collect(),
            unconfirmed: (0..nlocal).map(|_| VecDeque::new()).collect(),
            unaccepted: (0..nlocal).map(|_| VecDeque::new()).collect(),
            stalled_since: None,
            next_id: ID_BASE,
            pending: HashMap::new(),
            done: HashSet::new(),
            failed: HashMap::new(),
            dead: vec![None; nlocal],
            first,
            team,
            _probe: probe,
        })
    }

    /// Whether shared-memory collectives read peers' memory directly (agreed by every local
    /// rank at init).
    pub fn uses_cma(&self) -> bool {
        self.first.cma
    }

    /// Whether `peer` is reached through this transport.
    pub fn reaches(&self, peer: usize) -> bool {
        self.local_of.get(peer).is_some_and(Option::is_some)
    }

    /// Writes `src` at byte `offset` of local peer `peer`'s region `dst` by cross-memory
    /// attach, after checking that the key is that peer's (rank and published pid) and that the
    /// write fits. Completes before it returns.
    pub fn put_cma(
        &mut self,
        peer: usize,
        src: Span,
        dst: &RemoteKey,
        offset: u64,
    ) -> Result<(), TransportError> {
        let (pid, addr) = self.remote_range(peer, dst, offset, src.len())?;
        cma::write(pid, addr, src).map_err(|e| TransportError::PeerLost {
            peer,
            reason: format!("cross-memory write into its window failed: {e}"),
        })
    }

    /// Reads `dst.len()` bytes at byte `offset` of local peer `peer`'s region `src` by
    /// cross-memory attach (checked as [`ShmTransport::put_cma`]).
    pub fn get_cma(
        &mut self,
        peer: usize,
        dst: Span,
        src: &RemoteKey,
        offset: u64,
    ) -> Result<(), TransportError> {
        let (pid, addr) = self.remote_range(peer, src, offset, dst.len())?;
        cma::read(pid, addr, dst).map_err(|e| TransportError::PeerLost {
            peer,
            reason: format!("cross-memory read from its window failed: {e}"),
        })
    }

    /// The pid and address of `len` bytes at `offset` of `key`'s region, checked: the key
    /// belongs to `peer` (rank and the pid it published here) and the range fits.
    fn remote_range(
        &self,
        peer: usize,
        key: &RemoteKey,
        offset: u64,
        len: usize,
    ) -> Result<(u32, usize), TransportError> {
        let l = self.local(peer)?;
        let pid = self.node.control(l).pid.load(Ordering::Relaxed);
        let bad = |reason: String| TransportError::PeerLost { peer, reason };
        if key.rank as usize != peer || key.pid != pid {
            return Err(bad(format!(
                "its window key names rank {} (pid {}), not this peer (pid {pid})",
                key.rank, key.pid
            )));
        }
        key.check_fits(offset, len as u64).map_err(bad)?;
        Ok((pid, (key.base + offset) as usize))
    }

    /// Whether every rank of the communicator is on this host.
    pub fn is_whole_comm(&self) -> bool {
        self.global_of.len() == self.local_of.len()
    }

    fn local(&self, peer: usize) -> Result<usize, TransportError> {
        let l =
            self.local_of
                .get(peer)
                .copied()
                .flatten()
                .ok_or_else(|| TransportError::PeerLost {
                    peer,
                    reason: "not on this host (no shared-memory path)".into(),
                })?;
        if let Some(e) = &self.dead[l] {
            return Err(e.clone());
        }
        Ok(l)
    }

    fn new_id(&mut self, peer: usize) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert(id, peer);
        id
    }

    /// Posts a send to a local peer, for the operation `tag` names (`delivery`: see
    /// [`crate::transport::Transport::post_send`]).
    pub fn post_send(
        &mut self,
        peer: usize,
        data: Span,
        tag: OpTag,
        delivery: Delivery,
    ) -> Result<ReqId, TransportError> {
        let l = self.local(peer)?;
        let id = self.new_id(peer);
        self.sends[l].push_back(PendingSend {
            id,
            data,
            tag,
            sent: 0,
            started: false,
            delivery,
            first_slot: 0,
        });
        Ok(ReqId(id))
    }

    /// Posts a receive from a local peer, for the operation `tag` names.
    pub fn post_recv(
        &mut self,
        peer: usize,
        data: Span,
        tag: OpTag,
    ) -> Result<ReqId, TransportError> {
        let l = self.local(peer)?;
        let id = self.new_id(peer);
        self.recvs[l].push_back(PendingRecv {
            id,
            data,
            tag,
            got: 0,
            started: false,
        });
        Ok(ReqId(id))
    }

    /// Finished / failed / pending, as [`crate::transport::Transport::test`].
    pub fn test(&mut self, req: ReqId) -> Result<bool, TransportError> {
        if self.done.remove(&req.0) {
            return Ok(true);
        }
        if let Some(e) = self.failed.remove(&req.0) {
            return Err(e);
        }
        Ok(!self.pending.contains_key(&req.0))
    }

    /// The peer of a pending request.
    pub fn peer_of(&self, req: ReqId) -> Option<usize> {
        self.pending.get(&req.0).copied()
    }

    /// Whether any request is posted and unfinished, or a confirmed send is not consumed yet.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty() || self.unconfirmed.iter().any(|u| !u.is_empty())
    }

    /// Whether confirmed sends wait for their receivers to consume them; the failure of a
    /// receiver that never will (see [`crate::transport::Transport::unconfirmed`]).
    pub fn unconfirmed(&mut self) -> Result<bool, TransportError> {
        let mut waiting = false;
        for (l, u) in self.unconfirmed.iter().enumerate() {
            if !u.is_empty() {
                if let Some(e) = &self.dead[l] {
                    return Err(e.clone());
                }
                waiting = true;
            }
        }
        Ok(waiting)
    }

    /// Local ranks other than this one, as global ranks.
    pub fn local_peers(&self) -> impl Iterator<Item = usize> + '_ {
        self.global_of
            .iter()
            .copied()
            .filter(move |&g| Some(self.node.me) != self.local_of[g])
    }

    /// Fails what `err` stops: the requests of the peer it names, or every request when ranks
    /// disagree about the operation (the one this rank waits for may be another peer's).
    fn fail_for(&mut self, err: TransportError) {
        if matches!(err, TransportError::Disagree { .. }) {
            for (id, _) in self.pending.drain() {
                self.failed.insert(id, err.clone());
            }
        } else if let Some(p) = err.peer() {
            self.fail_peer(p, err);
        }
    }

    /// Fails every request to or from `peer` with `err`.
    pub fn fail_peer(&mut self, peer: usize, err: TransportError) {
        let Some(l) = self.local_of.get(peer).copied().flatten() else {
            return;
        };
        self.dead[l].get_or_insert(err.clone());
        let ids: Vec<u64> = self.sends[l]
            .drain(..)
            .map(|s| s.id)
            .chain(self.recvs[l].drain(..).map(|r| r.id))
            .chain(self.unaccepted[l].drain(..).map(|(_, id)| id))
            .collect();
        for id in ids {
            if self.pending.remove(&id).is_some() {
                self.failed.insert(id, err.clone());
            }
        }
    }

    /// Fails everything (local abort).
    pub fn abort(&mut self) {
        for g in self.global_of.clone() {
            self.fail_peer(g, TransportError::Aborted);
        }
    }

    fn finish(&mut self, id: u64) {
        self.pending.remove(&id);
        self.done.insert(id);
    }

    /// One pass over every FIFO with work; returns whether anything moved.
    pub fn pass(&mut self) -> bool {
        let mut moved = false;
        let me = self.node.me;
        let k = self.node.layout().sizes.fifo_slots as u64;
        for l in 0..self.node.nlocal() {
            if l == me {
                continue;
            }
            // Sends: fill free slots of the FIFO me -> l.
            let pair = self.node.layout().pair(me, l);
            let mut finished = Vec::new();
            let mut error = None;
            while let Some(s) = self.sends[l].front_mut() {
                let idx = self.node.fifo(pair);
                let head = idx.head.load(Ordering::Relaxed);
                match fifo_used(head, idx.tail.load(Ordering::Acquire), k, self.global_of[l]) {
                    Ok(used) if used < k => {}
                    Ok(_) => break,
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
                let slot = self.node.fifo_slot(pair, (head % k) as usize);
                let n = (s.data.len() - s.sent).min(slot.payload.len());
                if !s.started {
                    s.first_slot = head;
                }
                slot.payload.copy_from(&s.data.sub(s.sent, n));
                slot.msg_len.store(s.data.len() as u64, Ordering::Relaxed);
                slot.chunk_len.store(n as u64, Ordering::Relaxed);
                slot.tag_word.store(s.tag.word, Ordering::Relaxed);
                slot.tag_seq.store(s.tag.seq, Ordering::Relaxed);
                idx.head.store(head.wrapping_add(1), Ordering::Release);
                self.node.ring(l);
                s.sent += n;
                s.started = true;
                moved = true;
                if s.sent == s.data.len() {
                    match s.delivery {
                        Delivery::Eager => finished.push(s.id),
                        Delivery::Confirmed => {
                            self.unconfirmed[l].push_back(s.first_slot);
                            finished.push(s.id);
                        }
                        Delivery::Accepted => self.unaccepted[l].push_back((s.first_slot, s.id)),
                    }
                    self.sends[l].pop_front();
                }
            }
            let consumed = self.node.fifo(pair).tail.load(Ordering::Acquire);
            while self.unconfirmed[l]
                .front()
                .is_some_and(|&first| first < consumed)
            {
                self.unconfirmed[l].pop_front();
                moved = true;
            }
            while let Some(&(first, id)) = self.unaccepted[l].front() {
                if first >= consumed {
                    break;
                }
                self.unaccepted[l].pop_front();
                finished.push(id);
                moved = true;
            }
            // Receives: drain filled slots of the FIFO l -> me.
            let pair = self.node.layout().pair(l, me);
            while let Some(r) = self.recvs[l].front_mut() {
                if error.is_some() {
                    break;
                }
                let idx = self.node.fifo(pair);
                let tail = idx.tail.load(Ordering::Relaxed);
                match fifo_used(idx.head.load(Ordering::Acquire), tail, k, self.global_of[l]) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
                let slot = self.node.fifo_slot(pair, (tail % k) as usize);
                let got = OpTag {
                    word: slot.tag_word.load(Ordering::Relaxed),
                    seq: slot.tag_seq.load(Ordering::Relaxed),
                };
                let peer = self.global_of[l];
                if !r.started && got != r.tag {
                    error = Some(TransportError::Disagree {
                        peer,
                        expected: r.tag,
                        got,
                    });
                    break;
                }
                // The peer's words are not trusted: a chunk never runs past the slot or the
                // receive buffer.
                let header = SlotHeader {
                    msg_len: slot.msg_len.load(Ordering::Relaxed),
                    chunk_len: slot.chunk_len.load(Ordering::Relaxed),
                };
                let left = r.data.len() - r.got;
                let n = match header.check(r.started, r.data.len(), r.got, slot.payload.len(), peer)
                {
                    Ok(0) if left > 0 => Err(TransportError::PeerLost {
                        peer,
                        reason:
                            "corrupt shared-memory slot: an empty chunk of an unfinished message"
                                .into(),
                    }),
                    checked => checked,
                };
                let n = match n {
                    Ok(n) => n,
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                };
                r.data.sub(r.got, n).copy_from(&slot.payload.sub(0, n));
                idx.tail.store(tail.wrapping_add(1), Ordering::Release);
                self.node.ring(l);
                r.got += n;
                r.started = true;
                moved = true;
                if r.got == r.data.len() {
                    finished.push(r.id);
                    self.recvs[l].pop_front();
                }
            }
            for id in finished {
                self.finish(id);
            }
            if let Some(e) = error {
                self.fail_peer(self.global_of[l], e);
                moved = true;
            }
        }
        moved
    }

    /// True when a pass could move something now.
    fn ready(&self, node: &Node) -> bool {
        let me = node.me;
        let k = node.layout().sizes.fifo_slots as u64;
        (0..node.nlocal()).filter(|&l| l != me).any(|l| {
            let out = node.fifo(node.layout().pair(me, l));
            let inn = node.fifo(node.layout().pair(l, me));
            // A corrupt index (used > k) counts as ready: the pass reports it.
            (!self.sends[l].is_empty()
                && out
                    .head
                    .load(Ordering::Relaxed)
                    .wrapping_sub(out.tail.load(Ordering::Acquire))
                    != k)
                || self.unconfirmed[l]
                    .front()
                    .is_some_and(|&first| first < out.tail.load(Ordering::Acquire))
                || self.unaccepted[l]
                    .front()
                    .is_some_and(|&(first, _)| first < out.tail.load(Ordering::Acquire))
                || (!self.recvs[l].is_empty()
                    && inn.tail.load(Ordering::Relaxed) != inn.head.load(Ordering::Acquire))
        })
    }

    /// Moves data until something finished or moved, or `until`; `alive` is consulted while
    /// sleeping and its failure fails the requests of the peer it names.
    pub fn progress(
        &mut self,
        until: Instant,
        alive: &mut dyn FnMut() -> Result<(), TransportError>,
    ) -> Result<(), TransportError> {
        if self.pass() {
            self.stalled_since = None;
            return Ok(());
        }
        // Callers wait in short slices: a long wait is noticed across them, and then peer
        // liveness and agreement on the operation are checked on every call.
        let now = Instant::now();
        let since = *self.stalled_since.get_or_insert(now);
        let dead = &self.dead;
        let local_of = &self.local_of;
        // `alive` keeps reporting a peer whose failure was already taken (its requests failed):
        // news only, or that one peer would hide every later failure and the agreement check.
        let mut alive = || match alive() {
            Err(e) if known_failure(dead, local_of, &e) => Ok(()),
            other => other,
        };
        if now.duration_since(since) >= AGREEMENT_CHECK_AFTER {
            if let Err(e) = alive().and_then(|()| self.node.check_agreement()) {
                self.fail_for(e);
                return Ok(());
            }
        }
        let waited = self.node.wait_for(|n| self.ready(n), until, &mut alive);
        match waited {
            Ok(()) | Err(WaitEnd::Deadline) => {}
            Err(WaitEnd::Failed(e)) if e.peer().is_none() => return Err(e),
            Err(WaitEnd::Failed(e)) => self.fail_for(e),
        }
        self.pass();
        Ok(())
    }
}
