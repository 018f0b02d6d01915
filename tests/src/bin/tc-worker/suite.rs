//! The suite: every collective, dtype and reduction on sizes from 0 to `--large`, each result
//! checked against the host's computation.

use std::sync::Arc;

use anyhow::{bail, Result};
use torchcomms::{DataType, Device, OpOptions, ReduceOp, Tensor, TorchComm, Work};
use torchcomms_tests::values::{decode, encode, expected, input, matches, valid};

use crate::comm_from_env;

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
            // device_alltoallv_single: the same blocks, counts in tensors, the output larger than
            // what arrives (its tail must keep its bytes).
            let total: usize = out_splits.iter().sum();
            let spare = 3;
            let out = tensor(dtype, &vec![0xA5; (total + spare) * es], false);
            let counts = |v: &[usize]| Tensor::from_vec(v.iter().map(|&c| c as i64).collect());
            let (send_counts, recv_counts) =
                (counts(&in_splits), counts(&vec![usize::MAX >> 1; n]));
            if self.done(
                &format!("device_alltoallv_single {tag}"),
                self.comm.device_alltoallv_single(
                    &out,
                    &inp,
                    &recv_counts,
                    &send_counts,
                    &self.opts_for("device_alltoallv_single", async_op),
                ),
            ) {
                let got = bytes_of(&out);
                let got_counts = recv_counts.to_vec::<i64>().expect("i64 counts");
                self.checks += 1;
                if got_counts != out_splits.iter().map(|&c| c as i64).collect::<Vec<_>>() {
                    self.failures.push(format!(
                        "device_alltoallv_single {tag}: received counts {got_counts:?}, sent {out_splits:?}"
                    ));
                }
                let mut off = 0;
                for j in 0..n {
                    let l = len(j, me) * es;
                    self.checks += 1;
                    if !same(&got[off..off + l], j * n + me, len(j, me)) {
                        self.failures.push(format!(
                            "device_alltoallv_single {tag}: block from {j} wrong"
                        ));
                    }
                    off += l;
                }
                self.checks += 1;
                if got[off..].iter().any(|&b| b != 0xA5) {
                    self.failures.push(format!(
                        "device_alltoallv_single {tag}: rows past the received ones changed"
                    ));
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

/// Runs the suite with large sizes of `large` bytes (0: none), and with the `algo_set`-th
/// algorithm of every collective where given.
pub(crate) fn suite(large: usize, algo_set: Option<usize>) -> Result<()> {
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
    println!(
        "LANES rank {rank}: {} operations",
        ctran::shm_collectives::laned_operations()
    );
    Ok(())
}
