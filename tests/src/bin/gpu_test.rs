//! # torchcomms-gpu-test
//!
//! GPU checks of the CUDA layer and of the `nccl` backend, run from a prebuilt binary on a GPU
//! machine (`scripts/gpu-test.sh`). Without a driver or a GPU it prints why and exits 77.
//!
//! 1. Environment: driver, devices, NVRTC and NCCL (versions and where they were found).
//! 2. Kernels: every (dtype, op) of `cuda/src/kernels/reduce.cu` against the CPU kernels,
//!    bit for bit (combine, prescale, finish), and the kernel cache.
//! 3. Ranks (one process per GPU, needs 2 GPUs): all_gather_v, reduce_scatter_v, all_to_all_v,
//!    stream semantics (an op runs after the caller's stream, `wait()` orders the caller's
//!    stream after it without blocking the host), `is_completed`, split, abort on timeout with
//!    the error reported on every rank.
//!
//! The every op × dtype × reduce-op suite is `torchcomms-perf --device cuda --backend nccl -c 1`.
//! Exit status (also printed by `--help`): see [`USAGE`].

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use ctran::cuda::{self, CaptureMode, Context, DeviceBuffer, RawStream, ReduceKernels, Stream};
use ctran::kernels::Reducer;
use ctran::{DataType, Device, ReduceOp};
use torchcomms::{new_comm, CommOptions, OpOptions, Tensor, TorchComm};
use torchcomms_nccl as nccl;

/// What `--help` prints.
const USAGE: &str = "\
usage: torchcomms-gpu-test   (no arguments; GPU_TEST_NRANKS=N limits the rank tests to N GPUs)

GPU checks of the CUDA layer and of the nccl backend: environment, the NVRTC reduction kernels
against the CPU kernels, and (with 2 or more GPUs) the rank tests, one process per GPU.

exit status:
  0   every check that ran passed (with fewer than 2 GPUs the rank tests print SKIP and the
      kernel checks alone decide)
  1   a check failed
  77  skipped: no usable CUDA here (no driver, or no device), nothing was tested; the
      automake convention for SKIP, so that a skip is never read as a pass
";

/// Exit status of a run that tested nothing because there is no usable CUDA here.
const EXIT_SKIPPED: u8 = 77;

