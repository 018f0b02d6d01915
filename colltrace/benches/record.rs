//! Cost of recording one operation (submit, start, algorithm, end): what tracing adds to every
//! collective. Compare with the 8 B all_reduce latency of `torchcomms-perf`
//! (docs/perf/colltrace.md).

#![allow(missing_docs)] // criterion_group! generates an undocumented public fn.

use std::hint::black_box;
use std::time::Duration;

use colltrace::{CommMeta, CommTrace, OpInfo, Outcome};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};

/// What the engine records for an 8 B f32 sum all_reduce.
fn all_reduce_info() -> OpInfo {
    OpInfo {
        op: "all_reduce",
        dtype: Some("f32"),
        count: Some(2),
        in_bytes: 8,
        out_bytes: 8,
        reduce_op: Some("sum"),
        ..OpInfo::default()
    }
}

fn record(c: &mut Criterion) {
    // As at communicator creation (sets up the clock).
    colltrace::configure(&colltrace::TraceConfig::default());
    c.bench_function("now_ns", |b| b.iter(|| black_box(colltrace::now_ns())));
    let meta = CommMeta {
        name: "bench".into(),
        instance: 1,
        rank: 0,
        size: 4,
        global_ranks: vec![0, 1, 2, 3],
    };
    // The last case: recording paused at run time (`torchcomms-perf --trace-ab`), which should
    // cost what a buffer of 0 costs.
    for (cap, paused) in [(2000usize, false), (0, false), (2000, true)] {
        let trace = CommTrace::new(meta.clone(), cap);
        let mut w = trace.writer();
        trace.set_recording(!paused);
        let name = format!(
            "one all_reduce record, buffer {cap}{}",
            if paused { ", paused" } else { "" }
        );
        let mut seq = 0;
        c.bench_function(&name, |b| {
            b.iter(|| {
                seq += 1;
                let mut h = trace.submit(
                    false,
                    seq,
                    "all_reduce",
                    Some(false),
                    Duration::from_secs(600),
                );
                trace.publish(h.queued());
                w.start(&mut h, all_reduce_info, Some("shm"), Some("shm"));
                w.finish(&mut h, Outcome::Completed);
                black_box(h);
            })
        });
    }
    // The two halves: what the calling thread and the progress thread each spend.
    let trace = CommTrace::new(meta, 2000);
    let mut w = trace.writer();
    let seq = std::cell::Cell::new(0);
    let submit = || {
        seq.set(seq.get() + 1);
        trace.submit(
            false,
            seq.get(),
            "all_reduce",
            Some(false),
            Duration::from_secs(600),
        )
    };
    c.bench_function("calling thread: submit (critical path)", |b| {
        b.iter(|| black_box(submit()))
    });
    // A synchronous caller saw the previous operation complete: no clock read.
    c.bench_function(
        "calling thread: submit after waiting for the previous (critical path)",
        |b| {
            b.iter(|| {
                let h = submit();
                h.waited(&trace).note();
                black_box(h)
            })
        },
    );
    c.bench_function("calling thread: publish (after the hand-over)", |b| {
        b.iter_batched(
            &submit,
            |h| trace.publish(h.queued()),
            BatchSize::SmallInput,
        )
    });
    // A synchronous caller: the progress thread waited for each operation (two clock reads).
    c.bench_function("progress thread: start + finish", |b| {
        b.iter_batched(
            &submit,
            |mut h| {
                w.idle();
                w.start(&mut h, all_reduce_info, Some("shm"), Some("shm"));
                w.finish(&mut h, Outcome::Completed);
                h
            },
            BatchSize::SmallInput,
        )
    });
    // Operations queued behind one another (asynchronous callers; here the batch of submitted
    // operations), or found while the thread polled (synchronous callers): each starts at the
    // anchor, one clock read instead of two. In the engine a synchronous operation's end
    // (`finish_after`) comes after its caller was told.
    c.bench_function(
        "progress thread: start + finish, queued behind the previous or found while polling",
        |b| {
            b.iter_batched(
                &submit,
                |mut h| {
                    w.start(&mut h, all_reduce_info, Some("shm"), Some("shm"));
                    w.finish(&mut h, Outcome::Completed);
                    h
                },
                BatchSize::SmallInput,
            )
        },
    );
}

criterion_group!(benches, record);
criterion_main!(benches);
