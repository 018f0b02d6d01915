//! Aborting a communicator dumps its trace (`TORCHCOMMS_TRACE_DUMP_ON` has `abort` by
//! default) into the configured directory, one file per rank of the process. A binary of its
//! own: the dump directory is process-wide, and other tests would configure theirs.

use std::sync::Arc;
use std::time::Duration;

use colltrace::schema::State;
use ctran::bootstrap::HashStore;
use ctran::{Comm, CommConfig, DataType, Op, ReduceOp, Span};

fn span_of<T>(v: &mut [T]) -> Span {
    // SAFETY: the test waits for its operation before touching or dropping the vector.
    unsafe { Span::from_raw(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

#[test]
fn aborting_a_communicator_dumps_every_rank_of_the_process() {
    let dir = std::env::temp_dir().join(format!("ctran-colltrace-abort-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store: Arc<HashStore> = Arc::new(HashStore::new());
    let configs: Vec<CommConfig> = {
        (0..2)
            .map(|rank| {
                let mut cfg = CommConfig::from_env("aborted", rank, 2).unwrap();
                cfg.timeout = Duration::from_secs(30);
                cfg.use_shm = false;
                cfg.trace.dir = dir.clone();
                cfg
            })
            .collect()
    };
    assert!(configs[0].trace.dump_on.abort, "abort dumps by default");
    std::thread::scope(|s| {
        for cfg in configs {
            let store = Arc::clone(&store);
            s.spawn(move || {
                let comm = Comm::init(cfg, store).unwrap();
                let mut v = vec![1.0f32; 4];
                comm.run(
                    Op::AllReduce {
                        buf: span_of(&mut v),
                        dtype: DataType::F32,
                        op: ReduceOp::Sum,
                    },
                    None,
                )
                .unwrap();
                assert_eq!(v, vec![2.0f32; 4]);
                comm.abort("test abort");
            });
        }
    });
    // Both ranks live in this process: each abort dumps every rank of it (the last one wins).
    let mut seen = 0;
    for rank in 0..2 {
        let file = dir.join(colltrace::dump_file_name(rank));
        let text = std::fs::read(&file)
            .unwrap_or_else(|e| panic!("no abort dump {}: {e}", file.display()));
        let dumps = colltrace::schema::parse_dumps(&text).unwrap();
        let d = &dumps[0];
        let c = d.comms.iter().find(|c| c.name == "aborted").unwrap();
        assert_eq!(d.trigger, colltrace::Trigger::Abort, "{}", file.display());
        assert_eq!(d.reason.as_deref(), Some("test abort"));
        assert_eq!(c.state, colltrace::CommState::Aborted);
        assert_eq!(c.error.as_deref(), Some("test abort"));
        let ar = c.records.iter().find(|r| r.op == "all_reduce").unwrap();
        assert_eq!(ar.state, State::Completed);
        seen += 1;
    }
    assert!(
        seen >= 1,
        "no abort dump of comm `aborted` in {}",
        dir.display()
    );
}
