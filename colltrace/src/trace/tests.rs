use super::record::NO_RANK;
use super::*;
use crate::schema::SeqCounters;

fn meta() -> CommMeta {
    CommMeta {
        name: "unit".into(),
        instance: 1,
        rank: 1,
        size: 2,
        global_ranks: vec![4, 5],
    }
}

fn info(op: &'static str) -> OpInfo {
    OpInfo {
        op,
        ..OpInfo::default()
    }
}

#[test]
fn records_move_through_states_and_counters() {
    let t = CommTrace::new(meta(), 3);
    let mut w = t.writer();
    assert_eq!(t.meta().global_rank(), 5);
    let sub = |p2p, seq, op| t.submit(p2p, seq, op, Some(false), Duration::from_secs(1));
    let mut a = sub(false, 1, "all_reduce");
    let mut b = sub(true, 1, "send");
    let c = sub(false, 2, "barrier");
    for r in [&a, &b, &c] {
        t.publish(r.queued());
    }
    let d = t.snapshot();
    assert!(d.records.iter().all(|r| r.state == State::Queued));
    assert_eq!(
        d.collective,
        SeqCounters {
            enqueued: 2,
            started: 0,
            completed: 0
        }
    );
    w.start(&mut a, || info("all_reduce"), Some("shm"), None);
    w.start(&mut a, || info("all_reduce"), Some("shm"), Some("ring"));
    w.finish(&mut a, Outcome::Completed);
    w.start(&mut b, || info("send"), Some("socket"), None);
    w.finish(&mut b, Outcome::TimedOut(&"too slow"));
    w.finish(&mut b, Outcome::Completed);
    t.refuse(c, &"comm failed");
    let d = t.snapshot();
    assert_eq!(
        d.collective,
        SeqCounters {
            enqueued: 2,
            started: 1,
            completed: 1
        }
    );
    assert_eq!(
        d.p2p,
        SeqCounters {
            enqueued: 1,
            started: 1,
            completed: 0
        }
    );
    assert_eq!(d.records[0].algorithm.as_deref(), Some("ring"));
    assert_eq!(d.records[0].state, State::Completed);
    assert_eq!(d.records[1].state, State::TimedOut);
    assert_eq!(d.records[1].error.as_deref(), Some("too slow"));
    assert_eq!(d.records[2].state, State::Failed);
    // The ring keeps the last 3.
    for s in 3..7 {
        let mut r = sub(false, s, "barrier");
        w.finish(&mut r, Outcome::Completed);
    }
    let d = t.snapshot();
    assert_eq!(d.records.len(), 3);
    assert_eq!(d.dropped, 4);
    assert_eq!(d.records[0].seq, 4);
    assert!(d.records.iter().all(|r| r.state == State::Completed));
    assert_eq!(d.collective.enqueued, 6);
    assert_eq!(d.collective.completed, 6);
}

#[test]
fn comm_steps_have_their_own_sequence() {
    let t = CommTrace::new(meta(), 8);
    let h = t.begin_comm_op("init", Duration::from_secs(1), None);
    h.finish(Outcome::Completed);
    let h = t.begin_comm_op("split", Duration::from_secs(1), Some("child".into()));
    h.finish(Outcome::Failed(&"no"));
    let d = t.snapshot();
    assert_eq!(d.records[0].seq, 1);
    assert_eq!((d.records[1].seq, d.records[1].state), (2, State::Failed));
    assert_eq!(d.records[1].detail.as_deref(), Some("child"));
}

#[test]
fn capacity_zero_records_nothing() {
    let t = CommTrace::new(meta(), 0);
    let mut w = t.writer();
    let mut h = t.submit(false, 1, "x", None, Duration::ZERO);
    w.start(&mut h, OpInfo::default, None, None);
    w.finish(&mut h, Outcome::Completed);
    assert!(t.snapshot().records.is_empty());
}

