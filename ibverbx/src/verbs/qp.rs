//! Reliable-connected queue pairs with their lifecycle in the type:
//! `QueuePair<Reset>` → [`QueuePair::to_init`] → `QueuePair<Init>` → [`QueuePair::to_rtr`]
//! → `QueuePair<Rtr>` → [`QueuePair::to_rts`] → `QueuePair<Rts>`, the only state that posts
//! writes. A failed transition drops (destroys) the QP: build a new one.

use std::marker::PhantomData;

use crate::error::{errno, rc_error, Error, Result};
use crate::provider::{QpOps, RdmaOp, WorkRequest};
use crate::sys;
use crate::verbs::{CompletionQueue, LinkLayer, ProtectionDomain, QpEndpoint};

/// State: created, not usable.
#[derive(Debug)]
pub enum Reset {}
/// State: bound to a port; receives may be posted.
#[derive(Debug)]
pub enum Init {}
/// State: ready to receive (connected to a peer).
#[derive(Debug)]
pub enum Rtr {}
/// State: ready to send.
#[derive(Debug)]
pub enum Rts {}

/// Sizes of a new queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send requests.
    pub max_send_wr: u32,
    /// Outstanding receive requests.
    pub max_recv_wr: u32,
}

impl Default for QpCaps {
    fn default() -> QpCaps {
        QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
        }
    }
}

/// Path settings of [`QueuePair::to_rtr`] and [`QueuePair::to_rts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathConfig {
    /// Local GID index (RoCE v2 needs a RoCE v2 entry; see `Context::pick_gid_index`).
    pub gid_index: u8,
    /// Traffic class of the global route header.
    pub traffic_class: u8,
    /// Service level.
    pub service_level: u8,
    /// ACK timeout exponent (4.096 us x 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7: forever; a receiver that reposts slowly must not fail the sender).
    pub rnr_retry: u8,
}

impl Default for PathConfig {
    fn default() -> PathConfig {
        PathConfig {
            gid_index: 0,
            traffic_class: 0,
            service_level: 0,
            timeout: 20,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }
}

/// A reliable-connected queue pair in state `S`. It keeps its PD and CQ alive.
pub struct QueuePair<S> {
    raw: *mut sys::ibv_qp,
    pd: ProtectionDomain,
    _cq: CompletionQueue,
    port: u8,
    psn: u32,
    link_layer: LinkLayer,
    post_send: sys::PostSendFn,
    post_recv: sys::PostRecvFn,
    _state: PhantomData<S>,
}

// SAFETY: verbs objects may be used from any thread; posting takes `&mut self`, so one thread
// posts at a time.
unsafe impl<S> Send for QueuePair<S> {}
// SAFETY: `&QueuePair` only reads immutable fields (number, endpoint).
unsafe impl<S> Sync for QueuePair<S> {}

impl<S> std::fmt::Debug for QueuePair<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num())
            .field("state", &std::any::type_name::<S>())
            .finish()
    }
}

impl<S> QueuePair<S> {
    /// The QP's number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: `raw` is a live QP owned by `self`.
        unsafe { (*self.raw).qp_num }
    }

    /// The raw QP (escape hatch; valid while `self` lives).
    pub fn as_raw(&self) -> *mut sys::ibv_qp {
        self.raw
    }

    /// This side's connection information for the peer (LID and GID of `gid_index`).
    pub fn endpoint(&self, gid_index: u8) -> Result<QpEndpoint> {
        let ctx = self.pd.context();
        let port = ctx.query_port(self.port)?;
        Ok(QpEndpoint {
            qp_num: self.qp_num(),
            lid: port.lid,
            gid: ctx.query_gid(self.port, u32::from(gid_index))?,
            mtu: port.active_mtu.clamp(1, 5),
            psn: self.psn,
        })
    }

    fn modify(&self, attr: &mut sys::ibv_qp_attr, mask: i32, to: &'static str) -> Result<()> {
        let syms = self.pd.inner.ctx.inner.syms;
        // SAFETY: live QP, attribute structure of the declared layout.
        let rc = unsafe { (syms.modify_qp)(self.raw, attr, mask) };
        if rc != 0 {
            return Err(Error::ModifyQp {
                qp_num: self.qp_num(),
                to,
                source: rc_error(rc),
            });
        }
        Ok(())
    }

    fn into_state<T>(self) -> QueuePair<T> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: each field is read once out of a value that is never dropped, so ownership
        // moves whole into the new state.
        unsafe {
            QueuePair {
                raw: this.raw,
                pd: std::ptr::read(&this.pd),
                _cq: std::ptr::read(&this._cq),
                port: this.port,
                psn: this.psn,
                link_layer: this.link_layer,
                post_send: this.post_send,
                post_recv: this.post_recv,
                _state: PhantomData,
            }
        }
    }
}

