//! # torchcomms-gpu-window
//!
//! One-sided windows over NVLink on a GPU machine, one process per GPU (`GPU_TEST_NRANKS=N`
//! limits it to N): the engine's windows (`ctran::nvl::window`) checked and measured.
//!
//! Checks: a ring of put + signal / wait_signal for 1,000 iterations, data checked at every
//! one; every rank putting into its slot of every rank's window at once; the same ring captured
//! in a CUDA graph and replayed; bad input (a put past the end, a rank out of range) and windows
//! whose sizes differ, failing on every rank.
//!
//! Measurements (ranks 0 and 1): put bandwidth of 256 MiB against `cuMemcpyPeerAsync` between
//! the same two GPUs in one process (measured by the parent before the ranks start) and against
//! a plain copy to the same mapped address; put + signal ping-pong latency per direction,
//! eager and replayed from a CUDA graph.
//!
//! Exit status: 0 passed, 1 a check failed, 77 skipped (fewer than 2 GPUs or no CUDA here).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use ctran::bootstrap::rendezvous;
use ctran::cuda::{self, CaptureMode, Context, DeviceBuffer, RawStream, Stream};
use ctran::engine::Engine;
use ctran::nvl::window::NvlWindow;
use ctran::{Comm, CommConfig, Device, Op};

const TIMEOUT: Duration = Duration::from_secs(60);
/// Windows of the checks: CUDA IPC exports allocations of at least 2 MiB.
const WIN_BYTES: usize = 4 << 20;
const BENCH_BYTES: usize = 256 << 20;

fn main() -> ExitCode {
    let r = match std::env::var("TORCHCOMM_RANK") {
        Ok(_) => rank_main().map(|()| true),
        Err(_) => parent_main(),
    };
    torchcomms_tests::gpu_exit("torchcomms-gpu-window", r)
}

fn parent_main() -> Result<bool> {
    if let Some(why) = cuda::unavailable_reason() {
        println!("SKIP: no usable CUDA here: {why}");
        return Ok(false);
    }
    let count = cuda::driver()?.device_count as usize;
    let n: usize = std::env::var("GPU_TEST_NRANKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(count);
    if n < 2 || count < 2 {
        println!("SKIP: windows over NVLink need 2 GPUs ({count} here)");
        return Ok(false);
    }
    let peer_copy = peer_copy_gbps()?;
    println!("cuMemcpyPeerAsync 256 MiB cuda:0 -> cuda:1: {peer_copy:.1} GB/s");
    let env = [("GPU_WINDOW_PEER_COPY_GBPS", format!("{peer_copy}"))];
    torchcomms_tests::run_self_as_ranks(n, &env)?;
    println!("PASS windows: {n} processes");
    Ok(true)
}

/// `cuMemcpyPeerAsync` of 256 MiB from GPU 0 to GPU 1 in this process, in GB/s.
fn peer_copy_gbps() -> Result<f64> {
    let (c0, c1) = (Context::get(0)?, Context::get(1)?);
    c0.enable_peer_access(&c1)?;
    c1.enable_peer_access(&c0)?;
    let src = DeviceBuffer::zeroed(&c0, BENCH_BYTES)?;
    let dst = DeviceBuffer::zeroed(&c1, BENCH_BYTES)?;
    c0.bind()?;
    let s = Stream::new(&c0, false)?;
    let copy = || {
        // SAFETY: both buffers hold BENCH_BYTES and outlive the synchronize below.
        unsafe {
            cuda::copy_peer_async(
                dst.as_ptr(),
                &c1,
                src.as_ptr(),
                &c0,
                BENCH_BYTES,
                s.as_raw(),
            )
        }
    };
    time_gbps(s.as_raw(), BENCH_BYTES, copy)
}

/// Bandwidth of `op` (moving `bytes`) on `stream`: 3 warm-up runs, then the best of 3 rounds
/// of 10.
fn time_gbps(
    stream: RawStream,
    bytes: usize,
    op: impl Fn() -> cuda::error::Result<()>,
) -> Result<f64> {
    for _ in 0..3 {
        op()?;
    }
    stream.synchronize()?;
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        for _ in 0..10 {
            op()?;
        }
        stream.synchronize()?;
        best = best.min(t0.elapsed().as_secs_f64() / 10.0);
    }
    Ok(bytes as f64 / best / 1e9)
}