#[test]
fn pausing_stops_and_resuming_restarts_recording() {
    let t = CommTrace::new(meta(), 100);
    let mut w = t.writer();
    assert!(t.is_recording());
    let run = |t: &CommTrace, w: &mut TraceWriter, seqs: std::ops::RangeInclusive<u64>| {
        for seq in seqs {
            let mut r = t.submit(false, seq, "all_reduce", None, Duration::from_secs(1));
            t.publish(r.queued());
            w.start(&mut r, || info("all_reduce"), Some("shm"), None);
            w.finish(&mut r, Outcome::Completed);
        }
    };
    run(&t, &mut w, 1..=3);
    // Submitted while recording, finished after the pause: recorded whole.
    let mut late = t.submit(false, 4, "all_reduce", None, Duration::from_secs(1));
    t.set_recording(false);
    assert!(!t.is_recording());
    w.start(&mut late, || info("all_reduce"), Some("shm"), None);
    w.finish(&mut late, Outcome::Completed);
    run(&t, &mut w, 5..=9);
    let h = t.begin_comm_op("split", Duration::from_secs(1), None);
    h.finish(Outcome::Completed);
    assert_eq!(t.recorded(), 4);
    let d = t.snapshot();
    assert_eq!(d.records.len(), 4);
    assert!(d.records.iter().all(|r| r.state == State::Completed));
    assert_eq!(d.collective.completed, 4);
    t.set_recording(true);
    run(&t, &mut w, 10..=11);
    assert_eq!(t.recorded(), 6);
    let d = t.snapshot();
    let seqs: Vec<u64> = d.records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 10, 11]);
    assert_eq!(d.dropped, 0, "paused operations are not dropped records");
    assert_eq!(d.collective.completed, 11);
    // A trace without a buffer cannot be resumed.
    let off = CommTrace::new(meta(), 0);
    off.set_recording(true);
    assert!(!off.is_recording());
    assert_eq!(off.submit(false, 1, "x", None, Duration::ZERO).q.id, 0);
}

/// Starts and at once finishes `rec`, an all_reduce.
fn run(w: &mut TraceWriter, rec: &mut OpRecord) {
    w.start(rec, || info("all_reduce"), None, None);
    w.finish(rec, Outcome::Completed);
}

/// Every record of `r` (from [`times`]) was enqueued, started and ended in that order.
fn assert_in_order(r: &[(u64, u64, u64)]) {
    for (enq, start, end) in r {
        assert!(enq <= start && start <= end, "{r:?}");
    }
}

/// Raw enqueue, start and end times of the records of `t`, by id.
fn times(t: &CommTrace) -> Vec<(u64, u64, u64)> {
    let ex = &t.exec;
    (0..ex.count.load(Ordering::Acquire) as usize)
        .map(|i| Rec::unpack(ex.slots[i].read().unwrap()))
        .map(|r| (r.enqueued, r.started, r.ended))
        .collect()
}

#[test]
fn a_queued_op_starts_where_the_previous_ended() {
    let t = CommTrace::new(meta(), 100);
    let mut w = t.writer();
    let sub = |s| t.submit(false, s, "all_reduce", None, Duration::from_secs(1));
    let (mut a, mut b, mut c) = (sub(1), sub(2), sub(3));
    run(&mut w, &mut a);
    w.start(&mut b, || info("all_reduce"), None, None);
    // The thread waits in between: c reads the clock.
    w.finish(&mut b, Outcome::Completed);
    w.idle();
    std::thread::sleep(Duration::from_millis(2));
    run(&mut w, &mut c);
    // Submitted after the previous end while the thread polled: starts at its enqueue.
    std::thread::sleep(Duration::from_millis(2));
    let (mut d, mut e) = (sub(4), sub(5));
    t.set_recording(false);
    let mut x = sub(6);
    t.set_recording(true);
    run(&mut w, &mut d);
    // An operation not recorded runs in between: e, queued before d ended, reads the clock.
    w.start(&mut x, || info("all_reduce"), None, None);
    std::thread::sleep(Duration::from_millis(2));
    w.finish(&mut x, Outcome::Completed);
    run(&mut w, &mut e);
    let r = times(&t);
    assert_eq!(r.len(), 5);
    assert_in_order(&r);
    assert_eq!(r[1].1, r[0].2, "b starts where a ended");
    assert!(r[2].1 > r[1].2, "c waited: {r:?}");
    assert!(r[3].1 > r[2].2 && r[3].1 == r[3].0, "d came later: {r:?}");
    assert!(
        r[4].0 <= r[3].2 && r[4].1 > r[3].2,
        "x ran in between: {r:?}"
    );
}

