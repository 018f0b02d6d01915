use colltrace::schema::{CommState, SeqCounters, State, SCHEMA_NAME, SCHEMA_VERSION};
use colltrace::Trigger;

use super::*;

fn rec(seq: u64, op: &str, count: u64, state: State, started_ns: u64) -> Record {
    Record {
        id: seq,
        kind: RecordKind::Collective,
        seq,
        op: op.into(),
        dtype: Some("f32".into()),
        count: Some(count),
        in_bytes: 4 * count,
        out_bytes: 4 * count,
        root: None,
        peer: None,
        peers: None,
        reduce_op: Some("sum".into()),
        async_op: None,
        algorithm: None,
        transport: None,
        timeout_ms: 1000,
        state,
        enqueued_ns: started_ns,
        started_ns,
        ended_ns: if state.is_final() { started_ns + 10 } else { 0 },
        error: None,
        detail: None,
    }
}

fn dump(rank: usize, size: usize, records: Vec<Record>) -> Dump {
    let done = records
        .iter()
        .filter(|r| r.state == State::Completed)
        .map(|r| r.seq)
        .max()
        .unwrap_or(0);
    let started = records
        .iter()
        .filter(|r| r.state != State::Queued)
        .map(|r| r.seq)
        .max()
        .unwrap_or(0);
    Dump {
        schema: SCHEMA_NAME.into(),
        version: SCHEMA_VERSION,
        rank,
        pid: 1,
        host: "h".into(),
        trigger: Trigger::Api,
        reason: None,
        dumped_at_ns: 10_000_000_000,
        endpoint: None,
        comms: vec![CommDump {
            name: "c".into(),
            instance: 1,
            rank,
            size,
            global_ranks: (0..size).collect(),
            transport: None,
            state: CommState::Active,
            error: None,
            buffer_size: 10,
            dropped: 0,
            created_ns: 0,
            collective: SeqCounters {
                enqueued: started,
                started,
                completed: done,
            },
            p2p: SeqCounters::default(),
            records,
        }],
    }
}

#[test]
fn two_ranks_that_disagree_are_both_named_and_queued_records_are_not_compared() {
    let a = dump(0, 2, vec![rec(1, "all_reduce", 2, State::Started, 5)]);
    let b = dump(
        1,
        2,
        vec![
            rec(1, "all_reduce", 3, State::Started, 5),
            rec(2, "barrier", 0, State::Queued, 6),
        ],
    );
    let v = analyze(&[a, b], Vec::new(), &Options::default());
    let c = &v.comms[0];
    assert_eq!(c.status, "mismatch");
    assert_eq!(c.mismatches.len(), 1);
    assert_eq!(c.mismatches[0].odd_ranks, vec![0, 1]);
    assert!(c.findings[0].contains("ranks disagree"), "{:?}", c.findings);
}

#[test]
fn a_rank_behind_is_named_with_what_the_others_run() {
    let mut recs = vec![rec(1, "all_reduce", 2, State::Completed, 1)];
    let a = dump(0, 3, recs.clone());
    recs.push(rec(2, "all_gather", 2, State::Started, 2));
    let b = dump(1, 3, recs.clone());
    let c = dump(2, 3, recs);
    let v = analyze(&[a, b, c], Vec::new(), &Options::default());
    let comm = &v.comms[0];
    assert_eq!(comm.behind.len(), 1);
    assert_eq!(comm.behind[0].rank, 0);
    assert!(
        comm.findings.iter().any(|f| f
            .contains("rank 0 is behind: it completed seq 1 and never called seq 2 (all_gather")),
        "{:?}",
        comm.findings
    );
    assert_eq!((comm.completed_by_all, comm.started_by_any), (1, 2));
}
