//! The helper threads of a rank that run lanes 1.. of a shared-memory collective while the
//! progress thread runs lane 0, on hosts with more cores than local ranks: one thread copies
//! about a sixth of what a socket's memory moves, so a rank with one thread leaves most of it
//! unused.
//!
//! A helper spins briefly after each operation, then sleeps until it is handed the next. A lane
//! that fails stops the others of its rank (they see the team's abort flag in their waits), and
//! the operation's error is the first lane's own failure, not the stop it caused elsewhere.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use super::lane::{agreed_bytes, part_of, unit_of, Lane};
use super::{run_one, ShmCtx, ShmFail, Waiting, LONG_WAIT};
use crate::comm::Op;
use crate::error::Result;
use crate::transport::shm::node::Node;
use crate::transport::TransportError;

/// Operations this process ran cut into lanes (tests check that lanes ran).
static LANED: AtomicU64 = AtomicU64::new(0);

/// Shared-memory collectives this process has run cut into lanes.
pub fn laned_operations() -> u64 {
    LANED.load(Ordering::Relaxed)
}

/// What a lane ended with: the outer error refused the arguments before anything moved.
type Outcome = Result<Result<(), ShmFail>>;

/// A rank's helper threads, one per lane after the first.
#[derive(Debug)]
pub struct Team {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// This rank's view of each helper lane, to wake a helper sleeping in one of its waits.
    bells: Vec<Node>,
    /// Operations of fewer bytes run on lane 0 alone.
    min_bytes: usize,
}

#[derive(Debug)]
struct Shared {
    /// Bumped for each operation handed out.
    generation: AtomicU64,
    /// Per helper: the part it runs next.
    jobs: Vec<Mutex<Option<Job>>>,
    /// Per helper: how its last part ended.
    outcomes: Vec<Mutex<Option<Outcome>>>,
    /// Helpers still running the current operation.
    pending: AtomicUsize,
    /// A lane of this rank failed: the others stop waiting.
    abort: AtomicBool,
    shutdown: AtomicBool,
    /// How long an idle helper spins before it sleeps.
    spin: Duration,
}

#[derive(Debug)]
struct Job {
    op: Op,
    /// Lanes the operation is cut into.
    parts: usize,
    /// The whole operation's size that decided the cut.
    whole: usize,
    nranks: usize,
    seq: u64,
    deadline: Instant,
    /// The thread that waits for the parts (the progress thread).
    waker: Thread,
}

