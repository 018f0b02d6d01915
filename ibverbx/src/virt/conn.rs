//! The state of one virtual connection: puts in flight (send side) and the sequence tracker
//! (receive side), driven by `VirtualQp::put` and by the completions `VirtualCq` routes here.

use std::collections::VecDeque;

use crate::error::{Error, Result};
use crate::provider::{Completion, Provider, QpOps, RdmaOp, WcStatus, WorkRequest};
use crate::virt::seq::{SeqSender, SeqTracker};
use crate::virt::{Event, Failure, Put, VcMode, VirtualCompletion, VqpConfig};

// Physical wr_id: bit 63 spray notification, bit 62 receive, bits 61..24 put number, bits
// 23..0 chunk index.
const WR_NOTIFY: u64 = 1 << 63;
const WR_RECV: u64 = 1 << 62;
const CHUNK_BITS: u32 = 24;
const CHUNK_MASK: u64 = (1 << CHUNK_BITS) - 1;
const MSG_MASK: u64 = (1 << 38) - 1;
/// Most chunks of one put.
pub(crate) const MAX_CHUNKS: u64 = 1 << CHUNK_BITS;
/// Largest chunk (a work request's length is 32-bit).
const MAX_CHUNK_BYTES: u64 = 1 << 30;
const NO_SEQ: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NotifyState {
    NotNeeded,
    Waiting,
    Posted,
    Done,
}

#[derive(Debug)]
struct Msg {
    id: u64,
    put: Put,
    op: RdmaOp,
    chunk: u64,
    nchunks: u32,
    posted: u32,
    done: u32,
    notify: NotifyState,
    error: Option<Failure>,
}

impl Msg {
    fn finished(&self) -> bool {
        self.done == self.nchunks
            && matches!(self.notify, NotifyState::NotNeeded | NotifyState::Done)
    }

    fn describe(&self) -> String {
        describe(self.id, &self.put, self.op)
    }
}

fn describe(id: u64, put: &Put, op: RdmaOp) -> String {
    let what = match op {
        RdmaOp::Write => "put",
        RdmaOp::Read => "get",
    };
    format!("{what} #{id} (wr_id {}, {} bytes)", put.wr_id, put.len)
}

pub(crate) struct Conn<P: Provider> {
    pub(crate) id: u32,
    pub(crate) qps: Vec<P::Qp>,
    cfg: VqpConfig,
    msgs: VecDeque<Msg>,
    base_id: u64,
    next_id: u64,
    dispatch_id: u64,
    notify_id: u64,
    next_qp: usize,
    outstanding: Vec<u32>,
    seq: SeqSender,
    // Sequence window: numbers in flight, absolute (never wrapping). A number is posted only
    // while it is less than half the sequence space ahead of the oldest one not yet completed
    // at the sender, so the receiver never sees one that far ahead of its next expected.
    seq_next: u64,
    seq_oldest: u64,
    seq_done: VecDeque<bool>,
    seq_half: u64,
    // Per QP, in posting order (RC completes in that order): the absolute sequence number of
    // each outstanding write, or `NO_SEQ`.
    qp_seqs: Vec<VecDeque<u64>>,
    broken: Option<Failure>,
    tracker: SeqTracker,
    notified: u64,
    recv_failed: bool,
    batches: Vec<Vec<WorkRequest>>,
    pub(crate) outbox: Vec<VirtualCompletion>,
}

impl<P: Provider> Conn<P> {
    pub(crate) fn new(id: u32, mut qps: Vec<P::Qp>, cfg: VqpConfig) -> Result<Conn<P>> {
        cfg.validate(qps.len())?;
        for (q, qp) in qps.iter_mut().enumerate() {
            for _ in 0..cfg.max_msgs_per_qp {
                qp.post_recv(WR_RECV | q as u64)?;
            }
        }
        let n = qps.len();
        Ok(Conn {
            id,
            qps,
            cfg,
            msgs: VecDeque::new(),
            base_id: 0,
            next_id: 0,
            dispatch_id: 0,
            notify_id: 0,
            next_qp: 0,
            outstanding: vec![0; n],
            seq: SeqSender::new(cfg.seq_bits),
            seq_next: 0,
            seq_oldest: 0,
            seq_done: VecDeque::new(),
            seq_half: 1 << (cfg.seq_bits - 1),
            qp_seqs: vec![VecDeque::new(); n],
            broken: None,
            tracker: SeqTracker::new(cfg.seq_bits),
            notified: 0,
            recv_failed: false,
            batches: vec![Vec::new(); n],
            outbox: Vec::new(),
        })
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.msgs.len()
    }

