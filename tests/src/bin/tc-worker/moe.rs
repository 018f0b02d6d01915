//! Expert-parallel dispatch and combine, checked bit for bit against what every rank can
//! compute alone: each rank's tokens and routing come from a seed, so a rank knows what every
//! peer sends it and what combine must return.

use anyhow::{bail, Result};
use half::bf16;
use torchcomms::moe::fp8::{e4m3_to_f32, f32_to_e4m3, token_scale};
use torchcomms::moe::{MoeBuffer, MoeConfig, MoeMode};
use torchcomms::{Tensor, TorchComm};

use crate::comm_from_env;

/// splitmix64: the same stream on every rank for a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One rank's input for one round.
struct Tokens {
    x: Vec<bf16>,
    idx: Vec<i64>,
    weights: Vec<f32>,
}

fn tokens_of(rank: usize, round: usize, routing: &str, cfg: &MoeConfig) -> Tokens {
    let mut rng = Rng((rank as u64) << 32 | round as u64);
    let (h, k, e) = (cfg.hidden, cfg.top_k, cfg.num_experts);
    // Rank 1 sometimes has nothing to send.
    let t = if rank == 1 && round == 1 {
        0
    } else {
        cfg.max_tokens_per_rank - rank % 3
    };
    let x = (0..t * h)
        .map(|_| bf16::from_f32((rng.below(2001) as f32 - 1000.0) / 64.0))
        .collect();
    let mut idx = Vec::with_capacity(t * k);
    for _ in 0..t {
        let mut row: Vec<i64> = Vec::new();
        while row.len() < k {
            let id = match routing {
                // Every token to expert 0 (and unused slots).
                "one" => {
                    if row.is_empty() {
                        0
                    } else {
                        -1
                    }
                }
                _ if rng.below(7) == 0 => -1,
                _ => rng.below(e) as i64,
            };
            if id == -1 || !row.contains(&id) {
                row.push(id);
            }
        }
        idx.extend(row);
    }
    let weights = (0..t * k).map(|_| rng.below(1000) as f32 / 999.0).collect();
    Tokens { x, idx, weights }
}

/// What one row looks like once dispatched: its activations as the receiver sees them.
fn as_sent(row: &[bf16], fp8: bool) -> (Vec<u8>, f32, Vec<f32>) {
    if !fp8 {
        let bytes = row.iter().flat_map(|v| v.to_le_bytes()).collect();
        return (bytes, 1.0, row.iter().map(|v| v.to_f32()).collect());
    }
    let scale = token_scale(row.iter().map(|v| v.to_f32()));
    let q: Vec<u8> = row
        .iter()
        .map(|v| f32_to_e4m3(v.to_f32() / scale))
        .collect();
    let deq = q.iter().map(|&b| e4m3_to_f32(b) * scale).collect();
    (q, scale, deq)
}

/// The expert's output for one row: a function of the expert id and the row.
fn expert(global: usize, row: &[f32]) -> Vec<bf16> {
    row.iter()
        .map(|&v| bf16::from_f32(v * (global as f32 + 1.0) * 0.25))
        .collect()
}

/// The first `n` bytes of a buffer (read after the operation that wrote it returned).
fn raw(t: &Tensor, n: usize) -> Vec<u8> {
    let mut raw = vec![0u8; n];
    t.span().sub(0, n).copy_to_slice(&mut raw);
    raw
}

fn f32s(t: &Tensor, n: usize) -> Vec<f32> {
    raw(t, 4 * n)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect()
}

/// Rounds of dispatch and combine in `mode`, with `routing` (`random` or `one`).
pub(crate) fn moe(mode: &str, fp8: bool, routing: &str) -> Result<()> {
    let comm = comm_from_env("moe")?;
    let (me, n) = (comm.get_rank(), comm.get_size());
    let cfg = MoeConfig {
        num_experts: 4 * n,
        hidden: 40,
        max_tokens_per_rank: 9,
        top_k: 3,
        mode: MoeMode::from_name(mode).expect("--mode high_throughput or low_latency"),
    };
    // The device buffer is for CUDA communicators; a CPU one is refused at once, naming it.
    let refused = torchcomms::moe::DeviceMoeBuffer::new(&comm, cfg).expect_err("a cpu comm");
    anyhow::ensure!(
        refused.kind() == torchcomms::ErrorKind::InvalidArgument
            && refused.to_string().contains("comm"),
        "DeviceMoeBuffer on a cpu comm: {refused}"
    );
    let mut buf = MoeBuffer::new(&comm, cfg)?;
    let mut checks = 0;
    for round in 0..3 {
        checks += one_round(&comm, &mut buf, round, fp8, routing)?;
    }
    comm.finalize()?;
    println!("MOE OK rank {me} of {n}: {checks} rows checked");
    Ok(())
}