struct Rank {
    engine: Engine,
    ctx: Arc<Context>,
    stream: Stream,
    rank: usize,
    n: usize,
}

impl Rank {
    fn barrier(&self) -> Result<()> {
        self.engine.comm().run(Op::Barrier, Some(TIMEOUT))?;
        Ok(())
    }

    fn s(&self) -> RawStream {
        self.stream.as_raw()
    }

    fn pass(&self, what: &str) {
        if self.rank == 0 {
            println!("PASS {what}");
        }
    }

    fn window(&self, buf: &DeviceBuffer, len: usize) -> Result<NvlWindow> {
        let nvl = self.engine.nvl().context("the NVLink transport is off")?;
        Ok(nvl.new_window(buf.as_ptr(), len, TIMEOUT)?)
    }
}

fn rank_main() -> Result<()> {
    let rank: usize = std::env::var("TORCHCOMM_RANK")?.parse()?;
    let n: usize = std::env::var("TORCHCOMM_SIZE")?.parse()?;
    let devices = cuda::driver()?.device_count as usize;
    let ctx = Context::get((rank % devices) as u32)?;
    let config = CommConfig::from_env("gpu-window", rank, n)?;
    let boot = rendezvous::store_from_env(rank, n, TIMEOUT)?;
    let comm = Comm::init(config, Arc::clone(boot.store()))?;
    comm.run(Op::Barrier, Some(TIMEOUT))?;
    drop(boot);
    let engine = Engine::start(Arc::new(comm), Device::Cuda(ctx.ordinal()), false)?;
    ctx.bind()?;
    let stream = Stream::new(&ctx, false)?;
    let r = Rank {
        engine,
        ctx,
        stream,
        rank,
        n,
    };
    ring(&r, false).context("ring")?;
    r.pass("ring of put + signal / wait_signal, 1000 iterations, checked at each");
    disjoint(&r).context("disjoint")?;
    r.pass("every rank puts into its slot of every rank's window at once");
    ring(&r, true).context("ring in a CUDA graph")?;
    r.pass("put + signal / wait_signal captured in a CUDA graph and replayed 20 times");
    bad_input(&r).context("bad input")?;
    r.pass("bad input and windows of different sizes fail on every rank");
    bench(&r).context("bench")?;
    r.barrier()?;
    r.engine.finalize()?;
    Ok(())
}

fn u32s(v: impl Iterator<Item = u32>) -> Vec<u8> {
    v.flat_map(u32::to_le_bytes).collect()
}

fn read_u32s(buf: &DeviceBuffer, offset: usize, n: usize) -> Result<Vec<u32>> {
    let mut b = vec![0u8; 4 * n];
    buf.read(offset, &mut b)?;
    Ok(b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4")))
        .collect())
}

