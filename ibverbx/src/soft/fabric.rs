//! The state of the software fabric: memory regions, queue pairs, completion queues, and the
//! execution of queued writes with RC semantics.
//!
//! A posted write waits in its QP's send queue until the fabric progresses (on any poll).
//! Executing it checks, in the order a NIC would: the QP's state, an injected fault, the
//! local key and range, that the peer QP exists and is connected back, the remote key and
//! range, and (with immediate data) that the peer has a receive posted; without one the write
//! waits (RNR with infinite retries) and so does everything behind it on that QP. Only then
//! are bytes copied. A failure completes the write with its status and moves the QP to the
//! error state, which flushes the rest of its send queue and its posted receives.

use std::collections::{HashMap, VecDeque};

use crate::provider::{Completion, RdmaOp, WcOpcode, WcStatus, WorkRequest};
use crate::soft::memory::{move_bytes, Backing};
use crate::soft::SoftConfig;

/// splitmix64: small, seeded, deterministic.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

pub(crate) struct Mr {
    pub(crate) device: usize,
    /// The address work requests name (for the caller's memory, its own address).
    pub(crate) addr: u64,
    pub(crate) mem: Backing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QpState {
    /// Created, not connected.
    Reset,
    /// Connected to a peer QP.
    Ready,
    /// A failure happened: everything flushes.
    Error,
}

pub(crate) struct Qp {
    pub(crate) device: usize,
    pub(crate) cq: usize,
    pub(crate) peer: Option<u32>,
    pub(crate) state: QpState,
    pub(crate) sq: VecDeque<WorkRequest>,
    pub(crate) rq: VecDeque<u64>,
    /// Injected faults: (writes to let through first, status of the next one).
    pub(crate) faults: VecDeque<(u64, WcStatus)>,
}

/// A completion queue: first in, first out, like a hardware CQ (the order across QPs comes
/// from the order the writes ran in).
#[derive(Default)]
pub(crate) struct Cq {
    pub(crate) alive: bool,
    pub(crate) fifo: VecDeque<Completion>,
}

pub(crate) struct Fabric {
    pub(crate) cfg: SoftConfig,
    pub(crate) rng: Rng,
    pub(crate) devices: Vec<String>,
    pub(crate) mrs: HashMap<u32, Mr>,
    pub(crate) next_key: u32,
    pub(crate) next_addr: u64,
    /// QPs by number minus `QP_BASE`; `None` once destroyed.
    pub(crate) qps: Vec<Option<Qp>>,
    pub(crate) cqs: Vec<Cq>,
    /// QPs with queued writes.
    pub(crate) active: Vec<u32>,
    /// Writes executed, and bytes copied (statistics).
    pub(crate) writes: u64,
    pub(crate) bytes: u64,
}

pub(crate) const QP_BASE: u32 = 0x100;

/// What running the head of a send queue did.
enum Step {
    Ran,
    Blocked,
    Empty,
}

impl Fabric {
    pub(crate) fn new(cfg: SoftConfig) -> Fabric {
        Fabric {
            rng: Rng::new(cfg.seed),
            cfg,
            devices: Vec::new(),
            mrs: HashMap::new(),
            next_key: 0x1000,
            next_addr: 0x10_0000_0000,
            qps: Vec::new(),
            cqs: Vec::new(),
            active: Vec::new(),
            writes: 0,
            bytes: 0,
        }
    }

    pub(crate) fn qp(&mut self, num: u32) -> Option<&mut Qp> {
        let i = num.checked_sub(QP_BASE)? as usize;
        self.qps.get_mut(i)?.as_mut()
    }

    pub(crate) fn push_completion(&mut self, cq: usize, c: Completion) {
        let Some(cq) = self.cqs.get_mut(cq) else {
            return;
        };
        if !cq.alive {
            return;
        }
        cq.fifo.push_back(c);
    }

    fn send_completion(&mut self, qp_num: u32, cq: usize, wr: &WorkRequest, status: WcStatus) {
        self.push_completion(
            cq,
            Completion {
                wr_id: wr.wr_id,
                qp_num,
                status,
                opcode: match wr.op {
                    RdmaOp::Write => WcOpcode::RdmaWrite,
                    RdmaOp::Read => WcOpcode::RdmaRead,
                },
                byte_len: 0,
                imm: None,
            },
        );
    }