#[test]
fn an_op_found_while_polling_starts_at_its_enqueue_or_the_last_mark() {
    let t = CommTrace::new(meta(), 100);
    let mut w = t.writer();
    let sub = |s| t.submit(false, s, "all_reduce", None, Duration::from_secs(1));
    let mut a = sub(1);
    run(&mut w, &mut a);
    std::thread::sleep(Duration::from_millis(1));
    // b waits in the queue while the thread polls past a mark: it starts at the mark.
    let mut b = sub(2);
    std::thread::sleep(Duration::from_millis(1));
    w.mark();
    run(&mut w, &mut b);
    // c arrives after the last mark: found within a poll, it starts at its enqueue.
    w.mark();
    std::thread::sleep(Duration::from_millis(1));
    let mut c = sub(3);
    run(&mut w, &mut c);
    let r = times(&t);
    assert!(
        r[1].1 > r[1].0 && r[1].1 > r[0].2,
        "b started at the mark: {r:?}"
    );
    assert_eq!(r[2].1, r[2].0, "c started at its enqueue: {r:?}");
    assert_in_order(&r);
}

#[test]
fn after_a_completion_this_thread_saw_the_next_op_is_enqueued_at_its_start() {
    let t = CommTrace::new(meta(), 100);
    let mut w = t.writer();
    let sub = |s| t.submit(false, s, "all_reduce", None, Duration::from_secs(1));
    let mut a = sub(1);
    assert_ne!(a.q.enqueued, ENQUEUED_AT_START, "nothing waited yet");
    let waited = a.waited(&t);
    run(&mut w, &mut a);
    waited.note();
    let mut b = sub(2);
    assert_eq!(b.q.enqueued, ENQUEUED_AT_START, "no clock read");
    // Not shown queued (picked up within a poll), but counted as submitted.
    t.publish(b.queued());
    let d = t.snapshot();
    assert!(d.records.iter().all(|r| r.seq != 2), "{:?}", d.records);
    assert_eq!(d.collective.enqueued, 2);
    run(&mut w, &mut b);
    let r = times(&t);
    assert_eq!(
        (r[1].0, r[1].1),
        (r[0].2, r[0].2),
        "enqueued and started at a's end"
    );
    // Only the direct successor of what this thread waited for skips the clock.
    b.waited(&t).note();
    let (c, d) = (sub(3), sub(4));
    assert_eq!(c.q.enqueued, ENQUEUED_AT_START);
    assert_ne!(d.q.enqueued, ENQUEUED_AT_START);
    // While the progress thread sleeps, submissions read the clock, and so does a start
    // after it woke.
    b.waited(&t).note();
    w.park(true);
    let mut e = sub(5);
    b.waited(&t).note();
    let mut f = sub(6);
    assert_ne!(e.q.enqueued, ENQUEUED_AT_START);
    w.park(false);
    f.waited(&t).note();
    let g = sub(7);
    assert_eq!(g.q.enqueued, ENQUEUED_AT_START, "awake again");
    let mut c = c;
    run(&mut w, &mut c);
    w.idle();
    std::thread::sleep(Duration::from_millis(1));
    run(&mut w, &mut e);
    run(&mut w, &mut f);
    let r = times(&t);
    assert_eq!(r.len(), 5);
    assert!(r[3].1 > r[3].0, "e read the clock after the idle: {r:?}");
    assert_in_order(&r);
}

/// A trace, its writer, and an all_reduce whose start was pinned (after an idle, so by a
/// clock read) 2 ms ago and not recorded.
fn pinned_2_ms_ago() -> (Arc<CommTrace>, TraceWriter, OpRecord) {
    let t = CommTrace::new(meta(), 10);
    let mut w = t.writer();
    let a = t.submit(false, 1, "all_reduce", None, Duration::from_secs(1));
    w.idle();
    w.pin_start(&a);
    std::thread::sleep(Duration::from_millis(2));
    (t, w, a)
}

#[test]
fn a_start_recorded_later_keeps_the_pinned_time() {
    let (t, mut w, mut a) = pinned_2_ms_ago();
    assert!(!a.is_started());
    w.start(&mut a, || info("all_reduce"), None, None);
    assert!(a.is_started());
    w.finish(&mut a, Outcome::Completed);
    let (_, started, ended) = times(&t)[0];
    // 2 ms apart: at least 10^6 ticks of a TSC of 1 GHz or more, or of the ns clock.
    assert!(ended - started >= 1_000_000, "{started} {ended}");
}