impl Team {
    /// Starts one helper per lane in `lanes` (lanes 1.. of the rank); `node` is lane 0's view.
    pub(crate) fn start(
        node: &Node,
        lanes: Vec<Lane>,
        min_bytes: usize,
        spin: Duration,
    ) -> std::io::Result<Team> {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            jobs: lanes.iter().map(|_| Mutex::new(None)).collect(),
            outcomes: lanes.iter().map(|_| Mutex::new(None)).collect(),
            pending: AtomicUsize::new(0),
            abort: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            spin,
        });
        let bells = (1..=lanes.len()).map(|l| node.lane(l)).collect();
        let mut threads = Vec::new();
        for (i, lane) in lanes.into_iter().enumerate() {
            let s = Arc::clone(&shared);
            threads.push(
                thread::Builder::new()
                    .name(format!("tc-shm-lane{}", i + 1))
                    .spawn(move || helper(&s, i, lane))?,
            );
        }
        Ok(Team {
            shared,
            threads,
            bells,
            min_bytes,
        })
    }

    /// Lanes, the progress thread's included.
    pub fn lanes(&self) -> usize {
        self.threads.len() + 1
    }

    /// Whether `op`, whose size every rank agrees on, is cut into lanes: reductions from a
    /// quarter of the threshold (they spend more per byte, so lanes pay earlier), moves from
    /// the threshold.
    pub(super) fn cuts(&self, op: &Op) -> Option<usize> {
        let bytes = agreed_bytes(op)?;
        let min = match op {
            Op::AllReduce { .. } | Op::Reduce { .. } | Op::ReduceScatter { .. } => {
                self.min_bytes / 4
            }
            _ => self.min_bytes,
        };
        (bytes >= min).then_some(bytes)
    }

    /// Whether an all_to_all of which all ranks together send `total` bytes is cut.
    pub(super) fn cuts_all_to_all(&self, total: usize, nranks: usize) -> bool {
        total >= self.min_bytes.saturating_mul(nranks)
    }

    /// Whether `op` is likely cut into lanes, for hints only (see
    /// [`crate::comm::Request::expect_long`]): an all_to_all is cut on its ranks' totals,
    /// known after its first barrier, and guessed here from this rank's.
    pub fn likely_cuts(&self, op: &Op, nranks: usize) -> bool {
        match op {
            Op::AllToAll { inputs, .. } => {
                let mine: usize = inputs.iter().map(|s| s.len()).sum();
                self.cuts_all_to_all(mine.saturating_mul(nranks), nranks)
            }
            _ => self.cuts(op).is_some(),
        }
    }

    /// Runs `op` (of agreed size `whole`) cut into lanes: the helpers run parts 1.. as whole
    /// operations on their lanes, and `first` runs part 0 here with `cx`.
    pub(super) fn run(
        &self,
        cx: &mut ShmCtx<'_>,
        op: &Op,
        whole: usize,
        nranks: usize,
        first: impl FnOnce(&mut ShmCtx<'_>, &Op) -> Outcome,
    ) -> Outcome {
        let lanes = self.lanes();
        let unit = unit_of(op);
        let sh = &self.shared;
        LANED.fetch_add(1, Ordering::Relaxed);
        sh.abort.store(false, Ordering::Relaxed);
        sh.pending.store(lanes - 1, Ordering::Relaxed);
        for (i, job) in sh.jobs.iter().enumerate() {
            *job.lock().expect("job slot") = Some(Job {
                op: part_of(op, i + 1, lanes, unit),
                parts: lanes,
                whole,
                nranks,
                seq: cx.seq,
                deadline: cx.deadline,
                waker: thread::current(),
            });
        }
        sh.generation.fetch_add(1, Ordering::Release);
        for t in &self.threads {
            t.thread().unpark();
        }
        let first = {
            let outer = &mut *cx.alive;
            let mut alive = || {
                if sh.abort.load(Ordering::Acquire) {
                    return Err(TransportError::Aborted);
                }
                outer()
            };
            let mut sub = ShmCtx {
                lane: &mut *cx.lane,
                parts: lanes,
                whole,
                deadline: cx.deadline,
                seq: cx.seq,
                alive: &mut alive,
                waiting: &mut *cx.waiting,
            };
            first(&mut sub, &part_of(op, 0, lanes, unit))
        };
        if !matches!(first, Ok(Ok(()))) {
            self.stop_all();
        }
        let lost = self.join(cx);
        let mut outcomes = vec![first];
        for o in &sh.outcomes {
            outcomes.push(o.lock().expect("outcome slot").take().unwrap_or(Ok(Ok(()))));
        }
        // Helpers stopped because a peer failed while lane 0 waited for them: the peer's
        // failure is the cause.
        if let Some(e) = lost {
            outcomes.push(Ok(Err(ShmFail::Peer(e))));
        }
        merge(outcomes)
    }

    /// Waits until every helper finished its part, stopping them all if a peer fails meanwhile
    /// (that failure is returned).
    fn join(&self, cx: &mut ShmCtx<'_>) -> Option<TransportError> {
        let sh = &self.shared;
        let started = Instant::now();
        let mut polls = 0u32;
        let mut checked = started;
        let mut told = None;
        let mut lost = None;
        while sh.pending.load(Ordering::Acquire) != 0 {
            polls += 1;
            let now = Instant::now();
            if told.is_none() {
                (cx.waiting)(Waiting::Begins);
                told = Some(Waiting::Begins);
            } else if told == Some(Waiting::Begins) && now.duration_since(started) >= LONG_WAIT {
                (cx.waiting)(Waiting::Lasts);
                told = Some(Waiting::Lasts);
            }
            if now.duration_since(started) < sh.spin {
                std::hint::spin_loop();
                continue;
            }
            if now.duration_since(checked) >= Duration::from_millis(1) {
                checked = now;
                if lost.is_none() {
                    if let Err(e) = (cx.alive)() {
                        lost = Some(e);
                        self.stop_all();
                    }
                }
            }
            if polls % 16 == 0 {
                thread::park_timeout(Duration::from_millis(1));
            } else {
                thread::yield_now();
            }
        }
        lost
    }

    /// Makes every lane of this rank stop waiting: its waits see the abort flag.
    fn stop_all(&self) {
        self.shared.abort.store(true, Ordering::Release);
        for bell in &self.bells {
            bell.wake(bell.me);
        }
        for t in &self.threads {
            t.thread().unpark();
        }
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        for t in &self.threads {
            t.thread().unpark();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The operation's outcome from its lanes': refused arguments first, then the first lane's own
/// failure (a stop caused by another lane reads as `Aborted` and comes last).
fn merge(outcomes: Vec<Outcome>) -> Outcome {
    let mut stopped = None;
    let mut failed = None;
    for o in outcomes {
        match o {
            Err(e) => return Err(e),
            Ok(Ok(())) => {}
            Ok(Err(ShmFail::Peer(TransportError::Aborted))) => {
                stopped.get_or_insert(ShmFail::Peer(TransportError::Aborted));
            }
            Ok(Err(f)) => {
                failed.get_or_insert(f);
            }
        }
    }
    Ok(failed.or(stopped).map_or(Ok(()), Err))
}

/// A helper's life: wait for a part, run it on its lane, report, again.
fn helper(sh: &Shared, i: usize, mut lane: Lane) {
    let mut seen = 0;
    loop {
        let idle_since = Instant::now();
        let mut polls = 0u32;
        loop {
            if sh.shutdown.load(Ordering::Acquire) {
                return;
            }
            let g = sh.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            polls += 1;
            if idle_since.elapsed() < sh.spin {
                if polls % 64 == 0 {
                    thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            } else {
                thread::park_timeout(Duration::from_millis(100));
            }
        }
        let Some(job) = sh.jobs[i].lock().expect("job slot").take() else {
            continue;
        };
        let mut alive = || {
            if sh.abort.load(Ordering::Acquire) {
                Err(TransportError::Aborted)
            } else {
                Ok(())
            }
        };
        let mut cx = ShmCtx {
            lane: &mut lane,
            parts: job.parts,
            whole: job.whole,
            deadline: job.deadline,
            seq: job.seq,
            alive: &mut alive,
            waiting: &mut |_| {},
        };
        let outcome = run_one(&mut cx, &job.op, job.nranks);
        if !matches!(outcome, Ok(Ok(()))) {
            sh.abort.store(true, Ordering::Release);
        }
        *sh.outcomes[i].lock().expect("outcome slot") = Some(outcome);
        if sh.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            job.waker.unpark();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_s_own_failure_outranks_the_stop_it_caused() {
        let stopped = || Ok(Err(ShmFail::Peer(TransportError::Aborted)));
        let own = || {
            Ok(Err(ShmFail::Deadline {
                waiting_for: Some(3),
            }))
        };
        match merge(vec![stopped(), own(), Ok(Ok(()))]) {
            Ok(Err(ShmFail::Deadline { waiting_for })) => assert_eq!(waiting_for, Some(3)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            merge(vec![Ok(Ok(())), stopped()]),
            Ok(Err(ShmFail::Peer(TransportError::Aborted)))
        ));
        assert!(matches!(merge(vec![Ok(Ok(())), Ok(Ok(()))]), Ok(Ok(()))));
    }
}