    pub(crate) fn broken(&self) -> Option<&Failure> {
        self.broken.as_ref()
    }

    /// Accepts a put (or, as `op` says, a get); its chunks go out now or as slots free up.
    pub(crate) fn put(&mut self, put: &Put, op: RdmaOp) -> Result<u64> {
        if op == RdmaOp::Read && put.notify {
            return Err(Error::BadConfig(
                "a get cannot notify the peer (an RDMA read carries no immediate data)".into(),
            ));
        }
        if let Some(f) = &self.broken {
            return Err(Error::Completion {
                conn: self.id,
                context: format!("put refused: the connection broke earlier ({})", f.detail),
                status: f.status,
            });
        }
        let oob = put
            .local_offset
            .checked_add(put.len)
            .is_none_or(|e| e > put.local.len)
            || put
                .remote_offset
                .checked_add(put.len)
                .is_none_or(|e| e > put.remote.len);
        if oob {
            return Err(Error::OutOfBounds {
                len: put.len,
                local_offset: put.local_offset,
                local_len: put.local.len,
                remote_offset: put.remote_offset,
                remote_len: put.remote.len,
            });
        }
        let nq = self.qps.len() as u64;
        let chunk = match self.cfg.chunk_bytes {
            0 => put.len.div_ceil(nq).max(1),
            c => c,
        }
        .min(MAX_CHUNK_BYTES);
        let mut nchunks = put.len.div_ceil(chunk);
        let dqplb = self.cfg.mode == VcMode::Dqplb;
        if nchunks == 0 && put.notify && dqplb {
            nchunks = 1; // a zero-byte write with immediate carries the notification
        }
        if nchunks >= MAX_CHUNKS {
            return Err(Error::BadConfig(format!(
                "a put of {} bytes in chunks of {chunk} needs {nchunks} chunks (at most {})",
                put.len,
                MAX_CHUNKS - 1
            )));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.msgs.push_back(Msg {
            id,
            put: *put,
            op,
            chunk,
            nchunks: nchunks as u32,
            posted: 0,
            done: 0,
            notify: if put.notify && !dqplb {
                NotifyState::Waiting
            } else {
                NotifyState::NotNeeded
            },
            error: None,
        });
        let mut out = std::mem::take(&mut self.outbox);
        self.progress(&mut out);
        self.outbox = out;
        Ok(id)
    }

    fn msg_mut(&mut self, id: u64) -> Option<&mut Msg> {
        let i = id.checked_sub(self.base_id)?;
        self.msgs.get_mut(usize::try_from(i).ok()?)
    }

    /// Posts what can be posted, then reports finished puts.
    fn progress(&mut self, out: &mut Vec<VirtualCompletion>) {
        if self.broken.is_none() {
            self.dispatch();
            self.flush_batches();
        }
        self.report(out);
    }

    /// Whether another sequence number may be posted (see `seq_next`).
    fn seq_room(&self) -> bool {
        self.seq_next - self.seq_oldest < self.seq_half
    }

    /// Takes the next sequence number for a write on QP `q`.
    fn take_seq(&mut self, q: usize, notify: bool) -> u32 {
        self.qp_seqs[q].push_back(self.seq_next);
        self.seq_done.push_back(false);
        self.seq_next += 1;
        self.seq.next_imm(notify)
    }

    /// A write of QP `q` finished (in RC order): retire its sequence number.
    fn retire(&mut self, q: usize, from_back: bool) {
        let s = if from_back {
            self.qp_seqs[q].pop_back()
        } else {
            self.qp_seqs[q].pop_front()
        };
        let Some(s) = s.filter(|&s| s != NO_SEQ) else {
            return;
        };
        if let Some(slot) = self.seq_done.get_mut((s - self.seq_oldest) as usize) {
            *slot = true;
        }
        while self.seq_done.front() == Some(&true) {
            self.seq_done.pop_front();
            self.seq_oldest += 1;
        }
    }

    fn free_qp(&mut self) -> Option<usize> {
        let n = self.qps.len();
        let cap = self.cfg.max_msgs_per_qp;
        (0..n)
            .map(|k| (self.next_qp + k) % n)
            .find(|&q| self.outstanding[q] < cap)
    }

    fn dispatch(&mut self) {
        let dqplb = self.cfg.mode == VcMode::Dqplb;
        // Chunks, in put order.
        'puts: while self.dispatch_id < self.next_id {
            let idx = (self.dispatch_id - self.base_id) as usize;
            loop {
                let m = &self.msgs[idx];
                if m.posted >= m.nchunks {
                    break;
                }
                if dqplb && !self.seq_room() {
                    break 'puts;
                }
                let Some(q) = self.free_qp() else {
                    break 'puts;
                };
                let m = &self.msgs[idx];
                let c = u64::from(m.posted);
                let off = c * m.chunk;
                let len = m.chunk.min(m.put.len - off.min(m.put.len));
                let last = m.posted + 1 == m.nchunks;
                let notify = m.put.notify && last;
                let op = m.op;
                let wr = WorkRequest {
                    wr_id: ((m.id & MSG_MASK) << CHUNK_BITS) | c,
                    op,
                    local_addr: m.put.local.addr + m.put.local_offset + off,
                    lkey: m.put.local.lkey,
                    len: len as u32,
                    remote_addr: m.put.remote.addr + m.put.remote_offset + off,
                    rkey: m.put.remote.rkey,
                    imm: None,
                };
                // Reads carry no immediate data: no sequence number either.
                let wr = if dqplb && op == RdmaOp::Write {
                    WorkRequest {
                        imm: Some(self.take_seq(q, notify)),
                        ..wr
                    }
                } else {
                    self.qp_seqs[q].push_back(NO_SEQ);
                    wr
                };
                self.batches[q].push(wr);
                self.outstanding[q] += 1;
                self.msgs[idx].posted += 1;
                self.next_qp = (q + 1) % self.qps.len();
            }
            self.dispatch_id += 1;
        }
        // Spray notifications, in put order, each once its chunks all completed.
        while self.notify_id < self.next_id {
            let idx = (self.notify_id - self.base_id) as usize;
            let m = &self.msgs[idx];
            match m.notify {
                NotifyState::NotNeeded | NotifyState::Posted | NotifyState::Done => {}
                NotifyState::Waiting => {
                    if m.done < m.nchunks
                        || self.outstanding[0] >= self.cfg.max_msgs_per_qp
                        || !self.seq_room()
                    {
                        break;
                    }
                    let wr = WorkRequest {
                        wr_id: WR_NOTIFY | ((m.id & MSG_MASK) << CHUNK_BITS),
                        op: RdmaOp::Write,
                        local_addr: m.put.local.addr,
                        lkey: m.put.local.lkey,
                        len: 0,
                        remote_addr: m.put.remote.addr,
                        rkey: m.put.remote.rkey,
                        imm: None,
                    };
                    let wr = WorkRequest {
                        imm: Some(self.take_seq(0, true)),
                        ..wr
                    };
                    self.batches[0].push(wr);
                    self.outstanding[0] += 1;
                    self.msgs[idx].notify = NotifyState::Posted;
                }
            }
            self.notify_id += 1;
        }
    }