#[test]
fn a_pinned_start_is_written_whole_later_and_dumps_wait_for_it() {
    let (t, mut w, mut a) = pinned_2_ms_ago();
    let details = || OpInfo {
        dtype: Some("float32"),
        count: Some(2),
        ..info("all_reduce")
    };
    let mut started_when_told = None;
    let ended = w.end_pinned_after(&mut a, || {
        // Nothing of the execution side is written before the caller is told.
        started_when_told = Some(t.exec.count.load(Ordering::Relaxed));
    });
    assert_eq!(started_when_told, Some(0));
    let ended = ended.expect("a pinned start is written later");
    // A dump taken now (the caller saw the completion) waits for the record.
    let dumper = {
        let t = Arc::clone(&t);
        std::thread::spawn(move || t.snapshot())
    };
    std::thread::sleep(Duration::from_millis(5));
    w.write_ended(ended, details, Some("shm"), Some("shm"));
    for d in [dumper.join().unwrap(), t.snapshot()] {
        let r = &d.records[0];
        assert_eq!(r.state, State::Completed);
        assert_eq!((r.dtype.as_deref(), r.count), (Some("float32"), Some(2)));
        assert_eq!(r.transport.as_deref(), Some("shm"));
        assert_eq!((d.collective.started, d.collective.completed), (1, 1));
        // Started at the pinned time, not when it was written.
        assert!(r.ended_ns - r.started_ns >= 1_000_000, "{r:?}");
    }

    // A record a long wait already started is finished at once.
    let mut b = t.submit(false, 2, "all_reduce", None, Duration::from_secs(1));
    w.pin_start(&b);
    w.start(&mut b, details, Some("shm"), Some("shm"));
    assert!(w.end_pinned_after(&mut b, || {}).is_none());
    let d = t.snapshot();
    assert_eq!(d.records.len(), 2);
    assert_eq!(d.records[1].state, State::Completed);
    assert_eq!(d.collective.completed, 2);
    assert_eq!(t.exec.unwritten.load(Ordering::Relaxed), 0);
}

#[test]
fn a_dump_taken_after_the_signal_waits_for_the_end() {
    let t = CommTrace::new(meta(), 10);
    let mut w = t.writer();
    let mut a = t.submit(false, 1, "all_reduce", None, Duration::from_secs(1));
    w.start(&mut a, || info("all_reduce"), None, None);
    let mut dumper = None;
    w.finish_after(&mut a, Outcome::Completed, || {
        // The caller saw the completion and dumps at once, before the end is written.
        let t = Arc::clone(&t);
        dumper = Some(std::thread::spawn(move || t.snapshot()));
        std::thread::sleep(Duration::from_millis(5));
    });
    let d = dumper.unwrap().join().unwrap();
    assert_eq!(d.records[0].state, State::Completed);
    assert_eq!(d.collective.completed, 1);
    assert_eq!(t.exec.unwritten.load(Ordering::Relaxed), 0);
}

#[test]
fn records_pack_and_unpack() {
    let q = Queued {
        id: 7,
        seq: 3,
        enqueued: 99,
        timeout_ms: u32::MAX,
        op: names::code("reduce_scatter"),
        kind: RecordKind::P2p,
        async_op: Some(true),
    };
    let back = Queued::unpack(q.pack());
    assert_eq!((back.id, back.seq, back.enqueued), (7, 3, 99));
    assert_eq!(
        (back.timeout_ms, back.op, back.kind),
        (u32::MAX, q.op, RecordKind::P2p)
    );
    assert_eq!(back.async_op, Some(true));
    let mut r = Rec::queued(&q);
    r.count = 12345678901;
    r.root = 5;
    r.peer = NO_RANK;
    r.dtype = names::code("bf16");
    r.reduce_op = names::code("max");
    r.algorithm = names::code("ring");
    r.transport = names::code("shm+socket");
    r.kind = RecordKind::Comm;
    for state in [
        State::Queued,
        State::Started,
        State::Completed,
        State::Failed,
        State::TimedOut,
    ] {
        r.state = state;
        for a in [None, Some(false), Some(true)] {
            r.async_op = a;
            assert_eq!(Rec::unpack(r.pack()), r);
        }
    }
    let rec = r.to_record(Clock::System, None);
    assert_eq!(
        (rec.op.as_str(), rec.dtype.as_deref()),
        ("reduce_scatter", Some("bf16"))
    );
    assert_eq!(
        (rec.root, rec.peer, rec.count),
        (Some(5), None, Some(12345678901))
    );
}