    /// Moves a QP to the error state: its queued writes and posted receives flush.
    pub(crate) fn fail_qp(&mut self, num: u32) {
        let Some(qp) = self.qp(num) else { return };
        qp.state = QpState::Error;
        let cq = qp.cq;
        let sq: Vec<WorkRequest> = qp.sq.drain(..).collect();
        let rq: Vec<u64> = qp.rq.drain(..).collect();
        for wr in &sq {
            self.send_completion(num, cq, wr, WcStatus::WrFlush);
        }
        for wr_id in rq {
            self.push_completion(
                cq,
                Completion {
                    wr_id,
                    qp_num: num,
                    status: WcStatus::WrFlush,
                    opcode: WcOpcode::Recv,
                    byte_len: 0,
                    imm: None,
                },
            );
        }
    }

    /// Whether `[addr, addr + len)` lies in region `key` of `device`.
    fn check(&self, key: u32, device: usize, addr: u64, len: u64) -> bool {
        match self.mrs.get(&key) {
            Some(mr) => {
                mr.device == device
                    && addr >= mr.addr
                    && addr
                        .checked_add(len)
                        .is_some_and(|end| end <= mr.addr + mr.mem.len() as u64)
            }
            None => false,
        }
    }

    /// Runs the queued writes. In order, QP after QP; when reordering, one write at a time
    /// from a (seeded) random QP, so writes of different QPs interleave and complete in an
    /// order unrelated to posting (each QP's own order is kept, as RC guarantees).
    pub(crate) fn progress(&mut self) {
        let mut active = std::mem::take(&mut self.active);
        let mut blocked = Vec::new();
        while !active.is_empty() {
            let i = if self.cfg.reorder {
                self.rng.below(active.len())
            } else {
                0
            };
            let num = active[i];
            let step = if self.cfg.reorder {
                self.run_one(num)
            } else {
                loop {
                    match self.run_one(num) {
                        Step::Ran => {}
                        other => break other,
                    }
                }
            };
            match step {
                Step::Ran => {}
                Step::Empty => {
                    active.swap_remove(i);
                }
                Step::Blocked => blocked.push(active.swap_remove(i)),
            }
        }
        // Writers waiting for a receive stay active (as do QPs posted to meanwhile).
        for n in blocked {
            if !self.active.contains(&n) {
                self.active.push(n);
            }
        }
    }

    /// Runs the write at the head of QP `num`'s queue.
    fn run_one(&mut self, num: u32) -> Step {
        {
            let Some(qp) = self.qp(num) else {
                return Step::Empty;
            };
            let Some(wr) = qp.sq.front().copied() else {
                return Step::Empty;
            };
            let (device, cq, peer, state) = (qp.device, qp.cq, qp.peer, qp.state);
            if state == QpState::Error {
                qp.sq.pop_front();
                self.send_completion(num, cq, &wr, WcStatus::WrFlush);
                return Step::Ran;
            }
            if let Some(f) = qp.faults.front_mut() {
                if f.0 == 0 {
                    let status = f.1;
                    qp.faults.pop_front();
                    qp.sq.pop_front();
                    self.send_completion(num, cq, &wr, status);
                    self.fail_qp(num);
                    return Step::Ran;
                }
            }
            let len = u64::from(wr.len);
            if wr.op == RdmaOp::Read && wr.imm.is_some() {
                // verbs has no read with immediate data: a malformed request.
                self.fail_write(num, cq, &wr, WcStatus::LocalQpOp);
                return Step::Ran;
            }
            if len > 0 && !self.check(wr.lkey, device, wr.local_addr, len) {
                self.fail_write(num, cq, &wr, WcStatus::LocalProtection);
                return Step::Ran;
            }
            // The peer must exist, be connected back to us and be able to answer.
            let peer_ok = peer.and_then(|p| {
                let pq = self.qp(p)?;
                (pq.peer == Some(num) && pq.state == QpState::Ready)
                    .then_some((p, pq.device, pq.cq))
            });
            let Some((p, pdev, pcq)) = peer_ok else {
                self.fail_write(num, cq, &wr, WcStatus::RetryExceeded);
                return Step::Ran;
            };
            if len > 0 && !self.check(wr.rkey, pdev, wr.remote_addr, len) {
                self.fail_write(num, cq, &wr, WcStatus::RemoteAccess);
                return Step::Ran;
            }
            let recv = if wr.imm.is_some() {
                let Some(pq) = self.qp(p) else {
                    return Step::Empty;
                };
                match pq.rq.pop_front() {
                    Some(r) => Some(r),
                    None => return Step::Blocked, // receiver not ready: retry later
                }
            } else {
                None
            };
            if let Some(qp) = self.qp(num) {
                qp.sq.pop_front();
                if let Some(f) = qp.faults.front_mut() {
                    f.0 -= 1;
                }
            }
            if len > 0 && self.cfg.copy_data {
                if let Err(why) = self.copy(&wr) {
                    tracing::warn!("ibverbx soft: moving {len} bytes failed: {why}");
                    self.fail_write(num, cq, &wr, WcStatus::General);
                    return Step::Ran;
                }
            }
            self.writes += 1;
            self.bytes += len;
            // The responder's completion is written before the requester sees the ACK.
            if let (Some(recv), Some(imm)) = (recv, wr.imm) {
                self.push_completion(
                    pcq,
                    Completion {
                        wr_id: recv,
                        qp_num: p,
                        status: WcStatus::Success,
                        opcode: WcOpcode::RecvRdmaWithImm,
                        byte_len: wr.len,
                        imm: Some(imm),
                    },
                );
            }
            self.send_completion(num, cq, &wr, WcStatus::Success);
        }
        Step::Ran
    }

