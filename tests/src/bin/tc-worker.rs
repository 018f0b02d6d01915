//! One rank of a multi-process test job. The scenario comes from the command line, rank and
//! size from the launcher environment; the outcome is printed and signalled by the exit code.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use torchcomms::{
    new_comm, CommOptions, DataType, Device, OpOptions, P2POp, ReduceOp, Tensor, TorchComm, Work,
};
use torchcomms_ctran as _;
use torchcomms_tests::values::{decode, encode, expected, input, matches, valid};

/// A host tensor holding `bytes`, optionally at an odd address (to test unaligned buffers).
fn tensor(dtype: DataType, bytes: &[u8], unaligned: bool) -> Tensor {
    let off = usize::from(unaligned);
    let mut store = vec![0u64; (bytes.len() + off).div_ceil(8) + 1];
    let base = store.as_mut_ptr().cast::<u8>();
    // SAFETY: `store` has room for off + bytes.len() bytes and is moved into the owner below
    // (its heap buffer does not move), which operations keep alive while they run.
    let t = unsafe {
        let p = base.add(off);
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
        Tensor::from_raw(p, bytes.len() / dtype.size_bytes(), dtype, Device::Cpu)
    };
    t.with_owner(Arc::new(store))
}

fn bytes_of(t: &Tensor) -> Vec<u8> {
    t.to_vec::<u8>()
        .or_else(|_| {
            // to_vec checks the dtype; view the same memory as bytes.
            // SAFETY: same memory and owner as `t`, read after the work completed.
            let v = unsafe {
                Tensor::from_raw(t.addr() as *mut u8, t.nbytes(), DataType::U8, Device::Cpu)
            };
            v.to_vec::<u8>()
        })
        .expect("tensor readable after its work completed")
}

struct Suite {
    comm: TorchComm,
    rank: usize,
    n: usize,
    checks: usize,
    failures: Vec<String>,
    large: usize,
    /// `--algo-set K`: run every collective with the K-th of its algorithms (modulo their
    /// number) by the hint `algo`; `None`: the engine chooses.
    algo_set: Option<usize>,
    /// Calls an algorithm of the set could not run (Bruck all_to_all with unequal or large
    /// blocks, tree scatter/gather beyond a staging chunk), refused as documented.
    refused: usize,
}

impl Suite {
    fn check(
        &mut self,
        what: &str,
        dtype: DataType,
        op: ReduceOp,
        got: &[f64],
        want: impl Fn(usize) -> f64,
    ) {
        self.checks += 1;
        if let Some(i) = (0..got.len()).find(|&i| !matches(dtype, op, got[i], want(i))) {
            self.failures.push(format!(
                "{what}: element {i} is {} expected {}",
                got[i],
                want(i)
            ));
        }
    }

    fn done(&mut self, what: &str, w: torchcomms::Result<Work>) -> bool {
        match w.and_then(|w| w.wait()) {
            Ok(()) => true,
            // The documented limits of Bruck all_to_all and tree scatter/gather: a clear
            // refusal before anything is sent.
            Err(e)
                if self.algo_set.is_some()
                    && e.kind() == torchcomms::ErrorKind::InvalidArgument
                    && ["(bruck needs", "(tree needs"]
                        .iter()
                        .any(|w| e.to_string().contains(w)) =>
            {
                self.refused += 1;
                false
            }
            Err(e) => {
                self.failures.push(format!("{what}: {e}"));
                false
            }
        }
    }

    /// Options of a call of `op`: sync or async, and the hint `algo` of the algorithm set.
    fn opts_for(&self, op: &str, async_op: bool) -> OpOptions {
        let o = if async_op {
            OpOptions::async_op()
        } else {
            OpOptions::sync()
        };
        match (self.algo_set, ctran::algos::names_for(op)) {
            (Some(k), Some(names)) => o.with_hint("algo", names[k % names.len()]),
            _ => o,
        }
    }

