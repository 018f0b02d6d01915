//! ib_write_bw-style benchmark of virtual QPs.
//!
//! - `--soft`: over the software provider (`--no-copy` skips moving bytes), reporting the
//!   per-put cost of the virtual QP logic plus the software fabric.
//! - `--null`: over a provider that completes every write at once, moving nothing: the cost
//!   of the virtual QP and CQ bookkeeping alone (sender and receiver together).
//! - default: real verbs, loopback on the first active port (both ends in this process); an
//!   error when there is no device. Two processes on two hosts are not done here.
//!
//! `cargo run --release -p ibverbx --example ibverbx-bench -- --soft --sizes 1M --qps 4`

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Parser;
use ibverbx::soft::{connect_pairs, Soft, SoftConfig, SoftFabric};
use ibverbx::verbs::{
    CompletionQueue, Context, DeviceList, MemoryRegion, PathConfig, QpCaps, QueuePair, Verbs,
    DEFAULT_ACCESS,
};
use ibverbx::{
    Completion, CqOps, Event, IbConfig, LocalKey, Provider, Put, QpOps, RemoteKey, VcMode,
    VirtualCq, VirtualQp, VqpConfig, WcOpcode, WcStatus, WorkRequest,
};

#[derive(Parser, Debug)]
struct Args {
    /// Message sizes (K, M suffixes).
    #[arg(long, value_delimiter = ',', default_value = "4K,64K,1M,16M")]
    sizes: Vec<String>,
    /// Messages per size.
    #[arg(long, default_value_t = 2000)]
    iters: usize,
    /// Physical QPs per virtual QP.
    #[arg(long, default_value_t = 4)]
    qps: usize,
    /// dqplb or spray.
    #[arg(long, default_value = "dqplb")]
    mode: String,
    /// Chunk bytes (0: split each message equally over the QPs).
    #[arg(long, default_value = "0")]
    chunk: String,
    /// Puts in flight.
    #[arg(long, default_value_t = 16)]
    window: usize,
    /// Software provider.
    #[arg(long)]
    soft: bool,
    /// Software provider without moving bytes.
    #[arg(long)]
    no_copy: bool,
    /// Null provider: bookkeeping only.
    #[arg(long)]
    null: bool,
}

fn parse_size(s: &str) -> anyhow::Result<usize> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    Ok(num
        .parse::<usize>()
        .with_context(|| format!("size {s:?}"))?
        * mul)
}

/// Runs `iters` notified puts of `len` bytes with `window` in flight; returns the time.
fn run<P: Provider>(
    cqs: &mut [&mut VirtualCq<P>],
    tx: &VirtualQp<P>,
    local: LocalKey,
    remote: RemoteKey,
    len: usize,
    iters: usize,
    window: usize,
) -> anyhow::Result<Duration> {
    let put = Put {
        wr_id: 0,
        local,
        local_offset: 0,
        remote,
        remote_offset: 0,
        len: len as u64,
        notify: true,
    };
    let start = Instant::now();
    let (mut posted, mut done, mut notes) = (0usize, 0usize, 0usize);
    let mut ev = Vec::with_capacity(256);
    let deadline = Duration::from_secs(120);
    while done < iters || notes < iters {
        while posted < iters && posted - done < window {
            tx.put(&Put {
                wr_id: posted as u64,
                ..put
            })?;
            posted += 1;
        }
        ev.clear();
        for cq in cqs.iter_mut() {
            cq.poll(&mut ev)?;
        }
        for e in &ev {
            match &e.event {
                Event::PutDone { result, .. } => {
                    if let Err(f) = result {
                        bail!("put failed: {f}");
                    }
                    done += 1;
                }
                Event::Notify { .. } => notes += 1,
                Event::RecvFailed(f) => bail!("receive failed: {f}"),
            }
        }
        if start.elapsed() > deadline {
            bail!("timed out: {done} done, {notes} notified of {iters}");
        }
    }
    Ok(start.elapsed())
}

fn report(what: &str, len: usize, iters: usize, t: Duration) {
    let per = t.as_secs_f64() / iters as f64;
    println!(
        "{what:<28} {len:>10} B  {iters:>6} msgs  {:>9.3} us/msg  {:>9.2} GB/s",
        per * 1e6,
        len as f64 / per / 1e9
    );
}

