//! One rank of the benchmark: creates the communicator, times every (op, dtype, redop, size),
//! checks the results, and on rank 0 prints the tables and writes the JSON.

use std::cell::Cell;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ctran::bootstrap::env::RankInfo;
use ctran::{DataType, ReduceOp};
use serde::Serialize;
use torchcomms::{new_comm, CommOptions, ErrorKind, OpOptions, P2POp, Tensor, TorchComm, Work};

use crate::ab;
use crate::check::{input_value, invalid_combo, reduce_expected, with_elem, Elem, Expect, Pattern};
use crate::cli::{CollOp, Settings};
use crate::device::{rank_device, Mem};

/// Exit status of a run that completed but found wrong results.
pub(crate) const WRONG_EXIT: u8 = 3;

/// One line of a table (and one object of the JSON array).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    op: &'static str,
    /// The algorithm asked for (`--algo`); `None` when the backend chose.
    algo: Option<String>,
    dtype: &'static str,
    redop: &'static str,
    /// The root rank, for operations that have one.
    root: Option<usize>,
    bytes: u64,
    count: u64,
    time_us: f64,
    /// Host time per iteration up to the last wait, before the final synchronize: on a GPU,
    /// where a wait only orders streams, `time_us` well above it means the device bounds the
    /// loop, and equal means the host does.
    issue_us: f64,
    algbw_gbps: f64,
    busbw_gbps: f64,
    /// Mismatching elements summed over ranks; `None` when not checked.
    wrong: Option<u64>,
    nranks: usize,
    /// With `--rounds`: the time of every round, in order (`time_us` is the best). Rounds time
    /// every algorithm in turn, so round `k` of two algorithms saw about the same background
    /// load: their paired ratios cancel what drifts between rounds.
    #[serde(skip_serializing_if = "one_round")]
    rounds_us: Vec<f64>,
}

fn one_round(rounds: &[f64]) -> bool {
    rounds.len() < 2
}

/// How much slower `a` is than `b`: the median over rounds of their paired ratios (see
/// [`Row::rounds_us`]); with one round, the ratio of the two times.
fn paired_ratio(a: &Row, b: &Row) -> f64 {
    let ratios: Vec<f64> = a
        .rounds_us
        .iter()
        .zip(&b.rounds_us)
        .filter(|&(_, &y)| y > 0.0)
        .map(|(x, y)| x / y)
        .collect();
    if ratios.is_empty() {
        return if b.time_us > 0.0 {
            a.time_us / b.time_us
        } else {
            1.0
        };
    }
    crate::ab::median(&ratios)
}

/// Bytes and element count of the operation's largest buffer for a requested size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    bytes: usize,
    count: usize,
}

fn layout(op: CollOp, n: usize, dtype: DataType, size: u64) -> Layout {
    let e = dtype.size_bytes();
    let unit = if op.splits() { n * e } else { e };
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    let bytes = size / unit * unit;
    Layout {
        bytes,
        count: bytes / e,
    }
}

/// The tensors of one operation on this rank.
struct Bufs {
    /// What the operation reads; the result too for in-place operations.
    input: Tensor,
    /// The result, for operations that write a separate tensor.
    output: Option<Tensor>,
    /// The root's per-rank views of `input` (scatter).
    views: Vec<Tensor>,
    /// The ring exchange (send_recv).
    p2p: Vec<P2POp>,
}

impl Bufs {
    /// The tensors of the result, dropping every view so the result can be read back.
    fn result(self) -> Tensor {
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
struct Bench<'a> {
    s: &'a Settings,
    comm: TorchComm,
    rank: usize,
    n: usize,
    root: usize,
    /// Host or device memory of this rank.
    mem: Mem,
}

impl Bench<'_> {
    /// Elements of this rank's input for an operation of `c` elements.
    fn in_count(&self, op: CollOp, c: usize) -> usize {
        match op {
            CollOp::AllGather | CollOp::Gather => c / self.n,
            CollOp::Scatter if self.rank != self.root => 0,
            _ => c,
        }
    }

    /// Elements of this rank's separate output, `None` for in-place operations.
    fn out_count(&self, op: CollOp, c: usize) -> Option<usize> {
        match op {
            CollOp::AllReduce | CollOp::Broadcast | CollOp::Reduce => None,
            CollOp::Gather if self.rank != self.root => Some(0),
            CollOp::ReduceScatter | CollOp::Scatter => Some(c / self.n),
            CollOp::AllGather | CollOp::Gather | CollOp::AllToAll | CollOp::SendRecv => Some(c),
        }
    }