/// Each iteration puts into the next rank's window (alternating halves), signals it and waits
/// for the previous rank; every second one, once the data was checked, also signals back, so
/// no rank overwrites a half its successor has not checked. `graph`: 20 iterations captured
/// once and replayed 20 times.
fn ring(r: &Rank, graph: bool) -> Result<()> {
    const N: usize = 64;
    let win_buf = DeviceBuffer::zeroed(&r.ctx, WIN_BYTES)?;
    let win = r.window(&win_buf, WIN_BYTES)?;
    let src = DeviceBuffer::zeroed(&r.ctx, 4 * N)?;
    let (dst, prev) = ((r.rank + 1) % r.n, (r.rank + r.n - 1) % r.n);
    let step = |it: usize| -> Result<()> {
        let half = it % 2;
        // Odd iterations: the put carries its signal; even ones signal on their own.
        win.put(
            src.as_ptr(),
            4 * N,
            dst,
            half * 4 * N,
            half == 1,
            r.s(),
            Vec::new(),
            TIMEOUT,
        )?;
        if half == 0 {
            win.signal(dst, r.s(), TIMEOUT)?;
        }
        win.wait_signal(prev, r.s(), TIMEOUT)?;
        Ok(())
    };
    let back = |it: usize| -> Result<()> {
        if it % 2 == 1 {
            win.signal(prev, r.s(), TIMEOUT)?;
            win.wait_signal(dst, r.s(), TIMEOUT)?;
        }
        Ok(())
    };
    // A synchronous copy from pageable memory may return before its DMA ends: wait for the
    // legacy stream it runs on before a kernel reads the source.
    let fill = |v: usize| -> Result<()> {
        src.write(0, &u32s((0..N).map(|_| v as u32)))?;
        RawStream::DEFAULT.synchronize()?;
        Ok(())
    };
    if !graph {
        for it in 0..1000 {
            fill(it * 1000 + r.rank)?;
            step(it)?;
            r.s().synchronize()?;
            let got = read_u32s(&win_buf, (it % 2) * 4 * N, N)?;
            let want = (it * 1000 + prev) as u32;
            ensure!(
                got.iter().all(|&v| v == want),
                "iteration {it}: got {:?}, want {want}",
                &got[..4]
            );
            back(it)?;
        }
    } else {
        fill(7000 + r.rank)?;
        cuda::graph::begin_capture(&r.ctx, r.s(), CaptureMode::Global)?;
        let captured = (0..20).try_for_each(|it| step(it).and_then(|()| back(it)));
        let g = cuda::graph::end_capture(&r.ctx, r.s())?;
        captured?;
        for _ in 0..20 {
            g.launch(r.s())?;
        }
        r.s().synchronize()?;
        for half in 0..2 {
            let got = read_u32s(&win_buf, half * 4 * N, N)?;
            ensure!(
                got.iter().all(|&v| v == (7000 + prev) as u32),
                "graph: half {half} holds {:?}",
                &got[..4]
            );
        }
    }
    r.barrier()
}

/// Copy-engine puts (above the small-put size), half of them carrying their signal.
fn disjoint(r: &Rank) -> Result<()> {
    const N: usize = 40_000;
    let win_buf = DeviceBuffer::zeroed(&r.ctx, WIN_BYTES)?;
    let win = r.window(&win_buf, WIN_BYTES)?;
    let srcs: Vec<DeviceBuffer> = (0..r.n)
        .map(|d| DeviceBuffer::from_host(&r.ctx, &u32s((0..N).map(|_| (r.rank * 100 + d) as u32))))
        .collect::<cuda::error::Result<_>>()?;
    RawStream::DEFAULT.synchronize()?; // the copies from pageable memory have landed
    for (d, s) in srcs.iter().enumerate() {
        win.put(
            s.as_ptr(),
            4 * N,
            d,
            r.rank * 4 * N,
            d % 2 == 1,
            r.s(),
            Vec::new(),
            TIMEOUT,
        )?;
    }
    for d in (0..r.n).step_by(2) {
        win.signal(d, r.s(), TIMEOUT)?;
    }
    for q in 0..r.n {
        win.wait_signal(q, r.s(), TIMEOUT)?;
    }
    r.s().synchronize()?;
    for q in 0..r.n {
        let got = read_u32s(&win_buf, q * 4 * N, N)?;
        let want = (q * 100 + r.rank) as u32;
        ensure!(
            got.iter().all(|&v| v == want),
            "slot of rank {q}: {:?}, want {want}",
            &got[..4]
        );
    }
    r.barrier()
}

