//! One rank's timing and checking of an operation: its buffers, its iterations, its rounds
//! over algorithms, and the check of its result.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use ctran::{DataType, ReduceOp};
use torchcomms::{ErrorKind, OpOptions, P2POp, Tensor, TorchComm, Work};

use super::print::{Entry, Printer};
use super::row::{layout, Layout, Row};
use crate::ab;
use crate::check::{input_value, reduce_expected, with_elem, Elem, Expect, Pattern};
use crate::cli::{CollOp, Settings};
use crate::device::Mem;

/// The tensors of one operation on this rank.
pub(super) struct Bufs {
    /// What the operation reads; the result too for in-place operations.
    pub(super) input: Tensor,
    /// The result, for operations that write a separate tensor.
    pub(super) output: Option<Tensor>,
    /// The root's per-rank views of `input` (scatter).
    pub(super) views: Vec<Tensor>,
    /// The ring exchange (send_recv).
    p2p: Vec<P2POp>,
}

impl Bufs {
    /// The tensors of the result, dropping every view so the result can be read back.
    pub(super) fn result(self) -> Tensor {
        let Bufs {
            input,
            output,
            views,
            p2p,
        } = self;
        drop(views);
        drop(p2p);
        output.unwrap_or(input)
    }
}

/// A rank of the benchmark.
pub(super) struct Bench<'a> {
    pub(super) s: &'a Settings,
    pub(super) comm: TorchComm,
    pub(super) rank: usize,
    pub(super) n: usize,
    pub(super) root: usize,
    /// Host or device memory of this rank.
    pub(super) mem: Mem,
}