    fn fail_write(&mut self, num: u32, cq: usize, wr: &WorkRequest, status: WcStatus) {
        if let Some(qp) = self.qp(num) {
            qp.sq.pop_front();
        }
        self.send_completion(num, cq, wr, status);
        self.fail_qp(num);
    }

    /// Moves a checked request's bytes between regions (possibly the same one): a write's
    /// from local to remote, a read's from remote to local.
    fn copy(&mut self, wr: &WorkRequest) -> Result<(), String> {
        let local = (wr.lkey, wr.local_addr);
        let remote = (wr.rkey, wr.remote_addr);
        let (src, dst) = match wr.op {
            RdmaOp::Write => (local, remote),
            RdmaOp::Read => (remote, local),
        };
        let (src_addr, src_engine) = self.reach(src.0, src.1)?;
        let (dst_addr, dst_engine) = self.reach(dst.0, dst.1)?;
        // SAFETY: `check` put both ranges inside live registrations: fabric-owned bytes, or
        // memory whose registrant promised it stays valid while registered.
        unsafe {
            move_bytes(
                dst_addr,
                src_addr,
                wr.len as usize,
                dst_engine.or(src_engine).as_ref(),
            )
        }
    }

    /// Where byte `addr` of region `key` is reached, and the engine that moves it.
    fn reach(
        &mut self,
        key: u32,
        addr: u64,
    ) -> Result<(u64, Option<std::sync::Arc<dyn crate::soft::DmaEngine>>), String> {
        let mr = self
            .mrs
            .get_mut(&key)
            .ok_or_else(|| format!("region {key:#x} is gone"))?;
        let off = (addr - mr.addr) as usize;
        Ok((mr.mem.addr_at(off), mr.mem.engine().cloned()))
    }

    /// Copies between region `key` at `offset` and host `buf` (`into_region`: from `buf`).
    pub(crate) fn host_copy(
        &mut self,
        key: u32,
        offset: usize,
        buf: *mut u8,
        len: usize,
        into_region: bool,
    ) -> Result<(), String> {
        let (base, size) = self
            .mrs
            .get(&key)
            .map(|mr| (mr.addr, mr.mem.len()))
            .ok_or_else(|| format!("region {key:#x} is gone"))?;
        if offset.checked_add(len).is_none_or(|e| e > size) {
            return Err(format!(
                "{len} bytes at offset {offset} pass the region's {size} bytes"
            ));
        }
        let (at, engine) = self.reach(key, base + offset as u64)?;
        let (dst, src) = if into_region {
            (at, buf as u64)
        } else {
            (buf as u64, at)
        };
        // SAFETY: the region's range was checked above; `buf` is the caller's slice of `len`.
        unsafe { move_bytes(dst, src, len, engine.as_ref()) }
    }

    /// Takes up to `max` completions of CQ `cq`, in order; with partial delivery a random
    /// number of those available (possibly none, as a CQ polled before the NIC wrote).
    pub(crate) fn take(&mut self, cq: usize, out: &mut Vec<Completion>, max: usize) -> usize {
        let avail = self.cqs.get(cq).map_or(0, |c| c.fifo.len());
        let mut n = avail.min(max);
        if self.cfg.partial && n > 0 {
            n = self.rng.below(n + 1);
        }
        out.extend(self.cqs[cq].fifo.drain(..n));
        n
    }
}
