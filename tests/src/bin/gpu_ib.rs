//! # torchcomms-gpu-ib
//!
//! GPU communicators over the ib transport on a GPU machine: two ranks as threads of this
//! process (ibverbx's software fabric reaches only ranks of one process) on cuda:0 and cuda:1
//! (both on cuda:0 with one GPU), TCP plus ib, NVLink and shared memory off, so every GPU
//! operation goes through the GPU progress engine.
//!
//! Checks: sends, receives and batches of them of at least `CTRAN_IB_GPU_DIRECT_MIN_BYTES` move
//! between the NIC and the device buffers (GPUDirect RDMA: the driver's dma-buf; the software
//! NIC copies with CUDA), counted as in place, data checked; with `CTRAN_IB_GPU_DIRECT` off the
//! same transfers stage; small sends issued before their receives on both ranks complete (the
//! stream of a staged send does not wait for its receiver); an all_reduce through the engine's
//! staging, which is registered with ib, moves in place at the transport.
//!
//! Measured (ranks 0 -> 1): a 64 MiB send in place against staged, best of 5.
//!
//! Exit status: 0 passed, 1 a check failed, 77 skipped (no CUDA here).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use ctran::bootstrap::HashStore;
use ctran::cuda::{self, Context, DeviceBuffer, RawStream, Stream};
use ctran::engine::{Engine, Issue};
use ctran::transport::ib::IbProvider;
use ctran::{Comm, CommConfig, DataType, Device, Op, P2p, ReduceOp, Span};

const TIMEOUT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    torchcomms_tests::gpu_exit("torchcomms-gpu-ib", run())
}

fn run() -> Result<bool> {
    if let Some(why) = cuda::unavailable_reason() {
        println!("SKIP: no usable CUDA here: {why}");
        return Ok(false);
    }
    let devices = cuda::driver()?.device_count as usize;
    for direct in [true, false] {
        let store = Arc::new(HashStore::new());
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|rank| {
                    let store = Arc::clone(&store);
                    s.spawn(move || rank_main(rank, rank % devices, direct, store))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a rank panicked"))
                .collect()
        });
        for (rank, r) in results.into_iter().enumerate() {
            r.with_context(|| format!("rank {rank}, GPUDirect {direct}"))?;
        }
    }
    println!("PASS gpu communicators over ib (software fabric), in place and staged");
    Ok(true)
}

struct Rank {
    engine: Engine,
    ctx: Arc<Context>,
    stream: Stream,
    rank: usize,
    direct: bool,
}

impl Rank {
    fn peer(&self) -> usize {
        1 - self.rank
    }

    /// Issues `op` on this rank's stream and waits for it.
    fn run(&self, op: Op) -> Result<()> {
        let issue = Issue {
            timeout: Some(TIMEOUT),
            stream: Some(self.stream.as_raw().0),
            ..Issue::default()
        };
        let h = self.engine.submit(op, Vec::new(), &issue)?;
        h.wait_blocking(TIMEOUT, self.rank)?;
        self.stream.as_raw().synchronize()?;
        Ok(())
    }

    /// Issues `ops` one after another on this rank's stream, then waits for all.
    fn run_all(&self, ops: Vec<Op>) -> Result<()> {
        let issue = Issue {
            timeout: Some(TIMEOUT),
            stream: Some(self.stream.as_raw().0),
            async_op: true,
            ..Issue::default()
        };
        let handles: Vec<_> = ops
            .into_iter()
            .map(|op| self.engine.submit(op, Vec::new(), &issue))
            .collect::<ctran::Result<_>>()?;
        for h in handles {
            h.wait_blocking(TIMEOUT, self.rank)?;
        }
        self.stream.as_raw().synchronize()?;
        Ok(())
    }

    fn direct_ops(&self) -> u64 {
        self.engine
            .gpe_weak()
            .and_then(|g| g.upgrade())
            .map_or(0, |g| g.direct_ops())
    }
}

fn rank_main(rank: usize, ordinal: usize, direct: bool, store: Arc<HashStore>) -> Result<()> {
    let ctx = Context::get(ordinal as u32)?;
    let mut cfg = CommConfig::from_env(format!("gpu-ib-{direct}"), rank, 2)?;
    cfg.timeout = TIMEOUT;
    cfg.use_shm = false;
    cfg.use_nvl = false;
    cfg.want_ib = true;
    cfg.ib_provider = IbProvider::Soft;
    if !direct {
        cfg.ib_gpu_direct_min_bytes = None;
    }
    let min = cfg.ib_gpu_direct_min_bytes.unwrap_or(usize::MAX);
    let comm = Comm::init(cfg, store)?;
    let engine = Engine::start(Arc::new(comm), Device::Cuda(ctx.ordinal()), false)?;
    ctx.bind()?;
    let stream = Stream::new(&ctx, false)?;
    let r = Rank {
        engine,
        ctx,
        stream,
        rank,
        direct,
    };
    let big = 8 << 20;
    ensure!(
        big >= min || !direct,
        "the checks assume {big} B moves in place"
    );
    one_way(&r, big).context("send and receive")?;
    both_ways_batch(&r, big).context("batch both ways")?;
    let expected = if direct { 2 } else { 0 };
    ensure!(
        r.direct_ops() == expected,
        "{} operations in place, expected {expected}",
        r.direct_ops()
    );
    small_sends_first(&r).context("small sends issued before their receives")?;
    ensure!(r.direct_ops() == expected, "a small transfer went in place");
    all_reduce(&r).context("all_reduce through registered staging")?;
    let moved = r.engine.comm().moved_in_place()?;
    ensure!(moved > 0, "nothing moved in place at the ib transport");
    if rank == 0 {
        println!("PASS GPUDirect {direct}: transfers in place at the transport: {moved}");
    }
    bench(&r).context("bench")?;
    r.engine.finalize()?;
    Ok(())
}