    fn sizes(&self, dtype: DataType, op: ReduceOp) -> Vec<(usize, bool)> {
        let mut s = vec![(0, false), (1, false), (37, false), (1001, true)];
        let big = matches!(
            (dtype, op),
            (DataType::F32, ReduceOp::Sum)
                | (DataType::BF16, ReduceOp::Sum)
                | (DataType::I64, ReduceOp::Max)
                | (DataType::F16, ReduceOp::Avg)
        );
        if big && self.large > 0 {
            s.push((self.large / dtype.size_bytes() + 3, false));
        }
        s
    }

    fn reductions(&mut self, dtype: DataType, op: ReduceOp) {
        let (n, me) = (self.n, self.rank);
        for (count, unaligned) in self.sizes(dtype, op) {
            let mine: Vec<f64> = (0..count).map(|i| input(dtype, op, me, i)).collect();
            let async_op = count % 2 == 1;
            let tag = format!("{dtype} {op} count={count} unaligned={unaligned} async={async_op}");

            let t = tensor(dtype, &encode(dtype, &mine), unaligned);
            if self.done(
                &format!("all_reduce {tag}"),
                self.comm
                    .all_reduce(&t, op, &self.opts_for("all_reduce", async_op)),
            ) {
                let got = decode(dtype, &bytes_of(&t));
                self.check(&format!("all_reduce {tag}"), dtype, op, &got, |i| {
                    expected(dtype, op, n, i)
                });
                // Every rank must hold bitwise the same result.
                let all = Tensor::zeros(DataType::U8, t.nbytes() * n);
                let mine_bytes = tensor(DataType::U8, &bytes_of(&t), false);
                if self.done(
                    "all_gather_single (identity)",
                    self.comm
                        .all_gather_single(&all, &mine_bytes, &OpOptions::sync()),
                ) {
                    let all = bytes_of(&all);
                    let first = &all[..t.nbytes()];
                    self.checks += 1;
                    if all.chunks(t.nbytes().max(1)).any(|c| c != first) && t.nbytes() > 0 {
                        self.failures
                            .push(format!("all_reduce {tag}: results differ across ranks"));
                    }
                }
            }
            drop(t);

            let root = count % n;
            let t = tensor(dtype, &encode(dtype, &mine), unaligned);
            if self.done(
                &format!("reduce {tag}"),
                self.comm
                    .reduce(&t, root, op, &self.opts_for("reduce", async_op)),
            ) {
                let got = decode(dtype, &bytes_of(&t));
                if me == root {
                    self.check(&format!("reduce {tag} root={root}"), dtype, op, &got, |i| {
                        expected(dtype, op, n, i)
                    });
                } else {
                    self.check(
                        &format!("reduce {tag} non-root unchanged"),
                        dtype,
                        ReduceOp::Sum,
                        &got,
                        |i| mine[i],
                    );
                }
            }

            // reduce_scatter_single: block j of rank r's input is `input(r, j*count + i)`.
            let full: Vec<f64> = (0..count * n).map(|i| input(dtype, op, me, i)).collect();
            let inp = tensor(dtype, &encode(dtype, &full), unaligned);
            let out = Tensor::zeros(dtype, count);
            if self.done(
                &format!("reduce_scatter_single {tag}"),
                self.comm.reduce_scatter_single(
                    &out,
                    &inp,
                    op,
                    &self.opts_for("reduce_scatter_single", async_op),
                ),
            ) {
                let got = decode(dtype, &bytes_of(&out));
                self.check(
                    &format!("reduce_scatter_single {tag}"),
                    dtype,
                    op,
                    &got,
                    |i| expected(dtype, op, n, me * count + i),
                );
            }
            // reduce_scatter_v: block j holds count + j elements.
            let ins: Vec<Tensor> = (0..n)
                .map(|j| {
                    tensor(
                        dtype,
                        &encode(
                            dtype,
                            &(0..count + j)
                                .map(|i| input(dtype, op, me, i))
                                .collect::<Vec<_>>(),
                        ),
                        false,
                    )
                })
                .collect();
            let out = Tensor::zeros(dtype, count + me);
            if self.done(
                &format!("reduce_scatter_v {tag}"),
                self.comm.reduce_scatter_v(
                    &out,
                    &ins,
                    op,
                    &self.opts_for("reduce_scatter_v", async_op),
                ),
            ) {
                let got = decode(dtype, &bytes_of(&out));
                self.check(&format!("reduce_scatter_v {tag}"), dtype, op, &got, |i| {
                    expected(dtype, op, n, i)
                });
            }
        }
    }

