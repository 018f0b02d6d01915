//! Which threads may issue on a communicator: threads taking turns (also with the other's work
//! still in flight) run; a thread issuing while another is mid-issue aborts the communicator on
//! every rank. Ranks are threads of this process over real TCP on loopback.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ctran::bootstrap::HashStore;
use ctran::{Comm, CommConfig, DataType, Error, Op, ReduceOp, Span};

fn with_ranks<R: Send>(n: usize, name: &str, f: impl Fn(&Comm) -> R + Sync) -> Vec<R> {
    let store: Arc<HashStore> = Arc::new(HashStore::new());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let store = Arc::clone(&store);
                let f = &f;
                s.spawn(move || {
                    let mut cfg = CommConfig::from_env(name.to_string(), rank, n).unwrap();
                    cfg.timeout = Duration::from_secs(20);
                    let comm = Comm::init(cfg, store).unwrap();
                    f(&comm)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn sum_of(v: &mut [f32]) -> Op {
    Op::AllReduce {
        // SAFETY: each test waits for its operation before touching or dropping the vector.
        buf: unsafe { Span::from_raw(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) },
        dtype: DataType::F32,
        op: ReduceOp::Sum,
    }
}

/// The pattern of PyTorch's autograd: one thread issues and returns with its operation in
/// flight, another issues the next one. Issue order is the same on every rank, so both run.
#[test]
fn threads_taking_turns_run_with_the_others_work_in_flight() {
    const N: usize = 3;
    let sums = with_ranks(N, "issuing-turns", |c| {
        let me = c.rank() as f32;
        let mut first = vec![me + 1.0; 1 << 20];
        let mut second = vec![10.0 * (me + 1.0); 1 << 20];
        let in_flight = std::thread::scope(|s| {
            s.spawn(|| {
                let _turn = c.claim_issuer("all_reduce").unwrap();
                c.submit(sum_of(&mut first), None)
            })
            .join()
            .unwrap()
        });
        {
            let _turn = c
                .claim_issuer("all_reduce")
                .expect("a turn after the other thread's");
            c.run(sum_of(&mut second), None).unwrap();
        }
        in_flight
            .wait_timeout(Duration::from_secs(20), c.rank())
            .unwrap();
        let same = |v: &[f32]| v.iter().all(|x| *x == v[0]);
        assert!(same(&first) && same(&second), "rank {}", c.rank());
        (first[0], second[0])
    });
    assert!(sums.iter().all(|s| *s == (6.0, 60.0)), "{sums:?}");
}

/// Rank 0 issues from a second thread while its first thread is mid-issue: rank 0 is refused
/// with the reason, and every peer's next operation fails instead of pairing what is left.
#[test]
fn a_thread_issuing_while_another_is_mid_issue_aborts_every_rank() {
    const N: usize = 3;
    let errors = with_ranks(N, "issuing-overlap", |c| {
        let mut v = vec![1.0f32; 16];
        if c.rank() == 0 {
            let (held, released) = (Barrier::new(2), Barrier::new(2));
            let refusal = std::thread::scope(|s| {
                s.spawn(|| {
                    let _turn = c.claim_issuer("broadcast").unwrap();
                    held.wait();
                    released.wait();
                });
                held.wait();
                let refusal = c.claim_issuer("all_reduce").map(drop);
                released.wait();
                refusal
            });
            let err = refusal.expect_err("an issue overlapping another thread's ran");
            assert!(matches!(err, Error::Aborted { .. }), "{err}");
            assert!(err.to_string().contains("second thread"), "{err}");
        }
        let start = Instant::now();
        let result = c.run(sum_of(&mut v), None);
        (result.map_err(|e| e.to_string()), start.elapsed())
    });
    for (rank, (result, took)) in errors.into_iter().enumerate() {
        let err = result.expect_err("an operation ran after the communicator was aborted");
        assert!(err.contains("second thread"), "rank {rank}: {err}");
        assert!(took < Duration::from_secs(15), "rank {rank} took {took:?}");
    }
}