    fn flush_batches(&mut self) {
        for q in 0..self.qps.len() {
            if self.batches[q].is_empty() {
                continue;
            }
            let batch = std::mem::take(&mut self.batches[q]);
            if let Err(e) = self.qps[q].post_sends(&batch) {
                let qp_num = self.qps[q].qp_num();
                for wr in batch.iter().rev() {
                    self.outstanding[q] -= 1;
                    self.retire(q, true);
                    let detail = format!("posting on QP {q} (qp_num {qp_num:#x}) failed: {e}");
                    self.account(wr.wr_id, WcStatus::General, &detail);
                }
                self.break_with(Failure {
                    status: WcStatus::General,
                    detail: format!("posting on QP {q} (qp_num {qp_num:#x}) failed: {e}"),
                });
            }
            let mut batch = batch;
            batch.clear();
            if self.batches[q].is_empty() {
                self.batches[q] = batch;
            }
        }
    }

    /// Counts one finished chunk or notification of a put, with its error if any.
    fn account(&mut self, wr_id: u64, status: WcStatus, why: &str) {
        let id = self.msg_id_of(wr_id);
        let chunk = wr_id & CHUNK_MASK;
        let Some(m) = self.msg_mut(id) else {
            tracing::warn!(wr_id, "ibverbx: completion of an unknown put");
            return;
        };
        if wr_id & WR_NOTIFY != 0 {
            m.notify = NotifyState::Done;
        } else {
            m.done += 1;
        }
        if !status.is_ok() && m.error.is_none() {
            let what = if wr_id & WR_NOTIFY != 0 {
                "notification".to_string()
            } else {
                format!("chunk {chunk} of {}", m.nchunks)
            };
            m.error = Some(Failure {
                status,
                detail: format!("{} {what}: {why}", m.describe()),
            });
        }
    }