/// How a run that did not fail ended.
enum Outcome {
    /// Checks ran and passed.
    Passed,
    /// Nothing could be tested here.
    Skipped,
}

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let r = match std::env::var("TORCHCOMM_RANK") {
        Ok(_) => rank_main().map(|()| Outcome::Passed),
        Err(_) => parent_main(),
    };
    match r {
        Ok(Outcome::Passed) => ExitCode::SUCCESS,
        Ok(Outcome::Skipped) => {
            println!("torchcomms-gpu-test: SKIPPED (exit status {EXIT_SKIPPED}): nothing tested");
            ExitCode::from(EXIT_SKIPPED)
        }
        Err(e) => {
            eprintln!("torchcomms-gpu-test: FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn parent_main() -> Result<Outcome> {
    if let Some(why) = cuda::unavailable_reason() {
        println!("SKIP: no usable CUDA here: {why}");
        return Ok(Outcome::Skipped);
    }
    let d = cuda::driver()?;
    println!(
        "driver: CUDA {}.{} ({}), {} device(s)",
        d.version / 1000,
        (d.version % 1000) / 10,
        d.path.display(),
        d.device_count
    );
    for i in 0..d.device_count {
        let c = Context::get(i)?;
        let (total, _) = c.mem_info()?;
        println!(
            "  cuda:{i} {} sm_{}{} {} SMs {:.0} GiB",
            c.name(),
            c.compute_capability().0,
            c.compute_capability().1,
            c.sm_count(),
            total as f64 / (1u64 << 30) as f64
        );
    }
    match cuda::nvrtc::nvrtc() {
        Ok(n) => println!(
            "nvrtc: {}.{} ({})",
            n.version.0,
            n.version.1,
            n.path.display()
        ),
        Err(e) => println!("nvrtc: unavailable: {e}"),
    }
    match (nccl::nccl_version(), nccl::nccl_path()) {
        (Ok(v), Ok(p)) => println!("nccl: {v} ({})", p.display()),
        (Err(e), _) | (_, Err(e)) => println!("nccl: unavailable: {e}"),
    }
    kernels_test()?;
    let n: usize = std::env::var("GPU_TEST_NRANKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d.device_count as usize);
    if n < 2 {
        println!("SKIP ranks: {n} GPU(s); the rank tests need 2");
        return Ok(Outcome::Passed);
    }
    launch(n).map(|()| Outcome::Passed)
}

// ---------------------------------------------------------------------------------------------
// Kernels against the CPU reducer.

/// Deterministic test values: small integers and halves, negative ones, and for floats some
/// fractions, so rounding of f16/bf16 is exercised.
fn value(dtype: DataType, i: usize, salt: usize) -> f64 {
    let k = (i * 7 + salt * 13) % 23;
    match dtype {
        DataType::Bool => (k % 3 != 0) as u8 as f64,
        DataType::U8 => k as f64,
        d if d.is_float() => (k as f64 - 11.0) * 0.37 + (i % 5) as f64 * 1e-3,
        _ => k as f64 - 11.0,
    }
}

fn encode(dtype: DataType, vals: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(vals.len() * dtype.size_bytes());
    for &v in vals {
        match dtype {
            DataType::F16 => out.extend(half::f16::from_f64(v).to_le_bytes()),
            DataType::BF16 => out.extend(half::bf16::from_f64(v).to_le_bytes()),
            DataType::F32 => out.extend((v as f32).to_le_bytes()),
            DataType::F64 => out.extend(v.to_le_bytes()),
            DataType::I8 => out.push(v as i8 as u8),
            DataType::U8 | DataType::Bool => out.push(v as u8),
            DataType::I32 => out.extend((v as i32).to_le_bytes()),
            _ => out.extend((v as i64).to_le_bytes()),
        }
    }
    out
}

fn kernels_test() -> Result<()> {
    let ctx = Context::get(0)?;
    let t0 = Instant::now();
    let k = ReduceKernels::get(&ctx).context("compiling the reduction kernels")?;
    println!(
        "kernels: {} for {} in {:.0} ms ({}), cache {}",
        cuda::kernels::REDUCE_SOURCE_NAME,
        k.target(),
        t0.elapsed().as_secs_f64() * 1e3,
        if k.from_cache() {
            "from the disk cache"
        } else {
            "compiled by NVRTC"
        },
        cuda::nvrtc::cache_dir().map_or("off".into(), |d| d.display().to_string())
    );
    let n = 1000 + 37; // not a multiple of any block size
    let mut checked = 0;
    for dtype in DataType::ALL {
        for op in ReduceOp::ALL {
            let nranks = 3;
            let Ok(red) = Reducer::new(dtype, op, nranks) else {
                continue;
            };
            let a: Vec<f64> = (0..n).map(|i| value(dtype, i, 1)).collect();
            let b: Vec<f64> = (0..n).map(|i| value(dtype, i, 2)).collect();
            let (ab, bb) = (encode(dtype, &a), encode(dtype, &b));
            // CPU: prescale both, combine, finish.
            let (mut pa, mut pb) = (ab.clone(), bb.clone());
            red.prescale_in_place(&mut pa);
            red.prescale_in_place(&mut pb);
            let mut want = vec![0u8; ab.len()];
            red.combine3(&mut want, &pa, &pb);
            red.finish(&mut want);
            // GPU: the same steps.
            let ga = DeviceBuffer::from_host(&ctx, &ab)?;
            let gb = DeviceBuffer::from_host(&ctx, &bb)?;
            let out = DeviceBuffer::zeroed(&ctx, ab.len())?;
            let s = RawStream::DEFAULT;
            // SAFETY: every buffer holds n elements and outlives the synchronous read below.
            unsafe {
                k.prescale(dtype, op, nranks, ga.as_ptr(), n, s)?;
                k.prescale(dtype, op, nranks, gb.as_ptr(), n, s)?;
                k.combine(dtype, op, out.as_ptr(), ga.as_ptr(), gb.as_ptr(), n, s)?;
                k.finish(dtype, op, nranks, out.as_ptr(), n, s)?;
            }
            let mut got = vec![0u8; ab.len()];
            out.read(0, &mut got)?;
            if got != want {
                let e = dtype.size_bytes();
                let i = (0..n)
                    .find(|&i| got[i * e..(i + 1) * e] != want[i * e..(i + 1) * e])
                    .unwrap_or(0);
                bail!(
                    "kernel {} {dtype}: element {i} is {:?}, the CPU gives {:?}",
                    op.name(),
                    &got[i * e..(i + 1) * e],
                    &want[i * e..(i + 1) * e]
                );
            }
            checked += 1;
        }
    }
    ensure!(checked > 60, "only {checked} kernel combinations ran");
    println!("PASS kernels: {checked} (dtype, op) pairs equal to the CPU kernels bit for bit");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Ranks.

fn launch(n: usize) -> Result<()> {
    let env = [("TORCHCOMM_ABORT_ON_ERROR", "0".to_string())];
    torchcomms_tests::run_self_as_ranks(n, &env)?;
    println!("PASS ranks: {n} processes");
    Ok(())
}

/// A device tensor of `vals` (as `dtype`), owning its memory.
fn dev_tensor(ctx: &Arc<Context>, dtype: DataType, vals: &[f64]) -> Result<Tensor> {
    let b = DeviceBuffer::from_host(ctx, &encode(dtype, vals))?;
    let p = b.as_ptr() as usize as *mut u8;
    // SAFETY: the buffer holds vals.len() elements and is the tensor's owner.
    Ok(
        unsafe { Tensor::from_raw(p, vals.len(), dtype, Device::Cuda(ctx.ordinal())) }
            .with_owner(Arc::new(b)),
    )
}

/// The device buffer that owns a tensor made by dev_tensor.
fn buf(t: &Tensor) -> Result<&DeviceBuffer> {
    (**t.owner().context("owner")?)
        .downcast_ref::<DeviceBuffer>()
        .context("not a DeviceBuffer")
}

/// The f32 elements of a device tensor made by dev_tensor.
fn read_f32(t: &Tensor) -> Result<Vec<f32>> {
    let b = (**t.owner().context("owner")?)
        .downcast_ref::<DeviceBuffer>()
        .context("not a DeviceBuffer")?;
    let mut bytes = vec![0u8; t.nbytes()];
    b.read(t.addr() - b.as_ptr() as usize, &mut bytes)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

struct Rank {
    comm: TorchComm,
    ctx: Arc<Context>,
    rank: usize,
    n: usize,
}

impl Rank {
    fn say(&self, what: &str) {
        if self.rank == 0 {
            println!("PASS {what}");
        }
    }
}

fn rank_main() -> Result<()> {
    let rank: usize = std::env::var("TORCHCOMM_RANK")?.parse()?;
    let n = cuda::driver()?.device_count as usize;
    let ctx = Context::get((rank % n) as u32)?;
    let mut opts = CommOptions::from_env()?;
    opts.timeout = Duration::from_secs(60);
    opts.high_priority_stream = true;
    let comm = new_comm("nccl", Device::Cuda(ctx.ordinal()), "gpu-test", opts)?;
    let r = Rank {
        n: comm.get_size(),
        comm,
        ctx,
        rank,
    };
    if rank == 0 {
        println!("ranks: {} on {}", r.n, r.comm.get_backend_version()?);
    }
    v_ops(&r).context("v ops")?;
    stream_semantics(&r).context("stream semantics")?;
    graph_capture(&r).context("CUDA graph capture and replay")?;
    split(&r).context("split")?;
    abort_on_timeout(&r).context("abort on timeout")?;
    Ok(())
}

fn v_ops(r: &Rank) -> Result<()> {
    let (me, n) = (r.rank, r.n);
    let sync = OpOptions::sync();
    // all_gather_v: rank p contributes p + 1 elements of value 100 p + i.
    let input: Vec<f64> = (0..=me).map(|i| (100 * me + i) as f64).collect();
    let inp = dev_tensor(&r.ctx, DataType::F32, &input)?;
    let outs: Vec<Tensor> = (0..n)
        .map(|p| dev_tensor(&r.ctx, DataType::F32, &vec![-1.0; p + 1]))
        .collect::<Result<_>>()?;
    r.comm.all_gather_v(&outs, &inp, &sync)?.wait()?;
    for (p, o) in outs.iter().enumerate() {
        let want: Vec<f32> = (0..=p).map(|i| (100 * p + i) as f32).collect();
        ensure!(read_f32(o)? == want, "all_gather_v block {p}");
    }
    r.say("all_gather_v (uneven blocks, grouped broadcasts)");
    // reduce_scatter_v: block p has p + 2 elements; every rank sends (rank + 1) * (i + 1).
    let ins: Vec<Tensor> = (0..n)
        .map(|p| {
            let v: Vec<f64> = (0..p + 2).map(|i| ((me + 1) * (i + 1)) as f64).collect();
            dev_tensor(&r.ctx, DataType::F32, &v)
        })
        .collect::<Result<_>>()?;
    let out = dev_tensor(&r.ctx, DataType::F32, &vec![0.0; me + 2])?;
    r.comm
        .reduce_scatter_v(&out, &ins, ReduceOp::Sum, &sync)?
        .wait()?;
    let total: usize = (1..=n).sum();
    let want: Vec<f32> = (0..me + 2).map(|i| (total * (i + 1)) as f32).collect();
    ensure!(read_f32(&out)? == want, "reduce_scatter_v");
    r.say("reduce_scatter_v (uneven blocks, grouped reduces)");
    // all_to_all_v: rank s sends s + d + 1 elements of value 1000 s + d to rank d.
    let in_splits: Vec<usize> = (0..n).map(|d| me + d + 1).collect();
    let out_splits: Vec<usize> = (0..n).map(|s| s + me + 1).collect();
    let iv: Vec<f64> = (0..n)
        .flat_map(|d| std::iter::repeat_n((1000 * me + d) as f64, me + d + 1))
        .collect();
    let inp = dev_tensor(&r.ctx, DataType::F32, &iv)?;
    let out = dev_tensor(&r.ctx, DataType::F32, &vec![0.0; out_splits.iter().sum()])?;
    r.comm
        .all_to_all_v_single(&out, &inp, &out_splits, &in_splits, &sync)?
        .wait()?;
    let want: Vec<f32> = (0..n)
        .flat_map(|s| std::iter::repeat_n((1000 * s + me) as f32, s + me + 1))
        .collect();
    ensure!(read_f32(&out)? == want, "all_to_all_v_single");
    r.say("all_to_all_v_single (uneven splits, grouped send/recv)");
    Ok(())
}

fn stream_semantics(r: &Rank) -> Result<()> {
    let n = 1 << 22; // 16 MB of f32: long enough to still run when wait() returns
    let caller = Stream::new(&r.ctx, false)?;
    let cs = caller.as_raw();
    let k = ReduceKernels::get(&r.ctx)?;
    let x = dev_tensor(&r.ctx, DataType::F32, &vec![(r.rank + 1) as f64; n])?;
    let xp = x.addr() as u64;
    // On the caller's stream: x = x + x; all_reduce(x); x = x + x. Only stream order makes
    // the result 4 * sum(rank + 1).
    // SAFETY: x holds n f32 and outlives the stream synchronisation below.
    unsafe { k.combine(DataType::F32, ReduceOp::Sum, xp, xp, xp, n, cs)? };
    let opts = OpOptions::async_op().with_stream(cs.0);
    let t = Instant::now();
    let w = r.comm.all_reduce(&x, ReduceOp::Sum, &opts)?;
    w.wait()?;
    let host_wait = t.elapsed();
    // SAFETY: as above.
    unsafe { k.combine(DataType::F32, ReduceOp::Sum, xp, xp, xp, n, cs)? };
    let sum: usize = (1..=r.n).sum();
    cs.synchronize()?;
    let got = read_f32(&x)?;
    let want = (4 * sum) as f32;
    ensure!(
        got.iter().all(|&v| v == want),
        "stream order: got {} want {want}",
        got[0]
    );
    ensure!(w.is_completed(), "is_completed() after the stream finished");
    w.wait_blocking()?;
    r.say(&format!(
        "stream semantics: op after the caller's stream, caller's stream after the op \
         (wait() returned in {:.0} us)",
        host_wait.as_secs_f64() * 1e6
    ));
    // wait_blocking on a sync op on the default stream.
    let y = dev_tensor(&r.ctx, DataType::F32, &vec![1.0; 1024])?;
    let w = r
        .comm
        .all_reduce(&y, ReduceOp::Sum, &OpOptions::async_op())?;
    w.wait_blocking()?;
    ensure!(w.is_completed(), "is_completed after wait_blocking");
    ensure!(
        read_f32(&y)?.iter().all(|&v| v == r.n as f32),
        "default stream all_reduce"
    );
    r.say("wait_blocking / is_completed on the default stream");
    Ok(())
}

/// Captures collectives issued on the caller's stream into a CUDA graph (global mode, like
/// `torch.cuda.graph`), then replays it three times with new inputs: each replay must compute
/// on the inputs of its own time, and nothing may run at capture time.
fn graph_capture(r: &Rank) -> Result<()> {
    let (me, n) = (r.rank, r.n);
    let len = 1 << 16;
    let caller = Stream::new(&r.ctx, false)?;
    let cs = caller.as_raw();
    let x = dev_tensor(&r.ctx, DataType::F32, &vec![-7.0; len])?;
    let gathered: Vec<Tensor> = (0..n)
        .map(|_| dev_tensor(&r.ctx, DataType::F32, &[0.0; 4]))
        .collect::<Result<_>>()?;
    let mine = dev_tensor(&r.ctx, DataType::F32, &[0.0; 4])?;
    let sync = OpOptions::sync().with_stream(cs.0);
    // Warm up outside the capture (NCCL connects lazily), as PyTorch users do.
    r.comm.all_reduce(&x, ReduceOp::Sum, &sync)?.wait()?;
    cs.synchronize()?;
    cuda::begin_capture(&r.ctx, cs, CaptureMode::Global)?;
    let issued = (|| -> Result<()> {
        r.comm.all_reduce(&x, ReduceOp::Sum, &sync)?.wait()?;
        let w = r
            .comm
            .all_gather(&gathered, &mine, &OpOptions::async_op().with_stream(cs.0))?;
        w.wait()?;
        Ok(())
    })();
    let graph = cuda::end_capture(&r.ctx, cs);
    issued?;
    let graph = graph?;
    ensure!(
        read_f32(&x)?.iter().all(|&v| v == -7.0 * n as f32),
        "the capture ran the all_reduce (or the warm-up was wrong)"
    );
    for replay in 0..3usize {
        let v = (me + 1 + 10 * replay) as f64;
        buf(&x)?.write(0, &encode(DataType::F32, &vec![v; len]))?;
        buf(&mine)?.write(0, &encode(DataType::F32, &[(100 * me + replay) as f64; 4]))?;
        graph.launch(cs)?;
        cs.synchronize()?;
        let want: f64 = (0..n).map(|p| (p + 1 + 10 * replay) as f64).sum();
        let got = read_f32(&x)?;
        ensure!(
            got.iter().all(|&g| g == want as f32),
            "replay {replay}: all_reduce gave {} want {want}",
            got[0]
        );
        for (p, g) in gathered.iter().enumerate() {
            ensure!(
                read_f32(g)? == vec![(100 * p + replay) as f32; 4],
                "replay {replay}: all_gather block {p}"
            );
        }
    }
    r.say("CUDA graph: all_reduce + async all_gather captured (global mode), 3 replays with new inputs");
    Ok(())
}

fn split(r: &Rank) -> Result<()> {
    // All ranks, in reverse order: the child's rank is the position in the list.
    let rev: Vec<usize> = (0..r.n).rev().collect();
    let child = r
        .comm
        .split(&rev, "reversed", None)?
        .context("a member got no communicator")?;
    ensure!(child.get_rank() == r.n - 1 - r.rank, "child rank");
    let t = dev_tensor(&r.ctx, DataType::F32, &[child.get_rank() as f64; 8])?;
    child.broadcast(&t, 0, &OpOptions::sync())?.wait()?;
    ensure!(
        read_f32(&t)?.iter().all(|&v| v == 0.0),
        "broadcast on the child"
    );
    child.finalize()?;
    // Only rank 0: the others pass an empty list and get no communicator.
    let ranks: Vec<usize> = if r.rank == 0 { vec![0] } else { vec![] };
    let solo = r.comm.split(&ranks, "solo", None)?;
    ensure!(
        solo.is_some() == (r.rank == 0),
        "membership of a one-rank split"
    );
    if let Some(s) = solo {
        let t = dev_tensor(&r.ctx, DataType::F32, &[3.0; 4])?;
        s.all_reduce(&t, ReduceOp::Sum, &OpOptions::sync())?
            .wait()?;
        ensure!(read_f32(&t)? == vec![3.0; 4], "one-rank all_reduce");
        s.finalize()?;
    }
    r.say("split (ncclCommSplit): reordered ranks, a one-rank child, non-members get none");
    Ok(())
}

fn abort_on_timeout(r: &Rank) -> Result<()> {
    let t = dev_tensor(&r.ctx, DataType::F32, &[1.0; 1024])?;
    let timeout = Duration::from_secs(3);
    if r.rank == 0 {
        // Rank 0 all-reduces alone: its watchdog aborts at the deadline.
        let start = Instant::now();
        let w = r.comm.all_reduce(
            &t,
            ReduceOp::Sum,
            &OpOptions::async_op().with_timeout(timeout),
        )?;
        let e = w
            .wait_blocking()
            .err()
            .context("the lone all_reduce succeeded")?;
        let took = start.elapsed();
        ensure!(took < timeout + Duration::from_secs(10), "took {took:?}");
        println!("  rank 0 error after {:.1} s: {e}", took.as_secs_f64());
        ensure!(e.to_string().contains("did not complete"), "{e}");
        // Rank 0 serves the MASTER_PORT store: stay until the others have read the notice.
        std::thread::sleep(Duration::from_secs(3));
    } else {
        // The others never join; they learn of the abort through the store.
        let start = Instant::now();
        while !r.comm.is_aborted() {
            ensure!(start.elapsed() < Duration::from_secs(30), "no abort notice");
            std::thread::sleep(Duration::from_millis(50));
        }
        let e = r
            .comm
            .all_reduce(&t, ReduceOp::Sum, &OpOptions::sync())
            .err()
            .context("an op on an aborted communicator succeeded")?;
        println!("  rank {} error: {e}", r.rank);
        ensure!(e.to_string().contains("aborted"), "{e}");
    }
    r.say("abort on timeout: ncclCommAbort, error on every rank");
    Ok(())
}
