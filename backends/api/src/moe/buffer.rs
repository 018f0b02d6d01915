//! [`MoeBuffer`]: the buffers of expert-parallel dispatch and combine, and the two exchanges.
//! Both pack records into `send`, move them with one `device_alltoallv_single` (counts travel
//! with the rows), and unpack from `recv`.

use std::sync::atomic::{AtomicU64, Ordering};

use half::bf16;
use torchcomms_core::{DataType, Device, Span};

use super::fp8::{f32_to_e4m3, token_scale};
use super::route::{combine_record_bytes, group_by_expert, ranks_of_tokens, DispatchRecord};
use super::{BufferSpec, DispatchHandle, Dispatched, MoeConfig, MoeMode, RowSource};
use crate::comm::TorchComm;
use crate::error::{Error, Result};
use crate::options::OpOptions;
use crate::tensor::Tensor;

/// The buffers of expert-parallel dispatch and combine on one communicator, allocated once.
/// Every rank creates one with the same [`MoeConfig`] and calls `dispatch` and `combine` in the
/// same order, as with any collective.
#[derive(Debug)]
pub struct MoeBuffer {
    id: u64,
    cfg: MoeConfig,
    rank: usize,
    size: usize,
    /// In the order of [`MoeConfig::buffer_specs`].
    buffers: Vec<Tensor>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

const OP: &str = "MoeBuffer";

fn le_values<const N: usize, T>(span: Span, from: impl Fn([u8; N]) -> T) -> Vec<T> {
    let mut raw = vec![0u8; span.len()];
    span.copy_to_slice(&mut raw);
    raw.chunks_exact(N)
        .map(|c| from(c.try_into().expect("N-byte chunk")))
        .collect()
}

fn put(span: Span, at: usize, bytes: &[u8]) {
    span.sub(at, bytes.len()).copy_from_slice(bytes);
}

fn get<const N: usize>(span: Span, at: usize) -> [u8; N] {
    let mut b = [0u8; N];
    span.sub(at, N).copy_to_slice(&mut b);
    b
}

impl MoeBuffer {
    /// A buffer for `comm` with host memory of its own.
    pub fn new(comm: &TorchComm, cfg: MoeConfig) -> Result<MoeBuffer> {
        Self::check_config(comm, &cfg)?;
        let buffers = cfg
            .buffer_specs(comm.get_size())
            .iter()
            .map(|s| Tensor::zeros(s.dtype, s.numel))
            .collect();
        Self::with_buffers(comm, cfg, buffers)
    }

    /// A buffer over memory the caller allocated (a Python class holds torch tensors), one
    /// tensor per [`MoeConfig::buffer_specs`] entry, in that order.
    pub fn with_buffers(comm: &TorchComm, cfg: MoeConfig, buffers: Vec<Tensor>) -> Result<Self> {
        Self::check_config(comm, &cfg)?;
        let specs = cfg.buffer_specs(comm.get_size());
        if buffers.len() != specs.len() {
            return Err(Error::invalid(
                OP,
                "buffers",
                format!("{} tensors", specs.len()),
                buffers.len(),
            ));
        }
        for (t, s) in buffers.iter().zip(&specs) {
            let BufferSpec { name, dtype, numel } = *s;
            if t.dtype() != dtype || t.numel() < numel || !t.is_contiguous() {
                return Err(Error::invalid(
                    OP,
                    name,
                    format!("a contiguous {dtype} tensor of at least {numel} elements"),
                    format!("{t:?}"),
                ));
            }
            if t.device() != Device::Cpu {
                return Err(Error::invalid(OP, name, "a cpu tensor", t.device()));
            }
        }
        Ok(MoeBuffer {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            cfg,
            rank: comm.get_rank(),
            size: comm.get_size(),
            buffers,
        })
    }

    fn check_config(comm: &TorchComm, cfg: &MoeConfig) -> Result<()> {
        if comm.device() != Device::Cpu {
            return Err(Error::invalid(
                OP,
                "comm",
                "a communicator on cpu (CUDA communicators take DeviceMoeBuffer)",
                comm.device(),
            ));
        }
        cfg.check(comm.get_size())
    }