    fn data_movement(&mut self, dtype: DataType) {
        let (n, me) = (self.n, self.rank);
        let v = |r: usize, i: usize| input(dtype, ReduceOp::Sum, r, i + 1);
        let mut sizes = vec![(0, false), (1, false), (37, false), (1001, true)];
        if dtype == DataType::F32 && self.large > 0 {
            sizes.push((self.large / 4 + 1, false));
        }
        for (count, unaligned) in sizes {
            let async_op = count % 2 == 0;
            let tag = format!("{dtype} count={count} unaligned={unaligned} async={async_op}");
            let vals = |r: usize, len: usize| {
                encode(dtype, &(0..len).map(|i| v(r, i)).collect::<Vec<_>>())
            };
            let same = |got: &[u8], r: usize, len: usize| {
                decode(dtype, got) == decode(dtype, &vals(r, len))
            };

            let root = (count + 1) % n;
            let t = if me == root {
                tensor(dtype, &vals(root, count), unaligned)
            } else {
                Tensor::zeros(dtype, count)
            };
            if self.done(
                &format!("broadcast {tag}"),
                self.comm
                    .broadcast(&t, root, &self.opts_for("broadcast", async_op)),
            ) {
                self.checks += 1;
                if !same(&bytes_of(&t), root, count) {
                    self.failures.push(format!("broadcast {tag}: wrong data"));
                }
            }

            let inp = tensor(dtype, &vals(me, count), unaligned);
            let outs: Vec<Tensor> = (0..n).map(|_| Tensor::zeros(dtype, count)).collect();
            if self.done(
                &format!("all_gather {tag}"),
                self.comm
                    .all_gather(&outs, &inp, &self.opts_for("all_gather", async_op)),
            ) {
                for (j, o) in outs.iter().enumerate() {
                    self.checks += 1;
                    if !same(&bytes_of(o), j, count) {
                        self.failures
                            .push(format!("all_gather {tag}: block {j} wrong"));
                    }
                }
            }
            let single = Tensor::zeros(dtype, count * n);
            if self.done(
                &format!("all_gather_single {tag}"),
                self.comm.all_gather_single(
                    &single,
                    &inp,
                    &self.opts_for("all_gather_single", async_op),
                ),
            ) {
                let got = bytes_of(&single);
                let es = dtype.size_bytes();
                for j in 0..n {
                    self.checks += 1;
                    if !same(&got[j * count * es..(j + 1) * count * es], j, count) {
                        self.failures
                            .push(format!("all_gather_single {tag}: block {j} wrong"));
                    }
                }
            }
            let inp_v = tensor(dtype, &vals(me, count + me), false);
            let outs_v: Vec<Tensor> = (0..n).map(|j| Tensor::zeros(dtype, count + j)).collect();
            if self.done(
                &format!("all_gather_v {tag}"),
                self.comm
                    .all_gather_v(&outs_v, &inp_v, &self.opts_for("all_gather_v", async_op)),
            ) {
                for (j, o) in outs_v.iter().enumerate() {
                    self.checks += 1;
                    if !same(&bytes_of(o), j, count + j) {
                        self.failures
                            .push(format!("all_gather_v {tag}: block {j} wrong"));
                    }
                }
            }

            // all_to_all_single: rank r's block j is vals(r * n + j)
            let es = dtype.size_bytes();
            let blocks: Vec<u8> = (0..n).flat_map(|j| vals(me * n + j, count)).collect();
            let inp = tensor(dtype, &blocks, unaligned);
            let out = Tensor::zeros(dtype, count * n);
            if self.done(
                &format!("all_to_all_single {tag}"),
                self.comm.all_to_all_single(
                    &out,
                    &inp,
                    &self.opts_for("all_to_all_single", async_op),
                ),
            ) {
                let got = bytes_of(&out);
                for j in 0..n {
                    self.checks += 1;
                    if !same(
                        &got[j * count * es..(j + 1) * count * es],
                        j * n + me,
                        count,
                    ) {
                        self.failures
                            .push(format!("all_to_all_single {tag}: block from {j} wrong"));
                    }
                }
            }
            // all_to_all_v_single: rank r sends (r + j) % 3 + count rows to j (1 element per row)
            let len = |from: usize, to: usize| (from + to) % 3 + count;
            let in_splits: Vec<usize> = (0..n).map(|j| len(me, j)).collect();
            let out_splits: Vec<usize> = (0..n).map(|j| len(j, me)).collect();
            let blocks: Vec<u8> = (0..n).flat_map(|j| vals(me * n + j, len(me, j))).collect();
            let inp = tensor(dtype, &blocks, unaligned);
            let out = Tensor::zeros(dtype, out_splits.iter().sum());
            if self.done(
                &format!("all_to_all_v_single {tag}"),
                self.comm.all_to_all_v_single(
                    &out,
                    &inp,
                    &out_splits,
                    &in_splits,
                    &self.opts_for("all_to_all_v_single", async_op),
                ),
            ) {
                let got = bytes_of(&out);
                let mut off = 0;
                for j in 0..n {
                    let l = len(j, me) * es;
                    self.checks += 1;
                    if !same(&got[off..off + l], j * n + me, len(j, me)) {
                        self.failures
                            .push(format!("all_to_all_v_single {tag}: block from {j} wrong"));
                    }
                    off += l;
                }
            }
            // all_to_all (lists)
            let ins: Vec<Tensor> = (0..n)
                .map(|j| tensor(dtype, &vals(me * n + j, count), false))
                .collect();
            let outs: Vec<Tensor> = (0..n).map(|_| Tensor::zeros(dtype, count)).collect();
            if self.done(
                &format!("all_to_all {tag}"),
                self.comm
                    .all_to_all(&outs, &ins, &self.opts_for("all_to_all", async_op)),
            ) {
                for (j, o) in outs.iter().enumerate() {
                    self.checks += 1;
                    if !same(&bytes_of(o), j * n + me, count) {
                        self.failures
                            .push(format!("all_to_all {tag}: block from {j} wrong"));
                    }
                }
            }

            // scatter / gather / gather_single
            let ins: Vec<Tensor> = if me == root {
                (0..n)
                    .map(|j| tensor(dtype, &vals(j, count), false))
                    .collect()
            } else {
                Vec::new()
            };
            let out = Tensor::zeros(dtype, count);
            if self.done(
                &format!("scatter {tag}"),
                self.comm
                    .scatter(&out, &ins, root, &self.opts_for("scatter", async_op)),
            ) {
                self.checks += 1;
                if !same(&bytes_of(&out), me, count) {
                    self.failures.push(format!("scatter {tag}: wrong block"));
                }
            }
            let inp = tensor(dtype, &vals(me, count), unaligned);
            let outs: Vec<Tensor> = if me == root {
                (0..n).map(|_| Tensor::zeros(dtype, count)).collect()
            } else {
                Vec::new()
            };
            if self.done(
                &format!("gather {tag}"),
                self.comm
                    .gather(&outs, &inp, root, &self.opts_for("gather", async_op)),
            ) {
                for (j, o) in outs.iter().enumerate() {
                    self.checks += 1;
                    if !same(&bytes_of(o), j, count) {
                        self.failures.push(format!("gather {tag}: block {j} wrong"));
                    }
                }
            }
            let single = Tensor::zeros(dtype, count * n);
            if self.done(
                &format!("gather_single {tag}"),
                self.comm.gather_single(
                    &single,
                    &inp,
                    root,
                    &self.opts_for("gather_single", async_op),
                ),
            ) && me == root
            {
                let got = bytes_of(&single);
                for j in 0..n {
                    self.checks += 1;
                    if !same(&got[j * count * es..(j + 1) * count * es], j, count) {
                        self.failures
                            .push(format!("gather_single {tag}: block {j} wrong"));
                    }
                }
            }

            // send/recv around the ring, and the same as one batch
            if n > 1 {
                let (right, left) = ((me + 1) % n, (me + n - 1) % n);
                let s = tensor(dtype, &vals(me, count), unaligned);
                let r = Tensor::zeros(dtype, count);
                let ws = self.comm.send(&s, right, &OpOptions::async_op());
                let wr = self.comm.recv(&r, left, &OpOptions::async_op());
                if self.done(&format!("send {tag}"), ws) && self.done(&format!("recv {tag}"), wr) {
                    self.checks += 1;
                    if !same(&bytes_of(&r), left, count) {
                        self.failures.push(format!("send/recv {tag}: wrong data"));
                    }
                }
                let r2 = Tensor::zeros(dtype, count);
                let mut batch = self.comm.batch_op_create();
                batch.send(s.clone(), right).recv(r2.clone(), left);
                let w = batch.issue(&self.opts_for("batch", async_op));
                drop(batch);
                if self.done(&format!("batch {tag}"), w) {
                    self.checks += 1;
                    if !same(&bytes_of(&r2), left, count) {
                        self.failures.push(format!("batch {tag}: wrong data"));
                    }
                }
            }
        }
    }
}