fn bad_input(r: &Rank) -> Result<()> {
    let win_buf = DeviceBuffer::zeroed(&r.ctx, WIN_BYTES)?;
    let win = r.window(&win_buf, WIN_BYTES)?;
    let src = DeviceBuffer::zeroed(&r.ctx, 4096)?;
    let peer = (r.rank + 1) % r.n;
    let e = win
        .put(
            src.as_ptr(),
            4096,
            peer,
            WIN_BYTES - 4095,
            false,
            r.s(),
            Vec::new(),
            TIMEOUT,
        )
        .err()
        .context("a put past the end of the window succeeded")?;
    ensure!(
        e.to_string().contains("target_offset_nelems"),
        "put past the end: {e}"
    );
    let e = win
        .signal(r.n, r.s(), TIMEOUT)
        .err()
        .context("signal to a rank out of range")?;
    ensure!(
        e.to_string().contains("peer_rank"),
        "signal out of range: {e}"
    );
    drop(win);
    r.barrier()?;
    // Every rank a different size: all fail, naming the sizes.
    let e = r
        .window(&win_buf, WIN_BYTES - 4 * r.rank)
        .err()
        .context("windows of different sizes were made")?;
    ensure!(
        e.to_string().contains("same size"),
        "sizes that differ: {e}"
    );
    r.barrier()
}

fn bench(r: &Rank) -> Result<()> {
    let win_buf = DeviceBuffer::zeroed(&r.ctx, BENCH_BYTES)?;
    let win = r.window(&win_buf, BENCH_BYTES)?;
    let src = DeviceBuffer::zeroed(&r.ctx, BENCH_BYTES)?;
    r.barrier()?;
    if r.rank == 0 {
        let put = time_gbps(r.s(), BENCH_BYTES, || {
            win.put(
                src.as_ptr(),
                BENCH_BYTES,
                1,
                0,
                false,
                r.s(),
                Vec::new(),
                TIMEOUT,
            )
            .map(drop)
            .map_err(|e| cuda::CudaError::BadArgument {
                call: "put",
                detail: e.to_string(),
            })
        })?;
        let base = win.base(1).context("rank 1's window")?;
        // SAFETY: rank 1's window is mapped here and holds BENCH_BYTES; src too.
        let copy = time_gbps(r.s(), BENCH_BYTES, || unsafe {
            cuda::copy_async(base, src.as_ptr(), BENCH_BYTES, r.s())
        })?;
        let peer: f64 = std::env::var("GPU_WINDOW_PEER_COPY_GBPS")?.parse()?;
        println!(
            "BENCH put 256 MiB rank 0 -> 1: window put {put:.1} GB/s, copy to the mapped window \
             {copy:.1} GB/s, cuMemcpyPeerAsync {peer:.1} GB/s; put / cuMemcpyPeerAsync {:.3}",
            put / peer
        );
    }
    r.barrier()?;
    // Ping-pong of 8-byte put + signal between ranks 0 and 1.
    let small = DeviceBuffer::zeroed(&r.ctx, 8)?;
    let pingpong = |iters: usize| -> Result<()> {
        for _ in 0..iters {
            if r.rank == 0 {
                win.put(small.as_ptr(), 8, 1, 0, true, r.s(), Vec::new(), TIMEOUT)?;
                win.wait_signal(1, r.s(), TIMEOUT)?;
            } else if r.rank == 1 {
                win.wait_signal(0, r.s(), TIMEOUT)?;
                win.put(small.as_ptr(), 8, 0, 0, true, r.s(), Vec::new(), TIMEOUT)?;
            }
        }
        Ok(())
    };
    pingpong(100)?;
    r.s().synchronize()?;
    r.barrier()?;
    let t0 = Instant::now();
    pingpong(1000)?;
    r.s().synchronize()?;
    let eager = t0.elapsed().as_secs_f64() / 2000.0 * 1e6;
    r.barrier()?;
    cuda::graph::begin_capture(&r.ctx, r.s(), CaptureMode::Global)?;
    let captured = pingpong(100);
    let g = cuda::graph::end_capture(&r.ctx, r.s())?;
    captured?;
    g.launch(r.s())?;
    r.s().synchronize()?;
    r.barrier()?;
    let t0 = Instant::now();
    for _ in 0..10 {
        g.launch(r.s())?;
    }
    r.s().synchronize()?;
    let graphed = t0.elapsed().as_secs_f64() / 2000.0 * 1e6;
    if r.rank == 0 {
        println!(
            "BENCH put + signal ping-pong, 8 bytes, ranks 0 <-> 1: {graphed:.2} us per direction \
             (CUDA graph), {eager:.2} us (eager, issued from the host)"
        );
    }
    r.barrier()
}
