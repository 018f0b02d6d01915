//! Windows on the engine with ranks as threads of this process, over TCP alone, with shared
//! memory (cross-memory attach) between them, and with ib (the software fabric) carrying puts
//! and signals: a ring of put + signal / wait_signal checked every
//! iteration, every rank putting into disjoint slots of one window, and bad input (sizes that
//! disagree, puts after deregistration, past the end, to a bad peer).

use std::sync::Arc;
use std::time::Duration;

use ctran::bootstrap::HashStore;
use ctran::transport::ib::IbProvider;
use ctran::window::Window;
use ctran::{Comm, CommConfig, Span};

fn with_ranks<R: Send>(n: usize, name: &str, f: impl Fn(Arc<Comm>) -> R + Sync) -> Vec<R> {
    let mut out = Vec::new();
    for (tag, shm, ib) in [
        ("tcp", false, false),
        ("shm", true, false),
        ("ib", false, true),
    ] {
        let store: Arc<HashStore> = Arc::new(HashStore::new());
        let f = &f;
        out = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|rank| {
                    let store = Arc::clone(&store);
                    s.spawn(move || {
                        let mut cfg =
                            CommConfig::from_env(format!("{name}-{tag}-n{n}"), rank, n).unwrap();
                        cfg.timeout = Duration::from_secs(30);
                        cfg.use_shm = shm;
                        cfg.want_ib = ib;
                        cfg.ib_provider = IbProvider::Soft;
                        let comm = Arc::new(Comm::init(cfg, store).unwrap());
                        let r = f(Arc::clone(&comm));
                        comm.finalize().unwrap();
                        r
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
    }
    out
}

fn span<T>(v: &mut [T]) -> Span {
    // SAFETY: the buffers outlive every operation on them in these tests (waited for).
    unsafe { Span::from_raw(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

fn wait(r: ctran::Request) {
    r.wait_timeout(Duration::from_secs(30), 0).unwrap();
}

#[test]
fn a_ring_of_puts_and_signals_delivers_every_iteration() {
    for n in [2, 3, 5] {
        with_ranks(n, "win-ring", |comm| {
            let (me, size) = (comm.rank(), comm.size());
            let (next, prev) = ((me + 1) % size, (me + size - 1) % size);
            let mut buf = vec![0u64; 16];
            let win = Window::new(Arc::clone(&comm));
            win.register(span(&mut buf), Vec::new(), None).unwrap();
            assert_eq!(win.size_of(next), Some(128));
            for it in 0..1000u64 {
                let mut src: Vec<u64> = (0..16).map(|i| it * 1000 + me as u64 * 16 + i).collect();
                wait(win.put(span(&mut src), Vec::new(), next, 0, None));
                wait(win.signal(next, None));
                wait(win.wait_signal(prev, None));
                let want: Vec<u64> = (0..16).map(|i| it * 1000 + prev as u64 * 16 + i).collect();
                // SAFETY-free read: the data arrived before the signal we consumed.
                assert_eq!(buf, want, "iteration {it} on rank {me}");
                // Tell prev its next put may overwrite.
                wait(win.signal(prev, None));
                wait(win.wait_signal(next, None));
            }
            win.deregister(None).unwrap();
        });
    }
    // Ranks that are threads of one process can always attach to it: the shared-memory runs
    // wrote their puts by cross-memory attach.
    assert!(ctran::transport::shm::cma_stats().puts >= 1000);
}

#[test]
fn every_rank_puts_into_its_own_slot_at_once() {
    with_ranks(5, "win-slots", |comm| {
        let (me, size) = (comm.rank(), comm.size());
        let slot = 100usize;
        let mut buf = vec![0u32; slot * size];
        let win = Window::new(Arc::clone(&comm));
        win.register(span(&mut buf), Vec::new(), None).unwrap();
        let mut src: Vec<u32> = (0..slot as u32).map(|i| me as u32 * 1_000 + i).collect();
        let mut reqs = Vec::new();
        for p in (0..size).filter(|&p| p != me) {
            reqs.push(win.put(span(&mut src), Vec::new(), p, me * slot * 4, None));
            reqs.push(win.signal(p, None));
        }
        reqs.into_iter().for_each(wait);
        for p in (0..size).filter(|&p| p != me) {
            wait(win.wait_signal(p, None));
        }
        for p in (0..size).filter(|&p| p != me) {
            let want: Vec<u32> = (0..slot as u32).map(|i| p as u32 * 1_000 + i).collect();
            assert_eq!(&buf[p * slot..(p + 1) * slot], &want[..]);
        }
        win.deregister(None).unwrap();
    });
}

#[test]
fn bad_input_fails_with_the_reason() {
    with_ranks(3, "win-bad", |comm| {
        let me = comm.rank();
        let win = Window::new(Arc::clone(&comm));
        let mut one = [0u8; 4];
        let e = win.put(span(&mut one), Vec::new(), (me + 1) % 3, 0, None);
        assert!(e
            .error()
            .unwrap()
            .to_string()
            .contains("tensor_register first"));
        // Sizes that disagree: every rank fails, naming both sizes.
        let mut buf = vec![0u8; 64 + me];
        let e = win.register(span(&mut buf), Vec::new(), None).unwrap_err();
        assert!(e.to_string().contains("registered"), "{e}");
        assert!(!win.is_registered());
        let mut buf = vec![0u8; 64];
        win.register(span(&mut buf), Vec::new(), None).unwrap();
        let mut big = vec![0u8; 65];
        let e = win.put(span(&mut big), Vec::new(), (me + 1) % 3, 0, None);
        assert!(
            e.error().unwrap().to_string().contains("exceeds"),
            "{:?}",
            e.error()
        );
        let e = win.signal(7, None);
        assert!(e.error().unwrap().to_string().contains("peer"));
        win.deregister(None).unwrap();
        let e = win.put(span(&mut one), Vec::new(), (me + 1) % 3, 0, None);
        assert!(e.error().unwrap().to_string().contains("deregistered"));
        assert!(
            comm.failure().is_none(),
            "bad input leaves the communicator usable"
        );
    });
}

#[test]
fn a_wait_for_a_dead_peer_fails_well_before_the_timeout() {
    let store: Arc<HashStore> = Arc::new(HashStore::new());
    let n = 2;
    std::thread::scope(|s| {
        for rank in 0..n {
            let store = Arc::clone(&store);
            s.spawn(move || {
                let mut cfg = CommConfig::from_env("win-dead".to_string(), rank, n).unwrap();
                cfg.timeout = Duration::from_secs(30);
                cfg.use_shm = false;
                let comm = Arc::new(Comm::init(cfg, store).unwrap());
                let mut buf = vec![0u8; 64];
                let win = Window::new(Arc::clone(&comm));
                win.register(span(&mut buf), Vec::new(), None).unwrap();
                if rank == 1 {
                    comm.abort("rank 1 goes away");
                    // A window of a failed communicator returns its error.
                    let e = win.signal(0, None).wait_timeout(Duration::from_secs(5), 1);
                    assert!(e.is_err());
                    return;
                }
                let start = std::time::Instant::now();
                let e = win
                    .wait_signal(1, None)
                    .wait_timeout(Duration::from_secs(40), 0)
                    .unwrap_err();
                assert!(start.elapsed() < Duration::from_secs(10), "{e}");
                assert!(e.to_string().contains("lost peer 1"), "{e}");
            });
        }
    });
}