fn comm_from_env(name: &str) -> Result<TorchComm> {
    Ok(new_comm(
        "ctran",
        Device::Cpu,
        name,
        CommOptions::from_env()?,
    )?)
}

fn suite(args: &[String]) -> Result<()> {
    let large = args
        .iter()
        .position(|a| a == "--large")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(0), |s| s.parse())
        .context("--large BYTES")?;
    let algo_set = args
        .iter()
        .position(|a| a == "--algo-set")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.parse::<usize>())
        .transpose()
        .context("--algo-set K")?;
    let comm = comm_from_env("suite")?;
    let (rank, n) = (comm.get_rank(), comm.get_size());
    let mut s = Suite {
        comm,
        rank,
        n,
        checks: 0,
        failures: Vec::new(),
        large,
        algo_set,
        refused: 0,
    };
    for dtype in DataType::ALL {
        for op in ReduceOp::ALL {
            if valid(dtype, op) {
                s.reductions(dtype, op);
            }
        }
        s.data_movement(dtype);
    }
    // Many async ops in flight at once, waited in reverse order.
    let ts: Vec<Tensor> = (0..16)
        .map(|k| Tensor::from_vec(vec![(rank + k) as i64; 33]))
        .collect();
    let works: Vec<Work> = ts
        .iter()
        .map(|t| s.comm.all_reduce(t, ReduceOp::Sum, &OpOptions::async_op()))
        .collect::<Result<_, _>>()?;
    for w in works.iter().rev() {
        w.wait()?;
    }
    drop(works);
    for (k, t) in ts.iter().enumerate() {
        let want = (0..n).map(|r| (r + k) as i64).sum::<i64>();
        s.checks += 1;
        if t.to_vec::<i64>()? != vec![want; 33] {
            s.failures
                .push(format!("queued async all_reduce {k}: wrong result"));
        }
    }
    s.comm.barrier(&OpOptions::sync())?.wait()?;
    s.comm.finalize()?;
    if !s.failures.is_empty() {
        for f in &s.failures {
            println!("FAIL rank {rank}: {f}");
        }
        bail!(
            "{} of {} checks failed on rank {rank}",
            s.failures.len(),
            s.checks
        );
    }
    assert!(s.checks > 100, "the suite ran only {} checks", s.checks);
    println!(
        "SUITE OK rank {rank}/{n}: {} checks, {} refused",
        s.checks, s.refused
    );
    // Which path the shared-memory collectives took: the tests that force or forbid
    // cross-memory attach check these counts.
    let cma = ctran::transport::shm::cma_stats();
    println!("CMA rank {rank}: {} reads, {} bytes", cma.reads, cma.bytes);
    Ok(())
}

