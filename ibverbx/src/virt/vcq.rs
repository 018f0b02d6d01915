//! `VirtualQp` (a handle on one connection's state) and `VirtualCq` (polls the physical CQ
//! and routes each completion to its connection).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::provider::{Completion, CqOps, Provider, QpOps, RdmaOp};
use crate::virt::conn::Conn;
use crate::virt::{Put, VirtualCompletion, VqpConfig};

struct Shared<P: Provider> {
    state: Mutex<Conn<P>>,
    // Set when `put` left events in the connection's outbox (a put that finished at once).
    has_outbox: AtomicBool,
}

impl<P: Provider> Shared<P> {
    fn lock(&self) -> MutexGuard<'_, Conn<P>> {
        // A panic while holding the lock leaves counters that are still consistent enough
        // to report errors; never propagate the poison.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One logical connection over N connected physical queue pairs.
///
/// Cheap to share across threads (`Send + Sync`; calls lock the connection briefly). Its
/// events arrive through the [`VirtualCq`] it was made with. Dropping it destroys its
/// physical QPs; completions still queued for them are discarded.
pub struct VirtualQp<P: Provider> {
    id: u32,
    shared: Arc<Shared<P>>,
}

impl<P: Provider> std::fmt::Debug for VirtualQp<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtualQp").field("id", &self.id).finish()
    }
}

impl<P: Provider> VirtualQp<P> {
    /// Makes a virtual QP of `qps` (connected, ready to send) whose completions go to `cq`,
    /// and posts `cfg.max_msgs_per_qp` receives on each QP for the peer's notifications.
    pub fn new(cq: &mut VirtualCq<P>, qps: Vec<P::Qp>, cfg: VqpConfig) -> Result<VirtualQp<P>> {
        let id = cq.next_id;
        cq.next_id += 1;
        let nums: Vec<u32> = qps.iter().map(QpOps::qp_num).collect();
        let conn = Conn::new(id, qps, cfg)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(conn),
            has_outbox: AtomicBool::new(false),
        });
        for (q, n) in nums.into_iter().enumerate() {
            cq.routes.insert(n, (Arc::downgrade(&shared), q));
        }
        cq.conns.push(Arc::downgrade(&shared));
        Ok(VirtualQp { id, shared })
    }

    /// The connection's id (events name it).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Posts a put; returns its number on this connection. Refused with an error when the
    /// connection broke earlier or the ranges are out of bounds.
    pub fn put(&self, put: &Put) -> Result<u64> {
        self.submit(put, RdmaOp::Write)
    }

    /// Reads `get.len` bytes of the peer's `get.remote` at `get.remote_offset` into
    /// `get.local` at `get.local_offset`, as RDMA reads spread like a put's chunks (on either
    /// mode; a read cannot notify). Completes as [`Event::PutDone`](crate::Event::PutDone),
    /// in posting order with the puts, once every chunk's bytes are in local memory.
    pub fn get(&self, get: &Put) -> Result<u64> {
        self.submit(get, RdmaOp::Read)
    }

    fn submit(&self, put: &Put, op: RdmaOp) -> Result<u64> {
        let mut c = self.shared.lock();
        let id = c.put(put, op)?;
        if !c.outbox.is_empty() {
            self.shared.has_outbox.store(true, Ordering::Release);
        }
        Ok(id)
    }

    /// Puts posted and not yet reported complete.
    pub fn in_flight(&self) -> usize {
        self.shared.lock().in_flight()
    }

    /// The first failure, once the connection broke.
    pub fn broken(&self) -> Option<crate::virt::Failure> {
        self.shared.lock().broken().cloned()
    }

    /// Numbers of the physical QPs, in order.
    pub fn qp_nums(&self) -> Vec<u32> {
        self.shared.lock().qps.iter().map(QpOps::qp_num).collect()
    }
}

type Route<P> = (Weak<Shared<P>>, usize);

/// QP numbers are small distinct integers: a multiplicative hash is enough, and SipHash would
/// be a good part of the per-completion cost.
#[derive(Default)]
struct QpNumHasher(u64);

impl Hasher for QpNumHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Routes<P> = HashMap<u32, Route<P>, BuildHasherDefault<QpNumHasher>>;

/// Polls a physical completion queue and turns its completions into per-put events of the
/// virtual QPs made with it. Use it from one thread (it takes `&mut self`).
pub struct VirtualCq<P: Provider> {
    cq: P::Cq,
    routes: Routes<P>,
    conns: Vec<Weak<Shared<P>>>,
    scratch: Vec<Completion>,
    next_id: u32,
    /// Physical completions polled per call.
    pub batch: usize,
}

impl<P: Provider> std::fmt::Debug for VirtualCq<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtualCq")
            .field("qps", &self.routes.len())
            .finish()
    }
}

impl<P: Provider> VirtualCq<P> {
    /// Wraps the physical completion queue the virtual QPs' physical QPs complete on.
    pub fn new(cq: P::Cq) -> VirtualCq<P> {
        VirtualCq {
            cq,
            routes: Routes::default(),
            conns: Vec::new(),
            scratch: Vec::with_capacity(64),
            next_id: 0,
            batch: 64,
        }
    }

    /// The physical completion queue.
    pub fn physical(&mut self) -> &mut P::Cq {
        &mut self.cq
    }

    /// Appends the events available now to `out`; returns how many. Never blocks.
    pub fn poll(&mut self, out: &mut Vec<VirtualCompletion>) -> Result<usize> {
        let before = out.len();
        self.conns.retain(|w| w.strong_count() > 0);
        for w in &self.conns {
            let Some(s) = w.upgrade() else { continue };
            if s.has_outbox.swap(false, Ordering::Acquire) {
                out.append(&mut s.lock().outbox);
            }
        }
        self.scratch.clear();
        self.cq.poll(&mut self.scratch, self.batch)?;
        let mut i = 0;
        while i < self.scratch.len() {
            let qp_num = self.scratch[i].qp_num;
            let Some((weak, q)) = self.routes.get(&qp_num) else {
                tracing::debug!(qp_num, "ibverbx: completion of a QP no virtual QP owns");
                i += 1;
                continue;
            };
            let Some(shared) = weak.upgrade() else {
                self.routes.remove(&qp_num);
                i += 1;
                continue;
            };
            let q = *q;
            let mut conn = shared.lock();
            // Completions of one QP usually come in runs: handle a run under one lock.
            while i < self.scratch.len() && self.scratch[i].qp_num == qp_num {
                conn.on_completion(q, &self.scratch[i], out);
                i += 1;
            }
        }
        Ok(out.len() - before)
    }

    /// Polls until at least one event arrived or `timeout` passed ([`Error::Timeout`]).
    pub fn wait(&mut self, out: &mut Vec<VirtualCompletion>, timeout: Duration) -> Result<usize> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let n = self.poll(out)?;
            if n > 0 {
                return Ok(n);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(Error::Timeout {
                    what: "virtual CQ event".into(),
                    waited,
                });
            }
            spins += 1;
            if spins % 64 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}