// ---------------------------------------------------------------- null provider

type Queue = Arc<Mutex<VecDeque<Completion>>>;

/// Completes every write at once into its own CQ, and its immediate into the peer's.
#[derive(Debug)]
struct NullQp {
    num: u32,
    cq: Queue,
    peer_num: u32,
    peer_cq: Queue,
    peer_recvs: VecDeque<u64>,
}

impl QpOps for NullQp {
    fn qp_num(&self) -> u32 {
        self.num
    }
    fn post_send(&mut self, wr: &WorkRequest) -> ibverbx::Result<()> {
        self.post_sends(std::slice::from_ref(wr))
    }
    fn post_sends(&mut self, wrs: &[WorkRequest]) -> ibverbx::Result<()> {
        let mut mine = self.cq.lock().unwrap();
        let mut peer = self.peer_cq.lock().unwrap();
        for w in wrs {
            if let Some(imm) = w.imm {
                // The peer reposts what it consumes with the same wr_id: recycle ours.
                let rid = self.peer_recvs.pop_front().unwrap_or(0);
                self.peer_recvs.push_back(rid);
                peer.push_back(Completion {
                    wr_id: rid,
                    qp_num: self.peer_num,
                    status: WcStatus::Success,
                    opcode: WcOpcode::RecvRdmaWithImm,
                    byte_len: w.len,
                    imm: Some(imm),
                });
            }
            mine.push_back(Completion {
                wr_id: w.wr_id,
                qp_num: self.num,
                status: WcStatus::Success,
                opcode: WcOpcode::RdmaWrite,
                byte_len: 0,
                imm: None,
            });
        }
        Ok(())
    }
    fn post_recv(&mut self, _wr_id: u64) -> ibverbx::Result<()> {
        Ok(())
    }
}

#[derive(Debug)]
struct NullCq(Queue);

impl CqOps for NullCq {
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> ibverbx::Result<usize> {
        let mut q = self.0.lock().unwrap();
        let n = q.len().min(max);
        out.extend(q.drain(..n));
        Ok(n)
    }
}

#[derive(Debug)]
enum Null {}
impl Provider for Null {
    type Qp = NullQp;
    type Cq = NullCq;
}

fn bench_null(args: &Args, cfg: VqpConfig, len: usize) -> anyhow::Result<()> {
    let (qa, qb): (Queue, Queue) = Default::default();
    let mut a = Vec::new();
    let mut b = Vec::new();
    for i in 0..args.qps as u32 {
        // Receive wr_ids as the virtual QP numbers them (receive tag | QP index).
        let recvs: VecDeque<u64> = std::iter::repeat_n((1u64 << 62) | u64::from(i), 1).collect();
        a.push(NullQp {
            num: 2 * i,
            cq: qa.clone(),
            peer_num: 2 * i + 1,
            peer_cq: qb.clone(),
            peer_recvs: recvs.clone(),
        });
        b.push(NullQp {
            num: 2 * i + 1,
            cq: qb.clone(),
            peer_num: 2 * i,
            peer_cq: qa.clone(),
            peer_recvs: recvs,
        });
    }
    let mut va = VirtualCq::<Null>::new(NullCq(qa));
    let mut vb = VirtualCq::<Null>::new(NullCq(qb));
    let tx = VirtualQp::new(&mut va, a, cfg)?;
    let _rx = VirtualQp::new(&mut vb, b, cfg)?;
    let key = LocalKey {
        addr: 0x1000,
        len: len as u64,
        lkey: 1,
    };
    let rkey = RemoteKey {
        addr: 0x1000,
        len: len as u64,
        rkey: 1,
    };
    let t = run(
        &mut [&mut va, &mut vb],
        &tx,
        key,
        rkey,
        len,
        args.iters,
        args.window,
    )?;
    report("null (bookkeeping only)", len, args.iters, t);
    Ok(())
}