fn arg_usize(args: &[String], flag: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn die_now() -> ! {
    // SAFETY: sending SIGKILL to our own pid has no memory-safety preconditions.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    unreachable!("SIGKILL delivered");
}

/// Runs `op` on survivors and reports the error it ends with; the victim dies mid-way.
fn fault(args: &[String], kind: &str) -> Result<()> {
    let victim = arg_usize(args, "--victim", 1);
    let comm = comm_from_env(kind)?;
    let me = comm.get_rank();
    let n = comm.get_size();
    // One good operation first, so the failure happens at a known sequence number.
    let warm = Tensor::from_vec(vec![1.0f32; 8]);
    comm.all_reduce(&warm, ReduceOp::Sum, &OpOptions::sync())?
        .wait()?;
    let big = Tensor::zeros(DataType::F32, 32 << 20 >> 2);
    let start = Instant::now();
    let result = match kind {
        "kill-allreduce" => {
            if me == victim {
                let _w = comm.all_reduce(&big, ReduceOp::Sum, &OpOptions::async_op())?;
                std::thread::sleep(Duration::from_millis(30));
                die_now();
            }
            comm.all_reduce(&big, ReduceOp::Sum, &OpOptions::sync())
                .map(drop)
        }
        "kill-sendrecv" => {
            // The victim posts receives for a stream of large sends and dies part-way.
            let sender = (victim + 1) % n;
            if me == victim {
                let works: Vec<Work> = (0..64)
                    .map(|_| comm.recv(&big, sender, &OpOptions::async_op()))
                    .collect::<Result<_, _>>()?;
                std::thread::sleep(Duration::from_millis(30));
                drop(works);
                die_now();
            }
            if me != sender {
                println!("BYSTANDER rank {me}");
                return Ok(());
            }
            (0..64).try_for_each(|_| comm.send(&big, victim, &OpOptions::sync()).map(drop))
        }
        "stall" => {
            if me == victim {
                std::thread::sleep(Duration::from_secs(3600));
            }
            comm.all_reduce(&big, ReduceOp::Sum, &OpOptions::sync())
                .map(drop)
        }
        other => bail!("unknown fault scenario {other}"),
    };
    let elapsed = start.elapsed();
    match result {
        Ok(()) => bail!("rank {me}: the operation succeeded although rank {victim} failed"),
        Err(e) => {
            println!("SURVIVOR rank {me} after {} ms: {e}", elapsed.as_millis());
            // The communicator must now refuse work with the same cause.
            let again = comm.barrier(&OpOptions::sync()).and_then(|w| w.wait());
            match again {
                Ok(()) => bail!("rank {me}: the communicator accepted work after failing"),
                Err(e2) => println!("REFUSED rank {me}: {e2}"),
            }
        }
    }
    Ok(())
}

/// Creates communicators back to back without a store (the MASTER_PORT store must be
/// released after each init) and uses each.
fn back_to_back(args: &[String]) -> Result<()> {
    let count = arg_usize(args, "--count", 3);
    for k in 0..count {
        let comm = comm_from_env(&format!("b2b{k}"))?;
        let t = Tensor::from_vec(vec![1i32; 5]);
        comm.all_reduce(&t, ReduceOp::Sum, &OpOptions::sync())?
            .wait()?;
        comm.finalize()?;
        let n = comm.get_size() as i32;
        if t.to_vec::<i32>()? != vec![n; 5] {
            bail!("comm {k}: wrong all_reduce result");
        }
    }
    println!("BACK_TO_BACK OK {count}");
    Ok(())
}

/// Simple job used by the forged-connection test: one checked all_reduce.
fn simple() -> Result<()> {
    let comm = comm_from_env("simple")?;
    let t = Tensor::from_vec(vec![comm.get_rank() as i64 + 1; 100]);
    comm.all_reduce(&t, ReduceOp::Sum, &OpOptions::sync())?
        .wait()?;
    let n = comm.get_size() as i64;
    if t.to_vec::<i64>()? != vec![n * (n + 1) / 2; 100] {
        bail!("wrong all_reduce result");
    }
    comm.finalize()?;
    println!("SIMPLE OK rank {}", comm.get_rank());
    Ok(())
}

/// Bad input: every case must fail with an error naming the argument, and leave the
/// communicator usable.
fn errors() -> Result<()> {
    let comm = comm_from_env("errors")?;
    let n = comm.get_size();
    let me = comm.get_rank();
    let f = Tensor::from_vec(vec![1.0f32; 4]);
    let i = Tensor::from_vec(vec![1i32; 4]);
    let sync = OpOptions::sync();
    // SAFETY: this tensor only ever reaches argument validation, which refuses its device
    // before anything reads the (invalid) address.
    let on_gpu = unsafe { Tensor::from_raw(8 as *mut u8, 1, DataType::F32, Device::Cuda(0)) };
    let mut cases: Vec<(&str, torchcomms::Result<Work>, &str)> = vec![
        (
            "bitwise on float",
            comm.all_reduce(&f, ReduceOp::BXor, &sync),
            "bxor on f32",
        ),
        (
            "root out of range",
            comm.broadcast(&f, n, &sync),
            "root must be in range",
        ),
        (
            "send to self",
            comm.send(&f, me, &sync),
            "no send/recv to self",
        ),
        (
            "peer out of range",
            comm.recv(&f, n + 3, &sync),
            "src must be in range",
        ),
        (
            "non-contiguous",
            comm.all_reduce(&f.clone().with_contiguous(false), ReduceOp::Sum, &sync),
            "contiguous",
        ),
        (
            "wrong dtype in list",
            comm.all_gather(&vec![i.clone(); n], &f, &sync),
            "dtype f32",
        ),
        (
            "list length",
            comm.all_gather(std::slice::from_ref(&f), &f, &sync),
            "one per rank",
        ),
        (
            "size mismatch",
            comm.all_gather_single(&Tensor::zeros(DataType::F32, 3), &f, &sync),
            "elements",
        ),
        (
            "split sizes",
            comm.all_to_all_v_single(&f, &f.clone(), &[1], &[1], &sync),
            "split sizes",
        ),
        (
            "wrong device",
            comm.all_reduce(&on_gpu, ReduceOp::Sum, &sync),
            "cpu",
        ),
        ("empty batch", comm.batch_p2p(&[], &sync), "at least one"),
        (
            "batch to self",
            comm.batch_p2p(
                &[P2POp::Send {
                    tensor: f.clone(),
                    peer: me,
                }],
                &sync,
            ),
            "to self",
        ),
    ];
    let mut bad = Vec::new();
    for (what, res, needle) in cases.drain(..) {
        match res {
            Ok(_) => bad.push(format!("{what}: accepted")),
            Err(e) => {
                let msg = e.to_string();
                if e.kind() != torchcomms::ErrorKind::InvalidArgument || !msg.contains(needle) {
                    bad.push(format!("{what}: unexpected error {msg:?} ({:?})", e.kind()));
                } else {
                    println!("OK {what}: {msg}");
                }
            }
        }
    }
    // Still usable after bad input.
    comm.all_reduce(&f, ReduceOp::Sum, &sync)?.wait()?;
    match comm.split(&[n + 1], "bad", None) {
        Err(e) if e.to_string().contains("ranks") => println!("OK split out of range: {e}"),
        other => bad.push(format!("split out of range: {other:?}")),
    }
    comm.finalize()?;
    match comm.all_reduce(&f, ReduceOp::Sum, &sync) {
        Err(e) if e.to_string().contains("after finalize") => println!("OK op after finalize: {e}"),
        other => bad.push(format!("op after finalize: {other:?}")),
    }
    if !bad.is_empty() {
        bail!("bad-input checks failed:\n{}", bad.join("\n"));
    }
    println!("ERRORS OK rank {me}");
    Ok(())
}

/// Ranks that disagree about the size of a collective (rank 0 passes half of what the others
/// pass) must each fail with an error that names the mismatch, within the timeout, instead of
/// hanging or corrupting memory. `--op` picks the collective, `--size small|mixed|large` the
/// sizes.
fn mismatch(args: &[String]) -> Result<()> {
    let size = args
        .iter()
        .position(|a| a == "--size")
        .and_then(|i| args.get(i + 1))
        .map_or("small", String::as_str);
    let op = args
        .iter()
        .position(|a| a == "--op")
        .and_then(|i| args.get(i + 1))
        .map_or("all_reduce", String::as_str);
    let comm = comm_from_env("mismatch")?;
    let me = comm.get_rank();
    let n = comm.get_size();
    // With CTRAN_SHM_CMA_MIN_BYTES=1M (all_reduce switches at 2 MiB) — small: every rank
    // under the cross-memory-attach threshold; large: all over it; mixed: for all_reduce, rank 0
    // under (1.5 MiB) and the others over (3 MiB), so ranks would take different paths.
    let base = match size {
        "large" => 1 << 20,
        "mixed" => 384 << 10,
        _ => 256,
    };
    let count = base * if me == 0 { 1 } else { 2 };
    let sync = OpOptions::sync();
    let t = Tensor::zeros(DataType::F32, count);
    let start = Instant::now();
    let result = match op {
        "all_reduce" => comm.all_reduce(&t, ReduceOp::Sum, &sync),
        "broadcast" => comm.broadcast(&t, 0, &sync),
        "all_gather" => {
            // Every rank believes each block has its own size: rank 0 receives smaller blocks
            // than the others send.
            let outs: Vec<Tensor> = (0..n)
                .map(|_| Tensor::zeros(DataType::F32, count))
                .collect();
            comm.all_gather(&outs, &t, &sync)
        }
        "reduce_scatter" => {
            let ins: Vec<Tensor> = (0..n)
                .map(|_| Tensor::zeros(DataType::F32, count))
                .collect();
            comm.reduce_scatter(&t, &ins, ReduceOp::Sum, &sync)
        }
        other => bail!("unknown --op {other}"),
    }
    .and_then(|w| w.wait());
    match result {
        Ok(_) => bail!("rank {me}: {op} with mismatched sizes succeeded"),
        Err(e) => println!(
            "MISMATCH rank {me} after {} ms: {e}",
            start.elapsed().as_millis()
        ),
    }
    Ok(())
}

fn main() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TORCHCOMMS_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().map(String::as_str).unwrap_or("");
    let result = match scenario {
        "suite" => suite(&args),
        "kill-allreduce" | "kill-sendrecv" | "stall" => fault(&args, scenario),
        "back-to-back" => back_to_back(&args),
        "simple" => simple(),
        "errors" => errors(),
        "mismatch" => mismatch(&args),
        other => Err(anyhow::anyhow!("unknown scenario {other:?}: expected suite, kill-allreduce, kill-sendrecv, stall, back-to-back, simple, errors, mismatch")),
    };
    if let Err(e) = result {
        eprintln!("tc-worker {scenario}: {e:#}");
        std::process::exit(1);
    }
}