impl QueuePair<Reset> {
    /// Creates an RC queue pair on `port` whose sends and receives complete on `cq`.
    pub fn new(
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        port: u8,
        caps: QpCaps,
    ) -> Result<QueuePair<Reset>> {
        let ctx = pd.context();
        let link_layer = ctx.query_port(port)?.link_layer;
        let mut init = sys::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.as_raw(),
            recv_cq: cq.as_raw(),
            srq: std::ptr::null_mut(),
            cap: sys::ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: caps.max_recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live PD and CQ (kept alive by the QP), valid init attributes.
        let raw = unsafe { (ctx.inner.syms.create_qp)(pd.as_raw(), &mut init) };
        if raw.is_null() {
            return Err(Error::CreateQp {
                device: ctx.name().to_string(),
                source: errno(),
            });
        }
        // SAFETY: a live QP's context is its device's.
        let ops = unsafe { &(*(*raw).context).ops };
        let (Some(post_send), Some(post_recv)) = (ops.post_send, ops.post_recv) else {
            // SAFETY: just created, destroyed once.
            unsafe { (ctx.inner.syms.destroy_qp)(raw) };
            return Err(Error::Unsupported {
                symbol: "ibv_context.ops.post_send",
            });
        };
        // Any 24-bit start works; a varying one keeps stale packets of an earlier QP with the
        // same number from matching.
        // SAFETY: reading the QP number of a live QP.
        let psn = (unsafe { (*raw).qp_num }.wrapping_mul(2_654_435_761)) & 0xff_ffff;
        Ok(QueuePair {
            raw,
            pd: pd.clone(),
            _cq: cq.clone(),
            port,
            psn,
            link_layer,
            post_send,
            post_recv,
            _state: PhantomData,
        })
    }

    /// RESET → INIT: bind to the port with remote read/write access.
    pub fn to_init(self) -> Result<QueuePair<Init>> {
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.port,
            qp_access_flags: (sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ) as u32,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_PKEY_INDEX
            | sys::IBV_QP_PORT
            | sys::IBV_QP_ACCESS_FLAGS;
        self.modify(&mut a, mask, "INIT")?;
        Ok(self.into_state())
    }
}

impl QueuePair<Init> {
    /// Posts a zero-length receive (allowed from INIT on, so it is there before the peer
    /// writes).
    pub fn post_recv(&mut self, wr_id: u64) -> Result<()> {
        post_recv_raw(self.raw, self.post_recv, wr_id)
    }

    /// INIT → RTR: connect to `remote`.
    pub fn to_rtr(self, remote: &QpEndpoint, path: &PathConfig) -> Result<QueuePair<Rtr>> {
        let local_mtu = self
            .pd
            .context()
            .query_port(self.port)?
            .active_mtu
            .clamp(1, 5);
        let global = self.link_layer == LinkLayer::Ethernet || remote.lid == 0;
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: i32::from(local_mtu.min(remote.mtu)),
            dest_qp_num: remote.qp_num,
            rq_psn: remote.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: sys::ibv_ah_attr {
                grh: sys::ibv_global_route {
                    dgid: sys::ibv_gid { raw: remote.gid },
                    flow_label: 0,
                    sgid_index: path.gid_index,
                    hop_limit: 255,
                    traffic_class: path.traffic_class,
                },
                dlid: remote.lid,
                sl: path.service_level,
                src_path_bits: 0,
                static_rate: 0,
                is_global: u8::from(global),
                port_num: self.port,
            },
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_AV
            | sys::IBV_QP_PATH_MTU
            | sys::IBV_QP_DEST_QPN
            | sys::IBV_QP_RQ_PSN
            | sys::IBV_QP_MAX_DEST_RD_ATOMIC
            | sys::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut a, mask, "RTR")?;
        Ok(self.into_state())
    }
}