fn one_round(
    comm: &TorchComm,
    buf: &mut MoeBuffer,
    round: usize,
    fp8: bool,
    routing: &str,
) -> Result<usize> {
    let (me, n) = (comm.get_rank(), comm.get_size());
    let cfg = *buf.config();
    let (h, k, local) = (cfg.hidden, cfg.top_k, cfg.local_experts(n));
    let all: Vec<Tokens> = (0..n).map(|r| tokens_of(r, round, routing, &cfg)).collect();
    let mine = &all[me];
    let t = mine.idx.len() / k;
    let x = Tensor::from_vec(mine.x.clone()).with_rows(t);
    let idx = Tensor::from_vec(mine.idx.clone()).with_rows(t);
    let w = Tensor::from_vec(mine.weights.clone()).with_rows(t);
    let d = buf.dispatch(comm, &x, &idx, &w, fp8)?;

    // Expected rows: per local expert, every rank's tokens routed to it, in rank then token order.
    let slab = cfg.slab_rows(n);
    let row_bytes = if fp8 { h } else { 2 * h };
    let cap = cfg.recv_rows(n);
    let recv_x = buf
        .buffer(if fp8 { "recv_x_fp8" } else { "recv_x" })
        .expect("buffer");
    let got_x = raw(recv_x, cap * row_bytes);
    let got_w = f32s(buf.buffer("recv_weights").expect("buffer"), cap);
    let got_s = f32s(buf.buffer("recv_scales").expect("buffer"), cap);
    let mut expert_out = vec![bf16::ZERO; cap * h];
    let mut checked = 0;
    let mut before = 0;
    for e in 0..local {
        let g = me * local + e;
        let mut i = 0;
        for (s, src) in all.iter().enumerate() {
            for tok in 0..src.idx.len() / k {
                let Some(slot) = (0..k).find(|&j| src.idx[tok * k + j] == g as i64) else {
                    continue;
                };
                let row = match cfg.mode {
                    MoeMode::HighThroughput => before + i,
                    MoeMode::LowLatency => e * slab + i,
                };
                let (payload, scale, deq) = as_sent(&src.x[tok * h..(tok + 1) * h], fp8);
                if got_x[row * row_bytes..(row + 1) * row_bytes] != payload[..] {
                    bail!("round {round}: expert {g} row {i} (rank {s} token {tok}) differs");
                }
                if got_w[row] != src.weights[tok * k + slot] || (fp8 && got_s[row] != scale) {
                    bail!("round {round}: expert {g} row {i}: weight or scale differs");
                }
                expert_out[row * h..(row + 1) * h].copy_from_slice(&expert(g, &deq));
                i += 1;
                checked += 1;
            }
        }
        if d.tokens_per_expert[e] != i {
            bail!(
                "round {round}: expert {g} got {} rows, expected {i}",
                d.tokens_per_expert[e]
            );
        }
        before += i;
    }

    // Combine: each token's weighted sum of its experts' outputs, in slot order, in f32.
    let rows = match cfg.mode {
        MoeMode::HighThroughput => d.rows(),
        MoeMode::LowLatency => cap,
    };
    expert_out.truncate(rows * h);
    let y = Tensor::from_vec(expert_out).with_rows(rows);
    let out = Tensor::from_vec(vec![bf16::from_f32(-1.0); t * h]).with_rows(t);
    buf.combine(comm, &y, &d.handle, &out)?;
    drop(y);
    let got = out.to_vec::<bf16>()?;
    for tok in 0..t {
        let mut acc = vec![0f32; h];
        for j in 0..k {
            let id = mine.idx[tok * k + j];
            if id < 0 {
                continue;
            }
            let (_, _, deq) = as_sent(&mine.x[tok * h..(tok + 1) * h], fp8);
            let wj = mine.weights[tok * k + j];
            for (a, v) in acc.iter_mut().zip(expert(id as usize, &deq)) {
                *a += wj * v.to_f32();
            }
        }
        let want: Vec<bf16> = acc.iter().map(|&a| bf16::from_f32(a)).collect();
        if got[tok * h..(tok + 1) * h] != want[..] {
            bail!("round {round}: combined token {tok} differs");
        }
    }
    Ok(checked + t)
}