    /// The configuration.
    pub fn config(&self) -> &MoeConfig {
        &self.cfg
    }

    /// Buffer `name` of [`MoeConfig::buffer_specs`]; received rows are in `recv_x` (or
    /// `recv_x_fp8` and `recv_scales`) and `recv_weights`.
    pub fn buffer(&self, name: &str) -> Option<&Tensor> {
        self.cfg
            .buffer_specs(self.size)
            .iter()
            .position(|s| s.name == name)
            .map(|i| &self.buffers[i])
    }

    fn buf(&self, name: &str) -> &Tensor {
        self.buffer(name).expect("a buffer of buffer_specs")
    }

    fn check_comm(&self, comm: &TorchComm, op: &str) -> Result<()> {
        if comm.get_size() != self.size || comm.get_rank() != self.rank {
            return Err(Error::invalid(
                op,
                "comm",
                format!(
                    "the communicator the buffer was made for (rank {} of {})",
                    self.rank, self.size
                ),
                format!("rank {} of {}", comm.get_rank(), comm.get_size()),
            ));
        }
        Ok(())
    }

    /// Row `i` of a received-rows buffer for local expert `e`'s `i`-th row.
    fn row_of(&self, tokens_per_expert: &[usize], e: usize, i: usize) -> usize {
        match self.cfg.mode {
            MoeMode::HighThroughput => tokens_per_expert[..e].iter().sum::<usize>() + i,
            MoeMode::LowLatency => e * self.cfg.slab_rows(self.size) + i,
        }
    }

    /// Moves `rows[r]` records of `record` bytes to each rank `r` (packed in `send`); returns
    /// how many came from each rank (packed in `recv`).
    fn exchange(&self, comm: &TorchComm, rows: &[usize], record: usize) -> Result<Vec<usize>> {
        let (send, recv) = (self.buf("send"), self.buf("recv"));
        let (send_counts, recv_counts) = (self.buf("send_counts"), self.buf("recv_counts"));
        let counts: Vec<u8> = rows
            .iter()
            .flat_map(|&r| (r as i64).to_le_bytes())
            .collect();
        send_counts.span().copy_from_slice(&counts);
        let cap_in = send.numel() / record;
        let cap_out = recv.numel() / record;
        let input = send.narrow(0, cap_in * record).with_rows(cap_in);
        let output = recv.narrow(0, cap_out * record).with_rows(cap_out);
        comm.device_alltoallv_single(
            &output,
            &input,
            recv_counts,
            send_counts,
            &OpOptions::sync(),
        )?
        .wait()?;
        Ok(le_values(recv_counts.span(), i64::from_le_bytes)
            .into_iter()
            .map(|c| c as usize)
            .collect())
    }