impl QueuePair<Rtr> {
    /// RTR → RTS: ready to send.
    pub fn to_rts(self, path: &PathConfig) -> Result<QueuePair<Rts>> {
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTS,
            timeout: path.timeout,
            retry_cnt: path.retry_cnt,
            rnr_retry: path.rnr_retry,
            sq_psn: self.psn,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_TIMEOUT
            | sys::IBV_QP_RETRY_CNT
            | sys::IBV_QP_RNR_RETRY
            | sys::IBV_QP_SQ_PSN
            | sys::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut a, mask, "RTS")?;
        Ok(self.into_state())
    }
}

fn post_recv_raw(qp: *mut sys::ibv_qp, post: sys::PostRecvFn, wr_id: u64) -> Result<()> {
    let mut wr = sys::ibv_recv_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: std::ptr::null_mut(),
        num_sge: 0,
    };
    let mut bad = std::ptr::null_mut();
    // SAFETY: live QP; a zero-SGE receive; `bad` is a valid out-pointer.
    let rc = unsafe { post(qp, &mut wr, &mut bad) };
    if rc != 0 {
        return Err(Error::PostRecv {
            // SAFETY: live QP.
            qp_num: unsafe { (*qp).qp_num },
            source: rc_error(rc),
        });
    }
    Ok(())
}

impl QpOps for QueuePair<Rts> {
    fn qp_num(&self) -> u32 {
        QueuePair::qp_num(self)
    }

    fn post_send(&mut self, wr: &WorkRequest) -> Result<()> {
        self.post_sends(std::slice::from_ref(wr))
    }

    fn post_sends(&mut self, wrs: &[WorkRequest]) -> Result<()> {
        const BATCH: usize = 16;
        for batch in wrs.chunks(BATCH) {
            let mut sges = [sys::ibv_sge::default(); BATCH];
            // SAFETY: all-zero is a valid `ibv_send_wr` (integers and null pointers).
            let mut raw: [sys::ibv_send_wr; BATCH] = unsafe { std::mem::zeroed() };
            for (i, w) in batch.iter().enumerate() {
                sges[i] = sys::ibv_sge {
                    addr: w.local_addr,
                    length: w.len,
                    lkey: w.lkey,
                };
                let r = &mut raw[i];
                r.wr_id = w.wr_id;
                r.num_sge = i32::from(w.len > 0);
                r.opcode = match (w.op, w.imm) {
                    (RdmaOp::Read, _) => sys::IBV_WR_RDMA_READ,
                    (RdmaOp::Write, Some(_)) => sys::IBV_WR_RDMA_WRITE_WITH_IMM,
                    (RdmaOp::Write, None) => sys::IBV_WR_RDMA_WRITE,
                };
                r.send_flags = sys::IBV_SEND_SIGNALED;
                r.imm_data = w.imm.unwrap_or(0).to_be();
                r.rdma.remote_addr = w.remote_addr;
                r.rdma.rkey = w.rkey;
            }
            let base = raw.as_mut_ptr();
            for i in 0..batch.len() {
                // SAFETY: `i` and `i + 1` index `raw`/`sges` (the last link stays null); the
                // arrays outlive the post call below.
                unsafe {
                    (*base.add(i)).sg_list = sges.as_mut_ptr().add(i);
                    if i + 1 < batch.len() {
                        (*base.add(i)).next = base.add(i + 1);
                    }
                }
            }
            let mut bad = std::ptr::null_mut();
            // SAFETY: live RTS QP; a well-formed chain of `batch.len()` requests.
            let rc = unsafe { (self.post_send)(self.raw, base, &mut bad) };
            if rc != 0 {
                return Err(Error::PostSend {
                    qp_num: self.qp_num(),
                    source: rc_error(rc),
                });
            }
        }
        Ok(())
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<()> {
        post_recv_raw(self.raw, self.post_recv, wr_id)
    }
}

impl<S> Drop for QueuePair<S> {
    fn drop(&mut self) {
        let syms = self.pd.inner.ctx.inner.syms;
        // SAFETY: created once, destroyed once, before its PD and CQ (fields drop after).
        let rc = unsafe { (syms.destroy_qp)(self.raw) };
        if rc != 0 {
            tracing::warn!("ibv_destroy_qp failed: {}", rc_error(rc));
        }
    }
}

/// The real-verbs provider: connected queue pairs and their completion queue.
#[derive(Debug)]
pub enum Verbs {}

impl crate::provider::Provider for Verbs {
    type Qp = QueuePair<Rts>;
    type Cq = CompletionQueue;
}