fn bench_soft(args: &Args, cfg: VqpConfig, len: usize, copy: bool) -> anyhow::Result<()> {
    let fabric = SoftFabric::new(SoftConfig {
        copy_data: copy,
        ..SoftConfig::default()
    });
    let (a, b) = (fabric.device("a"), fabric.device("b"));
    let (ca, cb) = (a.create_cq(), b.create_cq());
    let (qa, qb) = connect_pairs(&a, &ca, &b, &cb, args.qps)?;
    let mut va = VirtualCq::<Soft>::new(ca);
    let mut vb = VirtualCq::<Soft>::new(cb);
    let tx = VirtualQp::new(&mut va, qa, cfg)?;
    let _rx = VirtualQp::new(&mut vb, qb, cfg)?;
    let (src, dst) = (a.register(len), b.register(len));
    let t = run(
        &mut [&mut va, &mut vb],
        &tx,
        src.local_key(),
        dst.remote_key(),
        len,
        args.iters,
        args.window,
    )?;
    report(
        if copy {
            "soft (copying bytes)"
        } else {
            "soft (no copy)"
        },
        len,
        args.iters,
        t,
    );
    Ok(())
}

fn bench_verbs(args: &Args, cfg: VqpConfig, len: usize) -> anyhow::Result<()> {
    let ib = IbConfig::from_env()?;
    let list = DeviceList::get()?;
    let mut found = None;
    'dev: for d in list.iter() {
        let ctx = Context::open(&d)?;
        for port in 1..=ctx.query_device()?.phys_port_cnt {
            if ib.hca.matches(&d.name(), port) && ctx.query_port(port)?.active {
                found = Some((ctx, port));
                break 'dev;
            }
        }
    }
    let Some((ctx, port)) = found else {
        bail!(
            "no RDMA device with an active port ({}); try --soft or --null",
            ibverbx::availability().reason().unwrap_or_default()
        );
    };
    let pd = ctx.alloc_pd()?;
    let cq = CompletionQueue::new(&ctx, 8192)?;
    let gid = ctx.pick_gid_index(port, ib.gid_index)?;
    let path = PathConfig {
        gid_index: gid,
        ..ib.path
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..args.qps {
        let caps = QpCaps {
            max_send_wr: 512,
            max_recv_wr: 512,
        };
        let x = QueuePair::new(&pd, &cq, port, caps)?.to_init()?;
        let y = QueuePair::new(&pd, &cq, port, caps)?.to_init()?;
        let (ex, ey) = (x.endpoint(gid)?, y.endpoint(gid)?);
        a.push(x.to_rtr(&ey, &path)?.to_rts(&path)?);
        b.push(y.to_rtr(&ex, &path)?.to_rts(&path)?);
    }
    let mut vcq = VirtualCq::<Verbs>::new(cq);
    let tx = VirtualQp::new(&mut vcq, a, cfg)?;
    let _rx = VirtualQp::new(&mut vcq, b, cfg)?;
    let src = MemoryRegion::new(&pd, len, DEFAULT_ACCESS)?;
    let dst = MemoryRegion::new(&pd, len, DEFAULT_ACCESS)?;
    let t = run(
        &mut [&mut vcq],
        &tx,
        src.local_key(),
        dst.remote_key(),
        len,
        args.iters,
        args.window,
    )?;
    report(
        &format!("verbs loopback {}:{port}", ctx.name()),
        len,
        args.iters,
        t,
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mode: VcMode = args.mode.parse()?;
    let cfg = VqpConfig {
        chunk_bytes: parse_size(&args.chunk)? as u64,
        mode,
        max_msgs_per_qp: 128,
        ..VqpConfig::default()
    };
    println!(
        "# {} QPs, mode {mode:?}, chunk {}, window {}",
        args.qps, args.chunk, args.window
    );
    for s in &args.sizes {
        let len = parse_size(s)?;
        if args.null {
            bench_null(&args, cfg, len)?;
        }
        if args.soft {
            bench_soft(&args, cfg, len, true)?;
        }
        if args.no_copy {
            bench_soft(&args, cfg, len, false)?;
        }
        if !(args.null || args.soft || args.no_copy) {
            bench_verbs(&args, cfg, len)?;
        }
    }
    Ok(())
}