    /// Sends each of this rank's tokens to every rank holding one of its experts. `x` is
    /// `[tokens, hidden]` BF16, `topk_idx` `[tokens, top_k]` int64 (-1: unused slot),
    /// `topk_weights` `[tokens, top_k]` f32. With `fp8`, rows travel as FP8 e4m3fn with one
    /// scale per token.
    pub fn dispatch(
        &mut self,
        comm: &TorchComm,
        x: &Tensor,
        topk_idx: &Tensor,
        topk_weights: &Tensor,
        fp8: bool,
    ) -> Result<Dispatched> {
        const OP: &str = "moe_dispatch";
        self.check_comm(comm, OP)?;
        let (hidden, top_k) = (self.cfg.hidden, self.cfg.top_k);
        check_host(OP, "x", x, DataType::BF16)?;
        check_host(OP, "topk_idx", topk_idx, DataType::I64)?;
        check_host(OP, "topk_weights", topk_weights, DataType::F32)?;
        let tokens = self.cfg.dispatch_tokens(OP, x)?;
        for (arg, t) in [("topk_idx", topk_idx), ("topk_weights", topk_weights)] {
            if t.numel() != tokens * top_k {
                return Err(Error::invalid(
                    OP,
                    arg,
                    format!("[{tokens}, {top_k}] (tokens, top_k)"),
                    format!("{} elements", t.numel()),
                ));
            }
        }
        let idx = le_values(topk_idx.span(), i64::from_le_bytes);
        let weights = le_values(topk_weights.span(), f32::from_le_bytes);
        let to = ranks_of_tokens(&idx, top_k, self.cfg.num_experts, self.size).map_err(|b| {
            Error::invalid(
                OP,
                &format!("topk_idx[{}, {}]", b.token, b.slot),
                format!(
                    "an expert id in [0, {}) not already chosen for the token, or -1",
                    self.cfg.num_experts
                ),
                b.id,
            )
        })?;

        // Pack: per destination rank, its tokens in order.
        let rec = DispatchRecord::new(hidden, fp8, top_k);
        let local = self.cfg.local_experts(self.size);
        let send = self.buf("send").span();
        let xs = x.span();
        // FP8: each token quantized once, however many ranks it goes to.
        let quantized = fp8.then(|| quantize_rows(xs, tokens, hidden));
        let mut at = 0;
        for (r, tokens_to_r) in to.iter().enumerate() {
            for &t in tokens_to_r {
                let t = t as usize;
                if let Some((q, scales)) = &quantized {
                    put(send, at, &q[t * hidden..(t + 1) * hidden]);
                    put(send, at + rec.scale_at(), &scales[t].to_le_bytes());
                } else {
                    send.sub(at, rec.payload)
                        .copy_from(&xs.sub(t * hidden * 2, hidden * 2));
                }
                put(send, at + rec.token_at(), &(t as u32).to_le_bytes());
                for k in 0..top_k {
                    let id = idx[t * top_k + k];
                    let here = id >= 0 && id as usize / local == r;
                    let e = if here {
                        (id as usize % local) as i32
                    } else {
                        -1
                    };
                    put(send, at + rec.slot_at(k), &e.to_le_bytes());
                    put(
                        send,
                        at + rec.slot_at(k) + 4,
                        &weights[t * top_k + k].to_le_bytes(),
                    );
                }
                at += rec.bytes();
            }
        }
        let sent: Vec<usize> = to.iter().map(Vec::len).collect();
        let came = self.exchange(comm, &sent, rec.bytes())?;

        // Unpack: every (record, slot) naming a local expert is a row of that expert.
        let recv = self.buf("recv").span();
        let mut origin = Vec::with_capacity(came.iter().sum());
        for (r, &n) in came.iter().enumerate() {
            for _ in 0..n {
                origin.push(r as u32);
            }
        }
        let slots = (0..origin.len()).flat_map(|i| {
            (0..top_k).map(move |k| {
                let e = i32::from_le_bytes(get(recv, i * rec.bytes() + rec.slot_at(k)));
                (i, k, e)
            })
        });
        let groups = group_by_expert(slots, local);
        let tokens_per_expert: Vec<usize> = groups.iter().map(Vec::len).collect();
        // Peers checked their routing; rows past the buffers would still be refused here.
        let slab = self.cfg.slab_rows(self.size);
        let total: usize = tokens_per_expert.iter().sum();
        let over = match self.cfg.mode {
            MoeMode::LowLatency => tokens_per_expert.iter().any(|&n| n > slab),
            MoeMode::HighThroughput => total > self.cfg.recv_rows(self.size),
        };
        if over {
            return Err(Error::invalid(
                OP,
                "recv_x",
                format!(
                    "room for the rows peers sent ({} rows)",
                    self.cfg.recv_rows(self.size)
                ),
                format!("{tokens_per_expert:?} rows per local expert"),
            ));
        }
        let out_x = if fp8 {
            self.buf("recv_x_fp8")
        } else {
            self.buf("recv_x")
        }
        .span();
        let (scales, wts) = (
            self.buf("recv_scales").span(),
            self.buf("recv_weights").span(),
        );
        let row_bytes = rec.payload;
        let mut rows = Vec::with_capacity(tokens_per_expert.iter().sum());
        for (e, group) in groups.iter().enumerate() {
            for (i, &(record, k)) in group.iter().enumerate() {
                let dst = self.row_of(&tokens_per_expert, e, i);
                let base = record * rec.bytes();
                out_x
                    .sub(dst * row_bytes, row_bytes)
                    .copy_from(&recv.sub(base, row_bytes));
                if fp8 {
                    put(scales, dst * 4, &get::<4>(recv, base + rec.scale_at()));
                }
                put(wts, dst * 4, &get::<4>(recv, base + rec.slot_at(k) + 4));
                rows.push(RowSource {
                    rank: origin[record],
                    token: u32::from_le_bytes(get(recv, base + rec.token_at())),
                    slot: k as u32,
                });
            }
        }
        Ok(Dispatched {
            tokens_per_expert: tokens_per_expert.clone(),
            fp8,
            handle: DispatchHandle {
                buffer: self.id,
                rows,
                tokens_per_expert,
                tokens,
                topk_idx: idx,
                topk_weights: weights,
            },
        })
    }