fn pattern(rank: usize, salt: usize, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u64 * 131 + rank as u64 * 17 + salt as u64 * 7) as u8)
        .collect()
}

fn device_with(ctx: &Arc<Context>, data: &[u8]) -> Result<DeviceBuffer> {
    let b = DeviceBuffer::zeroed(ctx, data.len())?;
    b.write(0, data)?;
    // A synchronous copy from pageable memory may return before its DMA ends.
    RawStream::DEFAULT.synchronize()?;
    Ok(b)
}

fn span(b: &DeviceBuffer) -> Span {
    // SAFETY: device memory named by an operation only; every check waits for its operations
    // before the buffer is dropped.
    unsafe { Span::from_raw(b.as_ptr() as *mut u8, b.len()) }
}

fn check(b: &DeviceBuffer, want: &[u8], what: &str) -> Result<()> {
    let mut got = vec![0u8; want.len()];
    b.read(0, &mut got)?;
    let bad = got.iter().zip(want).position(|(a, b)| a != b);
    ensure!(bad.is_none(), "{what}: first wrong byte at {bad:?}");
    Ok(())
}

/// This rank's half of moving `buf` from rank 0 to rank 1.
fn zero_to_one(r: &Rank, buf: &DeviceBuffer) -> Op {
    if r.rank == 0 {
        Op::Send {
            buf: span(buf),
            peer: 1,
        }
    } else {
        Op::Recv {
            buf: span(buf),
            peer: 0,
        }
    }
}

/// Rank 0 sends `len` bytes to rank 1.
fn one_way(r: &Rank, len: usize) -> Result<()> {
    let buf = if r.rank == 0 {
        device_with(&r.ctx, &pattern(0, 1, len))?
    } else {
        DeviceBuffer::zeroed(&r.ctx, len)?
    };
    r.run(zero_to_one(r, &buf))?;
    if r.rank == 1 {
        check(&buf, &pattern(0, 1, len), "received")?;
    }
    Ok(())
}

/// Both ranks send and receive `len` bytes in one batch.
fn both_ways_batch(r: &Rank, len: usize) -> Result<()> {
    let src = device_with(&r.ctx, &pattern(r.rank, 2, len))?;
    let dst = DeviceBuffer::zeroed(&r.ctx, len)?;
    let peer = r.peer();
    r.run(Op::Batch {
        ops: vec![
            P2p::Send {
                buf: span(&src),
                peer,
            },
            P2p::Recv {
                buf: span(&dst),
                peer,
            },
        ],
    })?;
    check(&dst, &pattern(peer, 2, len), "received in the batch")
}

/// Each rank issues a 4 KiB send and then the matching receive, as separate operations: the
/// send's stream must not wait for the peer's receive, which sits behind the peer's own send.
fn small_sends_first(r: &Rank) -> Result<()> {
    const LEN: usize = 4096;
    let peer = r.peer();
    for round in 0..20 {
        let src = device_with(&r.ctx, &pattern(r.rank, 10 + round, LEN))?;
        let dst = DeviceBuffer::zeroed(&r.ctx, LEN)?;
        r.run_all(vec![
            Op::Send {
                buf: span(&src),
                peer,
            },
            Op::Recv {
                buf: span(&dst),
                peer,
            },
        ])?;
        check(&dst, &pattern(peer, 10 + round, LEN), "small message")?;
    }
    Ok(())
}

/// A 1 MiB all_reduce of f32 through the engine's staging.
fn all_reduce(r: &Rank) -> Result<()> {
    const N: usize = 1 << 18;
    let mine: Vec<f32> = (0..N).map(|i| (i % 1000) as f32 + r.rank as f32).collect();
    let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
    let buf = device_with(&r.ctx, &bytes)?;
    r.run(Op::AllReduce {
        buf: span(&buf),
        dtype: DataType::F32,
        op: ReduceOp::Sum,
    })?;
    let want: Vec<u8> = (0..N)
        .flat_map(|i| (2.0 * (i % 1000) as f32 + 1.0).to_le_bytes())
        .collect();
    check(&buf, &want, "all_reduce")
}

/// Time of a 64 MiB send from rank 0 to rank 1, best of 5 after one warm-up.
fn bench(r: &Rank) -> Result<()> {
    const LEN: usize = 64 << 20;
    let buf = DeviceBuffer::zeroed(&r.ctx, LEN)?;
    let mut best = f64::MAX;
    for i in 0..6 {
        let t0 = Instant::now();
        r.run(zero_to_one(r, &buf))?;
        if i > 0 {
            best = best.min(t0.elapsed().as_secs_f64());
        }
    }
    if r.rank == 1 {
        let how = if r.direct { "in place" } else { "staged" };
        println!(
            "64 MiB send cuda:0 -> cuda:{} over ib (software fabric), {how}: {:.2} ms",
            r.ctx.ordinal(),
            best * 1e3
        );
    }
    Ok(())
}