    fn bufs(&self, op: CollOp, input: Tensor, c: usize) -> Result<Bufs> {
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

    fn opts(&self, op: CollOp, algo: Option<&str>, async_op: bool) -> OpOptions {
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

    fn issue(
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
    fn iterate(
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

    fn barrier(&self) -> Result<()> {
        self.comm
            .barrier(&OpOptions::sync())?
            .wait()
            .context("barrier")?;
        Ok(())
    }

    /// All-reduce of one f64 through the communicator.
    fn reduce_scalar(&self, v: f64, op: ReduceOp) -> Result<f64> {
        Ok(self.reduce_vec(vec![v], op)?[0])
    }

    /// All-reduce of f64s through the communicator.
    fn reduce_vec(&self, v: Vec<f64>, op: ReduceOp) -> Result<Vec<f64>> {
        let t = self.mem.upload(v)?;
        self.comm.all_reduce(&t, op, &OpOptions::sync())?.wait()?;
        self.mem.download::<f64>(t)
    }

    /// `--trace-ab`: times the one (op, dtype, redop, size) in blocks of `block` iterations
    /// with this communicator's colltrace recording and paused in turn (see [`ab`]), every rank
    /// switching before the same block. Returns the slowest rank's mean latency of every block
    /// and this rank's mismatches (with `--check`).
    fn trace_ab(&self, block: u32, p: &Printer) -> Result<(Vec<f64>, u64)> {
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
    fn measure(
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
    fn measure_all(
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
    fn check<T: Elem>(
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

/// auto counts as good as the best algorithm within this factor of its time.
const AUTO_TOLERANCE: f64 = 1.10;

/// One line of a table: a measured row, or the text of one that could not be measured.
#[derive(Debug, Clone)]
enum Entry {
    Row(Row),
    Na(String),
}

/// Table output of rank 0.
struct Printer {
    on: bool,
    /// Set once stdout failed (a closed pipe): the run goes on, since the other ranks need
    /// this one, and the rows still reach `--json`.
    broken: Cell<bool>,
}

impl Printer {
    fn line(&self, s: impl AsRef<str>) {
        if !self.on || self.broken.get() {
            return;
        }
        let mut out = std::io::stdout().lock();
        if let Err(e) = writeln!(out, "{}", s.as_ref()).and_then(|()| out.flush()) {
            tracing::warn!("cannot print the table any more: {e}");
            self.broken.set(true);
        }
    }

    fn table_header(&self, op: CollOp, algo: Option<&str>) {
        self.line("#");
        match algo {
            Some(a) => self.line(format!("# {} algo {a}", op.name())),
            None => self.line(format!("# {}", op.name())),
        }
        self.line(format!(
            "# {:>10} {:>12} {:>6} {:>10} {:>5} {:>11} {:>12} {:>12} {:>7}",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time(us)",
            "algbw(GB/s)",
            "busbw(GB/s)",
            "#wrong"
        ));
        self.line(format!("# {:>10} {:>12}", "(B)", "(elements)"));
    }

    fn entry(&self, e: &Entry) {
        match e {
            Entry::Row(r) => self.row(r),
            Entry::Na(text) => self.line(text),
        }
    }

    /// `--algo all`: for every size, the best algorithm and how auto compares; returns (sizes
    /// where auto is within [`AUTO_TOLERANCE`] of the best, sizes compared).
    fn auto_summary(
        &self,
        op: CollOp,
        algos: &[Option<String>],
        auto: usize,
        lines: &[Vec<Entry>],
    ) -> (usize, usize) {
        self.line("#");
        self.line(format!(
            "# {}: auto against the best algorithm: the one auto trails most by the median over \
             rounds of auto's time over its time in the same round (auto/best); times of the best \
             round",
            op.name()
        ));
        self.line(format!(
            "# {:>10} {:>6} {:>10} {:>18} {:>11} {:>11} {:>9}",
            "size", "type", "redop", "best", "best(us)", "auto(us)", "auto/best"
        ));
        let (mut within, mut of) = (0, 0);
        for line in lines {
            let Entry::Row(a) = &line[auto] else {
                continue;
            };
            let best = line
                .iter()
                .enumerate()
                .filter(|&(k, _)| k != auto)
                .filter_map(|(k, e)| match e {
                    Entry::Row(r) => Some((k, r, paired_ratio(a, r))),
                    Entry::Na(_) => None,
                })
                .max_by(|x, y| x.2.total_cmp(&y.2));
            let Some((k, b, ratio)) = best else {
                continue;
            };
            of += 1;
            let ok = ratio <= AUTO_TOLERANCE;
            within += usize::from(ok);
            self.line(format!(
                "  {:>10} {:>6} {:>10} {:>18} {:>11.2} {:>11.2} {:>9.2}{}",
                a.bytes,
                a.dtype,
                a.redop,
                algos[k].as_deref().unwrap_or("-"),
                b.time_us,
                a.time_us,
                ratio,
                if ok { "" } else { "  *" }
            ));
        }
        self.line(format!(
            "# {}: auto within {:.0}% of the best algorithm at {within} of {of} sizes (* beyond)",
            op.name(),
            (AUTO_TOLERANCE - 1.0) * 100.0
        ));
        (within, of)
    }

    fn row(&self, r: &Row) {
        let root = r.root.map_or_else(|| "-1".to_string(), |x| x.to_string());
        let wrong = r.wrong.map_or_else(|| "N/A".to_string(), |w| w.to_string());
        self.line(format!(
            "  {:>10} {:>12} {:>6} {:>10} {:>5} {:>11.2} {:>12.3} {:>12.3} {:>7}",
            r.bytes, r.count, r.dtype, r.redop, root, r.time_us, r.algbw_gbps, r.busbw_gbps, wrong
        ));
    }
}

/// Runs this process as `info.rank` of the job; returns the process's exit status.
pub(crate) fn run_rank(s: &Settings, info: &RankInfo) -> Result<ExitCode> {
    let mut copts = CommOptions::from_env().context("reading TORCHCOMM_* options")?;
    if let Some(t) = s.timeout {
        copts.timeout = t;
    }
    let device = rank_device(s.device, info.local_rank.unwrap_or(info.rank))?;
    let mem = Mem::new(device)?;
    let comm = new_comm(&s.backend, device, "torchcomms-perf", copts).with_context(|| {
        format!(
            "creating the {} communicator ({} of {} ranks, from {})",
            s.backend, info.rank, info.size, info.source
        )
    })?;
    let (rank, n) = (comm.get_rank(), comm.get_size());
    if s.root >= n {
        bail!(
            "invalid value for '--root': {} is not a rank (the job has {n} ranks)",
            s.root
        );
    }
    let b = Bench {
        s,
        comm,
        rank,
        n,
        root: s.root,
        mem,
    };
    let p = Printer {
        on: rank == 0,
        broken: Cell::new(false),
    };
    let version = b
        .comm
        .get_backend_version()
        .unwrap_or_else(|_| "unknown version".into());
    p.line(format!(
        "# torchcomms-perf {}: nranks {n}, backend {} ({version}), device {}, ranks from {}",
        env!("CARGO_PKG_VERSION"),
        s.backend,
        device,
        info.source
    ));
    p.line(format!(
        "#   minbytes {} maxbytes {} step x{} warmup {} iters {} check {} {} ops, algo {}",
        s.minbytes,
        s.maxbytes,
        s.stepfactor,
        s.warmup,
        s.iters,
        if s.check { "on" } else { "off" },
        if s.async_op { "async" } else { "sync" },
        s.algo.as_deref().unwrap_or("default")
    ));
    if let Some(block) = s.trace_ab {
        return run_trace_ab(&b, &p, block);
    }
    let sizes = s.sizes();
    let mut rows: Vec<Row> = Vec::new();
    let mut bw_sum = 0.0;
    let mut auto_score = (0usize, 0usize);
    for &op in &s.ops {
        if op == CollOp::SendRecv && n < 2 {
            p.line("#");
            p.line("# send_recv: skipped (needs at least 2 ranks)");
            continue;
        }
        let algos = match s.algos_for(op) {
            Ok(a) => a,
            Err(why) => {
                p.line("#");
                p.line(format!("# {}: skipped ({why})", op.name()));
                continue;
            }
        };
        // One algorithm: rows print as they come. Several: every size is timed with each in
        // turn (so that they see the same background load), the tables print at the end.
        let live = algos.len() == 1;
        if live {
            p.table_header(op, algos[0].as_deref());
        }
        // One line per (dtype, redop, size), one entry per algorithm.
        let mut lines: Vec<Vec<Entry>> = Vec::new();
        let redops: &[ReduceOp] = if op.reduces() {
            &s.redops
        } else {
            &[ReduceOp::Sum]
        };
        for &dtype in &s.dtypes {
            for &redop in redops {
                if op.reduces() {
                    if let Some(why) = invalid_combo(dtype, redop) {
                        let e = Entry::Na(format!(
                            "  {:>10} {:>12} {:>6} {:>10} {:>5} {:>11} {:>12} {:>12} {:>7}  ({why})",
                            "-", "-", dtype.name(), redop.name(), "-", "n/a", "n/a", "n/a", "n/a"
                        ));
                        if live {
                            p.entry(&e);
                        }
                        lines.push(vec![e; algos.len()]);
                        continue;
                    }
                }
                let mut last = None;
                for &size in &sizes {
                    let lay = layout(op, n, dtype, size);
                    if last == Some(lay) {
                        continue;
                    }
                    last = Some(lay);
                    let line = b
                        .measure_all(op, &algos, dtype, redop, lay)
                        .with_context(|| {
                            format!(
                                "{} of {} bytes ({}, {})",
                                op.name(),
                                lay.bytes,
                                dtype,
                                redop.name()
                            )
                        })?;
                    if live {
                        p.entry(&line[0]);
                    }
                    lines.push(line);
                }
            }
        }
        if !live {
            for (k, algo) in algos.iter().enumerate() {
                p.table_header(op, algo.as_deref());
                for line in &lines {
                    p.entry(&line[k]);
                }
            }
        }
        let mine: Vec<&Row> = lines
            .iter()
            .flatten()
            .filter_map(|e| match e {
                Entry::Row(r) => Some(r),
                Entry::Na(_) => None,
            })
            .collect();
        if !mine.is_empty() {
            let sum: f64 = mine.iter().map(|r| r.busbw_gbps).sum();
            bw_sum += sum;
            p.line(format!(
                "# {} avg bus bandwidth: {:.3} GB/s",
                op.name(),
                sum / mine.len() as f64
            ));
        }
        rows.extend(mine.into_iter().cloned());
        if let Some(auto) = algos.iter().position(|a| a.as_deref() == Some("auto")) {
            if algos.len() > 2 {
                let (within, of) = p.auto_summary(op, &algos, auto, &lines);
                auto_score.0 += within;
                auto_score.1 += of;
            }
        }
    }
    let wrong: u64 = rows.iter().filter_map(|r| r.wrong).sum();
    p.line("#");
    if s.check {
        p.line(format!(
            "# Out of bounds values : {wrong} {}",
            if wrong == 0 { "OK" } else { "FAILED" }
        ));
    } else {
        p.line("# Out of bounds values : not checked (-c 0)");
    }
    if auto_score.1 > 0 {
        p.line(format!(
            "# auto within {:.0}% of the best algorithm: {} of {} sizes",
            (AUTO_TOLERANCE - 1.0) * 100.0,
            auto_score.0,
            auto_score.1
        ));
    }
    if !rows.is_empty() {
        p.line(format!(
            "# Avg bus bandwidth    : {:.3} GB/s",
            bw_sum / rows.len() as f64
        ));
    }
    if let Some(kib) = peak_rss_kib() {
        let largest = rows.iter().map(|r| r.bytes).max().unwrap_or(0);
        p.line(format!(
            "# Peak memory (VmHWM) : {:.1} MiB on rank {rank}, largest message {:.1} MiB",
            kib as f64 / 1024.0,
            largest as f64 / (1 << 20) as f64
        ));
    }
    p.line("#");
    if rank == 0 {
        if let Some(path) = &s.json {
            let f = File::create(path)
                .with_context(|| format!("creating the --json file {}", path.display()))?;
            let mut w = BufWriter::new(f);
            let written: Result<()> = (|| {
                serde_json::to_writer_pretty(&mut w, &rows)?;
                w.write_all(b"\n")?;
                w.flush()?;
                Ok(())
            })();
            written.with_context(|| format!("writing the --json file {}", path.display()))?;
        }
    }
    b.comm.finalize().context("finalize")?;
    Ok(if wrong > 0 {
        ExitCode::from(WRONG_EXIT)
    } else {
        ExitCode::SUCCESS
    })
}

/// `--trace-ab` on this rank: the blocks, then on rank 0 the report.
fn run_trace_ab(b: &Bench<'_>, p: &Printer, block: u32) -> Result<ExitCode> {
    let s = b.s;
    let (op, dtype) = (s.ops[0], s.dtypes[0]);
    let lay = layout(op, b.n, dtype, s.minbytes);
    let (times, wrong) = b.trace_ab(block, p)?;
    let wrong = if s.check {
        b.reduce_scalar(wrong as f64, ReduceOp::Sum)? as u64
    } else {
        0
    };
    let sum = ab::summarize(&times);
    let us = |x: f64| x * 1e6;
    let pct = |x: f64| x * 100.0;
    p.line("#");
    p.line(format!(
        "# trace-ab: {} {} B {} {}, {} blocks of {block} iterations ({} groups: off on on off, \
         on off off on), time of the slowest rank{}",
        op.name(),
        lay.bytes,
        dtype.name(),
        if op.reduces() {
            s.redops.first().map_or("sum", |r| r.name())
        } else {
            "none"
        },
        times.len(),
        sum.groups,
        if s.ab_control {
            "; control run: recording paused in both settings"
        } else {
            ""
        }
    ));
    p.line(format!(
        "#   tracing off: median of block means {:.3} us",
        us(sum.off)
    ));
    p.line(format!(
        "#   tracing on:  median of block means {:.3} us",
        us(sum.on)
    ));
    p.line(format!(
        "#   on/off, median of the paired ratios of the groups: {:+.2}% (bootstrap 95% CI \
         {:+.2}% .. {:+.2}%)",
        pct(sum.ratio),
        pct(sum.ci.0),
        pct(sum.ci.1)
    ));
    // One line for scripts (colltrace/benches/overhead.sh).
    p.line(format!(
        "trace-ab nranks={} blocks={} block={block} groups={} off_us={:.4} on_us={:.4} \
         ratio={:.5} lo={:.5} hi={:.5}",
        b.n,
        times.len(),
        sum.groups,
        us(sum.off),
        us(sum.on),
        sum.ratio,
        sum.ci.0,
        sum.ci.1
    ));
    if s.check {
        p.line(format!(
            "# Out of bounds values : {wrong} {}",
            if wrong == 0 { "OK" } else { "FAILED" }
        ));
    }
    p.line("#");
    b.comm.finalize().context("finalize")?;
    Ok(if wrong > 0 {
        ExitCode::from(WRONG_EXIT)
    } else {
        ExitCode::SUCCESS
    })
}

/// The part of an engine refusal that says why: the text in its last parentheses (which may
/// hold parentheses of their own), or all of it.
fn short_reason(msg: &str) -> String {
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

/// This process's peak resident memory in KiB (`VmHWM` of /proc/self/status), where available.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timed(rounds: &[f64]) -> Row {
        Row {
            op: "all_reduce",
            algo: None,
            dtype: "f32",
            redop: "sum",
            root: None,
            bytes: 8,
            count: 2,
            time_us: rounds.iter().copied().fold(f64::INFINITY, f64::min),
            issue_us: 0.0,
            algbw_gbps: 0.0,
            busbw_gbps: 0.0,
            wrong: None,
            nranks: 2,
            rounds_us: rounds.to_vec(),
        }
    }

    #[test]
    fn the_paired_ratio_is_the_median_of_same_round_ratios() {
        // The best rounds alone (10 against 5) would call `a` twice as slow; round by round it
        // is twice as fast in two rounds of three.
        let (a, b) = (timed(&[10.0, 100.0, 30.0]), timed(&[20.0, 200.0, 5.0]));
        assert_eq!(paired_ratio(&a, &b), 0.5);
        assert_eq!(paired_ratio(&b, &a), 2.0);
        // One round each: the plain ratio.
        assert_eq!(paired_ratio(&timed(&[3.0]), &timed(&[2.0])), 1.5);
        assert!(!serde_json::to_string(&timed(&[3.0]))
            .unwrap()
            .contains("rounds_us"));
    }

    #[test]
    fn layouts_follow_nccl_tests() {
        let l = layout(CollOp::AllReduce, 3, DataType::F32, 10);
        assert_eq!(l, Layout { bytes: 8, count: 2 });
        let l = layout(CollOp::AllGather, 3, DataType::F32, 100);
        assert_eq!(
            l,
            Layout {
                bytes: 96,
                count: 24
            }
        );
        let l = layout(CollOp::Scatter, 4, DataType::F64, 8);
        assert_eq!(l, Layout { bytes: 0, count: 0 });
        let l = layout(CollOp::SendRecv, 4, DataType::Bool, 7);
        assert_eq!(l, Layout { bytes: 7, count: 7 });
    }

    #[test]
    fn refusals_keep_their_reason() {
        assert_eq!(
            short_reason("x: expected one of auto, direct (tree needs all 2 blocks to fit one staging chunk (1048576 bytes)), got tree"),
            "tree needs all 2 blocks to fit one staging chunk (1048576 bytes)"
        );
        assert_eq!(short_reason("no parentheses"), "no parentheses");
        assert_eq!(short_reason("unbalanced)"), "unbalanced)");
    }

    #[test]
    fn bus_factors() {
        assert_eq!(CollOp::AllReduce.bus_factor(4), 1.5);
        assert_eq!(CollOp::AllGather.bus_factor(4), 0.75);
        assert_eq!(CollOp::Broadcast.bus_factor(4), 1.0);
        assert_eq!(CollOp::AllReduce.bus_factor(1), 0.0);
    }
}