#[test]
fn only_the_first_writer_records() {
    let t = CommTrace::new(meta(), 4);
    let mut w = t.writer();
    let mut w2 = t.writer();
    let mut a = t.submit(false, 1, "all_reduce", None, Duration::from_secs(1));
    w2.start(&mut a, || info("all_reduce"), None, None);
    assert!(t.snapshot().records.is_empty());
    w.start(&mut a, || info("all_reduce"), None, None);
    assert_eq!(t.snapshot().records[0].state, State::Started);
}

#[test]
fn a_slot_is_read_whole_or_not_at_all() {
    let slot = Arc::new(Slot::<WORDS>::default());
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (slot, stop) = (Arc::clone(&slot), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                slot.write([k; WORDS]);
                // An operation's worth of other work between two records.
                for _ in 0..4 {
                    std::hint::spin_loop();
                }
            }
            k
        })
    };
    let (mut reads, mut moved) = (0u64, 0u64);
    let mut last = 0;
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_millis(500) {
        let w = slot
            .read()
            .expect("the writer never holds the slot for long");
        assert!(w.iter().all(|x| *x == w[0]), "torn read: {w:?}");
        moved += u64::from(w[0] != last);
        last = w[0];
        reads += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(
        reads > 1000 && written > 1000 && moved > 10,
        "{reads} {written} {moved}"
    );
}

#[test]
fn dumps_see_whole_records_while_the_writer_runs() {
    // A dump taken while the progress thread writes never shows a record mixed from two
    // operations (ids and sequence numbers move together; counts match them).
    let t = CommTrace::new(meta(), 8);
    let mut w = t.writer();
    let writer = {
        let t = Arc::clone(&t);
        std::thread::spawn(move || {
            for s in 1..=20_000u64 {
                let mut r = t.submit(false, s, "all_reduce", None, Duration::from_secs(1));
                let inf = || OpInfo {
                    op: "all_reduce",
                    count: Some(s * 3),
                    in_bytes: s * 12,
                    ..OpInfo::default()
                };
                w.start(&mut r, inf, Some("shm"), None);
                w.finish(&mut r, Outcome::Completed);
            }
        })
    };
    let mut checked = 0;
    while !writer.is_finished() || checked == 0 {
        for r in t.snapshot().records {
            assert_eq!(r.count, Some(r.seq * 3), "{r:?}");
            assert_eq!(r.in_bytes, r.seq * 12, "{r:?}");
            assert_eq!(r.id, r.seq, "{r:?}");
            // The end time and the state are written together (two words of the slot).
            assert_eq!(
                r.state == State::Completed,
                r.ended_ns >= r.started_ns && r.ended_ns > 0,
                "{r:?}"
            );
            checked += 1;
        }
    }
    writer.join().unwrap();
    let d = t.snapshot();
    assert_eq!(d.collective.completed, 20_000);
    assert_eq!(d.records.len(), 8);
    assert!(checked > 0);
}

#[test]
fn batch_peers_and_errors_survive_until_their_record_leaves() {
    let t = CommTrace::new(meta(), 2);
    let mut w = t.writer();
    let mut b = t.submit(true, 1, "batch", None, Duration::from_secs(1));
    let inf = || OpInfo {
        op: "batch",
        peers: vec![PeerTransfer {
            send: true,
            peer: 0,
            bytes: 8,
        }],
        ..OpInfo::default()
    };
    w.start(&mut b, inf, Some("socket"), None);
    w.finish(&mut b, Outcome::Failed(&"peer 0 lost"));
    let d = t.snapshot();
    assert_eq!(d.records[0].peers.as_ref().unwrap().len(), 1);
    assert_eq!(d.records[0].error.as_deref(), Some("peer 0 lost"));
    for s in 2..10 {
        let mut r = t.submit(true, s, "send", None, Duration::from_secs(1));
        w.finish(&mut r, Outcome::Failed(&"x"));
    }
    assert!(
        lock(&t.exec.extra).len() <= 4,
        "extras are evicted with their records"
    );
}
