//! One rank of the benchmark: creates the communicator, times every (op, dtype, redop, size),
//! checks the results, and on rank 0 prints the tables and writes the JSON.

mod print;
mod rank;
mod row;
#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use ctran::bootstrap::env::RankInfo;
use ctran::ReduceOp;
use torchcomms::{new_comm, CommOptions};

use crate::ab;
use crate::check::invalid_combo;
use crate::cli::{CollOp, Settings};
use crate::device::{rank_device, Mem};
use print::{Entry, Printer, AUTO_TOLERANCE};
use rank::Bench;
use row::{layout, Row};

/// Exit status of a run that completed but found wrong results.
pub(crate) const WRONG_EXIT: u8 = 3;

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

/// This process's peak resident memory in KiB (`VmHWM` of /proc/self/status), where available.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