    /// Put numbers are 38-bit in the wr_id: widen back against the puts in flight.
    fn msg_id_of(&self, wr_id: u64) -> u64 {
        let low = (wr_id >> CHUNK_BITS) & MSG_MASK;
        let base = self.base_id;
        let cand = (base & !MSG_MASK) | low;
        if cand < base {
            cand + (MSG_MASK + 1)
        } else {
            cand
        }
    }

    /// The first failure breaks the connection: nothing more is posted, and chunks and
    /// notifications not yet posted count as failed.
    fn break_with(&mut self, first: Failure) {
        if self.broken.is_some() {
            return;
        }
        for m in self.msgs.iter_mut() {
            let unsent = m.nchunks - m.posted;
            let notify_unsent = m.notify == NotifyState::Waiting;
            if unsent == 0 && !notify_unsent {
                continue;
            }
            m.done += unsent;
            m.posted = m.nchunks;
            if notify_unsent {
                m.notify = NotifyState::Done;
            }
            if m.error.is_none() {
                m.error = Some(Failure {
                    status: WcStatus::WrFlush,
                    detail: format!(
                        "{} not sent: the connection broke ({first})",
                        describe(m.id, &m.put, m.op)
                    ),
                });
            }
        }
        self.dispatch_id = self.next_id;
        self.notify_id = self.next_id;
        self.broken = Some(first);
    }

    fn report(&mut self, out: &mut Vec<VirtualCompletion>) {
        while self.msgs.front().is_some_and(Msg::finished) {
            let Some(m) = self.msgs.pop_front() else {
                break;
            };
            self.base_id += 1;
            out.push(VirtualCompletion {
                conn: self.id,
                event: Event::PutDone {
                    wr_id: m.put.wr_id,
                    msg: m.id,
                    len: m.put.len,
                    result: m.error.map_or(Ok(()), Err),
                },
            });
        }
    }

    /// A physical completion of QP `q` of this connection.
    pub(crate) fn on_completion(
        &mut self,
        q: usize,
        c: &Completion,
        out: &mut Vec<VirtualCompletion>,
    ) {
        if c.wr_id & WR_RECV != 0 {
            self.on_recv(q, c, out);
            return;
        }
        self.outstanding[q] = self.outstanding[q].saturating_sub(1);
        self.retire(q, false);
        if c.status.is_ok() {
            self.account(c.wr_id, c.status, "");
        } else {
            let detail = format!("on QP {q} (qp_num {:#x})", c.qp_num);
            self.account(c.wr_id, c.status, &detail);
            let id = self.msg_id_of(c.wr_id);
            let first = self
                .msg_mut(id)
                .and_then(|m| m.error.clone())
                .unwrap_or(Failure {
                    status: c.status,
                    detail,
                });
            self.break_with(first);
        }
        self.progress(out);
    }

    fn on_recv(&mut self, q: usize, c: &Completion, out: &mut Vec<VirtualCompletion>) {
        if self.recv_failed {
            return;
        }
        let fail = |status, detail: String| VirtualCompletion {
            conn: self.id,
            event: Event::RecvFailed(Failure { status, detail }),
        };
        if !c.status.is_ok() {
            out.push(fail(
                c.status,
                format!("receive on QP {q} (qp_num {:#x})", c.qp_num),
            ));
            self.recv_failed = true;
            return;
        }
        let Some(imm) = c.imm else {
            out.push(fail(
                WcStatus::General,
                format!("receive without immediate data on QP {q}"),
            ));
            self.recv_failed = true;
            return;
        };
        match self.tracker.receive(imm) {
            Ok(n) => {
                for _ in 0..n {
                    out.push(VirtualCompletion {
                        conn: self.id,
                        event: Event::Notify { seq: self.notified },
                    });
                    self.notified += 1;
                }
            }
            Err(e) => {
                out.push(fail(WcStatus::General, format!("QP {q}: {e}")));
                self.recv_failed = true;
                return;
            }
        }
        if let Err(e) = self.qps[q].post_recv(c.wr_id) {
            out.push(fail(WcStatus::General, format!("reposting a receive: {e}")));
            self.recv_failed = true;
        }
    }
}