impl Bench<'_> {
    /// Elements of this rank's input for an operation of `c` elements.
    pub(super) fn in_count(&self, op: CollOp, c: usize) -> usize {
        match op {
            CollOp::AllGather | CollOp::Gather => c / self.n,
            CollOp::Scatter if self.rank != self.root => 0,
            _ => c,
        }
    }

    /// Elements of this rank's separate output, `None` for in-place operations.
    pub(super) fn out_count(&self, op: CollOp, c: usize) -> Option<usize> {
        match op {
            CollOp::AllReduce | CollOp::Broadcast | CollOp::Reduce => None,
            CollOp::Gather if self.rank != self.root => Some(0),
            CollOp::ReduceScatter | CollOp::Scatter => Some(c / self.n),
            CollOp::AllGather | CollOp::Gather | CollOp::AllToAll | CollOp::SendRecv => Some(c),
        }
    }

    pub(super) fn bufs(&self, op: CollOp, input: Tensor, c: usize) -> Result<Bufs> {
        let output = self
            .out_count(op, c)
            .map(|k| self.mem.zeros(input.dtype(), k))
            .transpose()?;
        let views = if op == CollOp::Scatter && self.rank == self.root {
            let blk = c / self.n;
            (0..self.n).map(|r| input.narrow(r * blk, blk)).collect()
        } else {
            Vec::new()
        };
        let p2p = match (&output, op) {
            (Some(out), CollOp::SendRecv) => vec![
                P2POp::Send {
                    tensor: input.clone(),
                    peer: (self.rank + 1) % self.n,
                },
                P2POp::Recv {
                    tensor: out.clone(),
                    peer: (self.rank + self.n - 1) % self.n,
                },
            ],
            _ => Vec::new(),
        };
        Ok(Bufs {
            input,
            output,
            views,
            p2p,
        })
    }

    pub(super) fn opts(&self, op: CollOp, algo: Option<&str>, async_op: bool) -> OpOptions {
        let mut o = if async_op {
            OpOptions::async_op()
        } else {
            OpOptions::sync()
        };
        if let Some(algo) = algo {
            o = o.with_hint("algo", algo);
        }
        if op == CollOp::AllToAll {
            // all_to_all_single: every rank passes equal blocks, which lets the engine consider
            // algorithms that need them (Bruck).
            o = o.with_hint("uniform_blocks", "1");
        }
        o
    }

    pub(super) fn issue(
        &self,
        op: CollOp,
        redop: ReduceOp,
        b: &Bufs,
        o: &OpOptions,
    ) -> torchcomms::Result<Work> {
        let c = &self.comm;
        let out = || b.output.as_ref().unwrap_or(&b.input);
        match op {
            CollOp::AllReduce => c.all_reduce(&b.input, redop, o),
            CollOp::Broadcast => c.broadcast(&b.input, self.root, o),
            CollOp::Reduce => c.reduce(&b.input, self.root, redop, o),
            CollOp::AllGather => c.all_gather_single(out(), &b.input, o),
            CollOp::Gather => c.gather_single(out(), &b.input, self.root, o),
            CollOp::ReduceScatter => c.reduce_scatter_single(out(), &b.input, redop, o),
            CollOp::AllToAll => c.all_to_all_single(out(), &b.input, o),
            CollOp::Scatter => c.scatter(out(), &b.views, self.root, o),
            CollOp::SendRecv => c.batch_p2p(&b.p2p, o),
        }
    }

    /// Runs `k` iterations: one at a time, or all issued asynchronously then waited for.
    pub(super) fn iterate(
        &self,
        op: CollOp,
        algo: Option<&str>,
        redop: ReduceOp,
        b: &Bufs,
        k: u32,
    ) -> Result<Instant> {
        if self.s.async_op {
            let o = self.opts(op, algo, true);
            let works = (0..k)
                .map(|_| self.issue(op, redop, b, &o))
                .collect::<torchcomms::Result<Vec<Work>>>()?;
            for w in works {
                w.wait()?;
            }
        } else {
            let o = self.opts(op, algo, false);
            for _ in 0..k {
                self.issue(op, redop, b, &o)?.wait()?;
            }
        }
        let issued = Instant::now();
        // On a GPU, wait() orders the default stream after the work: wait for that stream.
        self.mem.sync()?;
        Ok(issued)
    }

    pub(super) fn barrier(&self) -> Result<()> {
        self.comm
            .barrier(&OpOptions::sync())?
            .wait()
            .context("barrier")?;
        Ok(())
    }

    /// All-reduce of one f64 through the communicator.
    pub(super) fn reduce_scalar(&self, v: f64, op: ReduceOp) -> Result<f64> {
        Ok(self.reduce_vec(vec![v], op)?[0])
    }

    /// All-reduce of f64s through the communicator.
    pub(super) fn reduce_vec(&self, v: Vec<f64>, op: ReduceOp) -> Result<Vec<f64>> {
        let t = self.mem.upload(v)?;
        self.comm.all_reduce(&t, op, &OpOptions::sync())?.wait()?;
        self.mem.download::<f64>(t)
    }

    /// `--trace-ab`: times the one (op, dtype, redop, size) in blocks of `block` iterations
    /// with this communicator's colltrace recording and paused in turn (see [`ab`]), every rank
    /// switching before the same block. Returns the slowest rank's mean latency of every block
    /// and this rank's mismatches (with `--check`).
    pub(super) fn trace_ab(&self, block: u32, p: &Printer) -> Result<(Vec<f64>, u64)> {
        let (op, dtype) = (self.s.ops[0], self.s.dtypes[0]);
        let redop = self.s.redops.first().copied().unwrap_or(ReduceOp::Sum);
        let algo = self.s.algo.as_deref();
        let lay = layout(op, self.n, dtype, self.s.minbytes);
        let trace = colltrace::find(self.comm.get_name(), self.rank).with_context(|| {
            format!(
                "--trace-ab: communicator {} keeps no colltrace (TORCHCOMMS_TRACE_BUFFER_SIZE=0?)",
                self.comm.get_name()
            )
        })?;
        let bufs = self.bufs(
            op,
            self.mem.zeros(dtype, self.in_count(op, lay.count))?,
            lay.count,
        )?;
        self.barrier()?;
        self.iterate(op, algo, redop, &bufs, self.s.warmup)
            .context("warm-up")?;
        let blocks = (self.s.iters / block) as usize;
        let mut times = Vec::with_capacity(blocks);
        // Records each block added: every operation of an `on` block, none of an `off` one.
        let mut recorded = [0u64; 2];
        let control = self.s.ab_control;
        for k in 0..blocks {
            let on = ab::is_on(k);
            trace.set_recording(on && !control);
            self.barrier()?;
            let before = trace.recorded();
            let t0 = Instant::now();
            self.iterate(op, algo, redop, &bufs, block)
                .with_context(|| format!("block {k} of --trace-ab"))?;
            times.push(t0.elapsed().as_secs_f64() / f64::from(block));
            recorded[usize::from(on)] += trace.recorded() - before;
        }
        trace.set_recording(true);
        drop(bufs);
        // At least one record per operation issued (an operation may record more).
        let expected = if control {
            0
        } else {
            u64::from(block) * (blocks / 2) as u64
        };
        p.line(format!(
            "# trace-ab records taken: {} in on blocks (expected at least {expected}), {} in off \
             blocks (expected 0)",
            recorded[1], recorded[0]
        ));
        if recorded[0] != 0 || recorded[1] < expected || (control && recorded[1] != 0) {
            bail!(
                "--trace-ab: rank {} recorded {} operations in blocks with tracing on and {} with \
                 it paused (expected at least {expected} and 0): the switch does not act as it \
                 should",
                self.rank,
                recorded[1],
                recorded[0]
            );
        }
        let times = self.reduce_vec(times, ReduceOp::Max)?;
        let wrong = if self.s.check {
            with_elem!(dtype, T => self.check::<T>(op, algo, redop, lay.count)?,
                _ => bail!("dtype {dtype} is not known to the check"))
        } else {
            0
        };
        Ok((times, wrong))
    }

    /// Times one (op, algorithm, dtype, redop, size) and, with `check`, checks it. `Ok(Err)`
    /// with the reason when the backend refuses the algorithm for this call (every rank
    /// refuses alike: the choice depends only on what all ranks agree on).
    pub(super) fn measure(
        &self,
        op: CollOp,
        algo: Option<&str>,
        dtype: DataType,
        redop: ReduceOp,
        lay: Layout,
        check: bool,
    ) -> Result<std::result::Result<Row, String>> {
        let c = lay.count;
        let bufs = self.bufs(op, self.mem.zeros(dtype, self.in_count(op, c))?, c)?;
        let (warmup, iters) = self.s.iterations(lay.bytes);
        self.barrier()?;
        // The first warm-up iteration, on its own: an algorithm that cannot run this call
        // fails here, before anything was sent.
        if algo.is_some() {
            let first = self
                .issue(op, redop, &bufs, &self.opts(op, algo, false))
                .and_then(|w| w.wait());
            match first {
                Err(e) if e.kind() == ErrorKind::InvalidArgument => return Ok(Err(e.to_string())),
                other => other.context("warm-up")?,
            }
        }
        let warmup = if algo.is_some() {
            warmup.saturating_sub(1)
        } else {
            warmup
        };
        self.iterate(op, algo, redop, &bufs, warmup)
            .context("warm-up")?;
        self.barrier()?;
        let t0 = Instant::now();
        let issued = self
            .iterate(op, algo, redop, &bufs, iters)
            .context("timed iterations")?;
        let local = t0.elapsed().as_secs_f64() / f64::from(iters);
        let issuing = (issued - t0).as_secs_f64() / f64::from(iters);
        drop(bufs);
        let [secs, issue_secs] = self.reduce_vec(vec![local, issuing], ReduceOp::Max)?[..] else {
            bail!("reduce_vec returned another length");
        };
        let wrong = if check {
            let w = with_elem!(dtype, T => self.check::<T>(op, algo, redop, c)?,
                _ => bail!("dtype {dtype} is not known to the check"));
            Some(self.reduce_scalar(w as f64, ReduceOp::Sum)? as u64)
        } else {
            None
        };
        let algbw = if secs > 0.0 {
            lay.bytes as f64 / secs / 1e9
        } else {
            0.0
        };
        Ok(Ok(Row {
            op: op.name(),
            algo: algo.map(str::to_string),
            dtype: dtype.name(),
            redop: if op.reduces() { redop.name() } else { "none" },
            root: op.rooted().then_some(self.root),
            bytes: lay.bytes as u64,
            count: c as u64,
            time_us: secs * 1e6,
            issue_us: issue_secs * 1e6,
            algbw_gbps: algbw,
            busbw_gbps: algbw * op.bus_factor(self.n),
            wrong,
            nranks: self.n,
            rounds_us: Vec::new(),
        }))
    }

    /// Times one (op, dtype, redop, size) with each of `algos`, `--rounds` times in turn, and
    /// keeps the best round of each, with every round's time; checks the first round. Each
    /// round starts one algorithm later than the one before, so that no algorithm always runs
    /// first (after the previous size's run) or always after the same one.
    pub(super) fn measure_all(
        &self,
        op: CollOp,
        algos: &[Option<String>],
        dtype: DataType,
        redop: ReduceOp,
        lay: Layout,
    ) -> Result<Vec<Entry>> {
        let mut best: Vec<Option<Entry>> = vec![None; algos.len()];
        for round in 0..self.s.rounds {
            for turn in 0..algos.len() {
                let k = (turn + round as usize) % algos.len();
                let algo = &algos[k];
                if matches!(best[k], Some(Entry::Na(_))) {
                    continue;
                }
                let got = self.measure(
                    op,
                    algo.as_deref(),
                    dtype,
                    redop,
                    lay,
                    round == 0 && self.s.check,
                )?;
                best[k] = Some(match (got, best[k].take()) {
                    (Err(why), _) => Entry::Na(format!(
                        "  {:>10} {:>12} {:>6} {:>10} {:>5} {:>11} {:>12} {:>12} {:>7}  ({})",
                        lay.bytes,
                        lay.count,
                        dtype.name(),
                        if op.reduces() { redop.name() } else { "none" },
                        "-",
                        "n/a",
                        "n/a",
                        "n/a",
                        "n/a",
                        short_reason(&why)
                    )),
                    (Ok(row), Some(Entry::Row(mut old))) if old.time_us <= row.time_us => {
                        old.rounds_us.push(row.time_us);
                        Entry::Row(old)
                    }
                    (Ok(mut row), Some(Entry::Row(old))) => {
                        row.wrong = old.wrong;
                        row.rounds_us = old.rounds_us;
                        row.rounds_us.push(row.time_us);
                        Entry::Row(row)
                    }
                    (Ok(mut row), _) => {
                        row.rounds_us.push(row.time_us);
                        Entry::Row(row)
                    }
                });
            }
        }
        Ok(best
            .into_iter()
            .map(|e| e.expect("every algorithm ran at least one round"))
            .collect())
    }

    /// Runs the operation once on deterministic inputs; returns this rank's mismatches.
    pub(super) fn check<T: Elem>(
        &self,
        op: CollOp,
        algo: Option<&str>,
        redop: ReduceOp,
        c: usize,
    ) -> Result<u64> {
        let (n, rank, root) = (self.n, self.rank, self.root);
        let pat = if op.reduces() {
            Pattern::Reduce(redop)
        } else {
            Pattern::Move
        };
        let dt = T::DTYPE;
        let value = |r: usize, i: usize| input_value(dt, pat, n, r, i);
        let k = self.in_count(op, c);
        let data: Vec<T> = if op == CollOp::Broadcast && rank != root {
            vec![T::from_i64(0); k]
        } else {
            (0..k).map(|i| T::from_i64(value(rank, i))).collect()
        };
        let bufs = self.bufs(op, self.mem.upload(data)?, c)?;
        self.issue(op, redop, &bufs, &self.opts(op, algo, false))?
            .wait()?;
        let got: Vec<T> = self.mem.download(bufs.result())?;
        let blk = (c / n).max(1);
        let expect = |j: usize| match op {
            CollOp::AllReduce => reduce_expected::<T>(redop, n, j),
            CollOp::Reduce if rank == root => reduce_expected::<T>(redop, n, j),
            CollOp::Reduce => Expect::raw::<T>(value(rank, j)),
            CollOp::Broadcast => Expect::raw::<T>(value(root, j)),
            CollOp::AllGather | CollOp::Gather => Expect::raw::<T>(value(j / blk, j % blk)),
            CollOp::ReduceScatter => reduce_expected::<T>(redop, n, rank * blk + j),
            CollOp::AllToAll => Expect::raw::<T>(value(j / blk, rank * blk + j % blk)),
            CollOp::Scatter => Expect::raw::<T>(value(root, rank * blk + j)),
            CollOp::SendRecv => Expect::raw::<T>(value((rank + n - 1) % n, j)),
        };
        let wrong = got
            .iter()
            .enumerate()
            .filter(|&(j, &g)| !expect(j).matches(g))
            .count();
        if wrong > 0 {
            tracing::warn!(
                rank,
                op = op.name(),
                dtype = dt.name(),
                redop = redop.name(),
                count = c,
                wrong,
                "results differ from the expected values"
            );
        }
        Ok(wrong as u64)
    }
}

/// The part of an engine refusal that says why: the text in its last parentheses (which may
/// hold parentheses of their own), or all of it.
pub(super) fn short_reason(msg: &str) -> String {
    let Some(end) = msg.rfind(')') else {
        return msg.to_string();
    };
    let mut depth = 0usize;
    for (i, ch) in msg[..=end].char_indices().rev() {
        match ch {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    return msg[i + 1..end].to_string();
                }
            }
            _ => {}
        }
    }
    msg.to_string()
}