    /// Returns each dispatched token's weighted sum of its experts' outputs into `out`
    /// (`[tokens, hidden]` BF16). `expert_out` holds one BF16 row per received row, in the
    /// layout dispatch returned them (packed, or per-expert slabs).
    pub fn combine(
        &mut self,
        comm: &TorchComm,
        expert_out: &Tensor,
        handle: &DispatchHandle,
        out: &Tensor,
    ) -> Result<()> {
        const OP: &str = "moe_combine";
        self.check_comm(comm, OP)?;
        if handle.buffer != self.id {
            return Err(Error::invalid(
                OP,
                "handle",
                "a handle of this buffer's dispatch",
                "another buffer's",
            ));
        }
        let (hidden, top_k) = (self.cfg.hidden, self.cfg.top_k);
        check_host(OP, "expert_out", expert_out, DataType::BF16)?;
        check_host(OP, "out", out, DataType::BF16)?;
        let rows_needed = match self.cfg.mode {
            MoeMode::HighThroughput => handle.rows.len(),
            MoeMode::LowLatency => self.cfg.recv_rows(self.size),
        };
        if expert_out.numel() != rows_needed * hidden {
            return Err(Error::invalid(
                OP,
                "expert_out",
                format!("{rows_needed} rows of {hidden} (as dispatch returned them)"),
                format!("{} elements", expert_out.numel()),
            ));
        }
        if out.numel() != handle.tokens * hidden {
            return Err(Error::invalid(
                OP,
                "out",
                format!("[{}, {hidden}] (the dispatched tokens)", handle.tokens),
                format!("{} elements", out.numel()),
            ));
        }
        if out.span().overlaps(&expert_out.span()) {
            return Err(Error::invalid(
                OP,
                "out",
                "memory apart from expert_out",
                "overlapping tensors",
            ));
        }

        // Pack: rows back to their ranks, each rank's in expert-major order.
        let rec = combine_record_bytes(hidden);
        let row_bytes = hidden * 2;
        let mut per_rank = vec![0usize; self.size];
        for s in &handle.rows {
            per_rank[s.rank as usize] += 1;
        }
        let mut at: Vec<usize> = per_rank
            .iter()
            .scan(0, |acc, &n| {
                let start = *acc;
                *acc += n;
                Some(start * rec)
            })
            .collect();
        let send = self.buf("send").span();
        let ys = expert_out.span();
        let mut i = 0;
        for (e, &n) in handle.tokens_per_expert.iter().enumerate() {
            for j in 0..n {
                let s = handle.rows[i];
                let src = self.row_of(&handle.tokens_per_expert, e, j);
                let a = &mut at[s.rank as usize];
                send.sub(*a, row_bytes)
                    .copy_from(&ys.sub(src * row_bytes, row_bytes));
                put(send, *a + row_bytes, &s.token.to_le_bytes());
                put(send, *a + row_bytes + 4, &s.slot.to_le_bytes());
                *a += rec;
                i += 1;
            }
        }
        let came = self.exchange(comm, &per_rank, rec)?;

        // Every used slot of every token must come back exactly once.
        let recv = self.buf("recv").span();
        let local = self.cfg.local_experts(self.size) as i64;
        let from: Vec<i64> = came
            .iter()
            .enumerate()
            .flat_map(|(r, &n)| std::iter::repeat_n(r as i64, n))
            .collect();
        let mut at_slot = vec![usize::MAX; handle.tokens * top_k];
        for (r, &peer) in from.iter().enumerate() {
            let t = u32::from_le_bytes(get(recv, r * rec + row_bytes)) as usize;
            let k = u32::from_le_bytes(get(recv, r * rec + row_bytes + 4)) as usize;
            let used = t < handle.tokens
                && k < top_k
                && handle.topk_idx[t * top_k + k] >= 0
                && handle.topk_idx[t * top_k + k] / local == peer;
            if !used || at_slot[t * top_k + k] != usize::MAX {
                return Err(Error::invalid(
                    OP,
                    "handle",
                    "rows answering this rank's dispatch, once each",
                    format!("a row for token {t} slot {k}"),
                ));
            }
            at_slot[t * top_k + k] = r;
        }
        if let Some(p) =
            (0..at_slot.len()).find(|&p| handle.topk_idx[p] >= 0 && at_slot[p] == usize::MAX)
        {
            return Err(Error::invalid(
                OP,
                "handle",
                "an expert output for every routed slot",
                format!("none for token {} slot {}", p / top_k, p % top_k),
            ));
        }
        let dst = out.span();
        let mut y = vec![0u8; row_bytes];
        let mut acc = vec![0f32; hidden];
        let mut res = vec![0u8; row_bytes];
        for t in 0..handle.tokens {
            acc.iter_mut().for_each(|a| *a = 0.0);
            for k in 0..top_k {
                let r = at_slot[t * top_k + k];
                if r == usize::MAX {
                    continue;
                }
                let w = handle.topk_weights[t * top_k + k];
                recv.sub(r * rec, row_bytes).copy_to_slice(&mut y);
                for (a, b) in acc.iter_mut().zip(y.chunks_exact(2)) {
                    *a += w * bf16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            for (o, a) in res.chunks_exact_mut(2).zip(&acc) {
                o.copy_from_slice(&bf16::from_f32(*a).to_le_bytes());
            }
            dst.sub(t * row_bytes, row_bytes).copy_from_slice(&res);
        }
        Ok(())
    }
}

/// Every token of `x` (`[tokens, hidden]` BF16) in FP8 e4m3, and its scale.
fn quantize_rows(x: Span, tokens: usize, hidden: usize) -> (Vec<u8>, Vec<f32>) {
    let mut raw = vec![0u8; tokens * hidden * 2];
    x.sub(0, raw.len()).copy_to_slice(&mut raw);
    let mut q = vec![0u8; tokens * hidden];
    let mut scales = Vec::with_capacity(tokens);
    let mut vals = vec![0f32; hidden];
    for (t, row) in raw.chunks_exact(hidden * 2).enumerate() {
        for (v, b) in vals.iter_mut().zip(row.chunks_exact(2)) {
            *v = bf16::from_le_bytes([b[0], b[1]]).to_f32();
        }
        let scale = token_scale(vals.iter().copied());
        for (o, &v) in q[t * hidden..(t + 1) * hidden].iter_mut().zip(&vals) {
            *o = f32_to_e4m3(v / scale);
        }
        scales.push(scale);
    }
    (q, scales)
}

/// A contiguous host tensor of `dtype`.
fn check_host(op: &str, arg: &str, t: &Tensor, dtype: DataType) -> Result<()> {
    if t.device() != Device::Cpu {
        return Err(Error::invalid(op, arg, "a cpu tensor", t.device()));
    }
    if t.dtype() != dtype {
        return Err(Error::invalid(op, arg, format!("dtype {dtype}"), t.dtype()));
    }
    if !t.is_contiguous() || (t.numel() > 0 && t.addr() == 0) {
        return Err(Error::invalid(
            op,
            arg,
            "a contiguous tensor with memory",
            format!("{t:?}"),
        ));
    }
    Ok(())
}
