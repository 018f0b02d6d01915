//! The engine's configuration comes from the cvars (and every variable the code reads is
//! declared there), and colltrace records every kind of operation of every communicator.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use colltrace::schema::{RecordKind, State};
use ctran::algos::select::{names, Collective};
use ctran::bootstrap::HashStore;
use ctran::{Comm, CommConfig, DataType, Op, P2p, ReduceOp, Span};
use torchcomms_cvars::{Kind, Spec};

/// Tests here read (and one writes) the process environment.
static ENV: Mutex<()> = Mutex::new(());

fn span_of<T>(v: &mut [T]) -> Span {
    // SAFETY: every test waits for its operation before touching or dropping the vector.
    unsafe { Span::from_raw(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ctran-colltrace-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn every_algorithm_variable_lists_the_engine_algorithms() {
    for c in Collective::ALL {
        let spec = Spec::find(c.env_var())
            .unwrap_or_else(|| panic!("{} is not declared in cvars/cvars.toml", c.env_var()));
        assert_eq!(spec.kind, Kind::Enum, "{}", spec.name);
        let mut want = vec!["auto"];
        want.extend(names(c));
        assert_eq!(spec.allowed, want.as_slice(), "{}", spec.name);
        assert_eq!(spec.default, Some("auto"));
    }
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() && !p.ends_with("target") {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs" || x == "py") {
            out.push(p);
        }
    }
}

/// Every `CTRAN_*`, `TORCHCOMM_*` and `TORCHCOMMS_*` variable named in the sources of the
/// engine, the backends, the bindings and the benchmark is declared in `cvars/cvars.toml`.
#[test]
fn every_variable_the_code_reads_is_declared() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for d in [
        "core/src",
        "cuda/src",
        "hip/src",
        "ctran/src",
        "backends",
        "perf/src",
        "bindings",
        "colltrace/src",
    ] {
        sources(&root.join(d), &mut files);
    }
    assert!(files.len() > 20, "found only {} source files", files.len());
    // Launcher variables describe the job, they are not tunables (docs/cvars.md says so).
    // torchcomms-perf's launcher names each rank's CPUs with `--bind`.
    // The job key is a secret from the launcher, deliberately not a cvar: cvar listings and
    // dumps must never show it (docs/security.md).
    let launcher = [
        "TORCHCOMM_RANK",
        "TORCHCOMM_SIZE",
        "TORCHCOMMS_PERF_CPUS",
        "TORCHCOMMS_JOB_KEY",
    ];
    let mut missing = Vec::new();
    for f in files
        .iter()
        // Test folders (`tests`, `gpu_tests`) hold harness switches, not tunables.
        .filter(|f| {
            !f.components()
                .any(|c| c.as_os_str().to_string_lossy().ends_with("tests"))
        })
    {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for (i, _) in text.match_indices('"') {
            let rest = &text[i + 1..];
            let end = rest
                .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(rest.len());
            let name = &rest[..end];
            let ours = ["CTRAN_", "TORCHCOMM_", "TORCHCOMMS_"]
                .iter()
                .any(|p| name.starts_with(p) && name.len() > p.len());
            if ours
                && rest[end..].starts_with('"')
                && !name.ends_with('_')
                && !launcher.contains(&name)
                && Spec::find(name).is_none()
            {
                missing.push(format!("{name} ({})", f.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not declared in cvars/cvars.toml: {missing:?}"
    );
}

/// Tunables are read through the cvars (so that `TORCHCOMMS_CONFIG` and `--print-cvars` see
/// them); the only direct environment reads left in the sources are of inputs that the
/// launcher, the system or the Python environment sets, listed here. A new direct read of
/// anything else fails this test.
#[test]
fn only_launcher_and_system_inputs_are_read_directly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for d in [
        "core/src",
        "cuda/src",
        "hip/src",
        "ctran/src",
        "backends",
        "perf/src",
        "bindings",
        "colltrace/src",
        "analyzer/src",
        "cvars/src",
    ] {
        sources(&root.join(d), &mut files);
    }
    let inputs = [
        // Launchers (torchrun, SLURM, Open MPI, PMI) and the job's rendezvous.
        "TORCHCOMM_RANK",
        "RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "LOCAL_RANK",
        // torchrun's agent store (distwrap's rendezvous joins it instead of serving one).
        "TORCHELASTIC_USE_AGENT_STORE",
        // Whether the user set it at all (not its value) decides the default of communicators
        // made for torch.distributed, which report failures as exceptions unless told to abort.
        "TORCHCOMM_ABORT_ON_ERROR",
        // torchcomms-perf's launcher: a rank's CPUs under `--bind`.
        "TORCHCOMMS_PERF_CPUS",
        // The machine and the user's environment.
        "LD_LIBRARY_PATH",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_ROOT",
        "ROCM_PATH",
        "HIP_PATH",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "PYTHONPATH",
        "PYTHONUSERBASE",
        "XDG_CACHE_HOME",
        "XDG_RUNTIME_DIR",
        "HOME",
        // Test binaries' own switches (not library tunables).
        "GPU_TEST_NRANKS",
    ];
    // Reads through a variable name rather than a literal: the cvars loader itself, the
    // launcher discovery and the CUDA folders (literal lists of the inputs above).
    let dynamic_ok = [
        "cvars/src/lib.rs",
        "core/src/bootstrap/env.rs",
        "core/src/bootstrap/rendezvous.rs",
        // The job key, a secret that is not a cvar (see above).
        "core/src/bootstrap/auth.rs",
        "cuda/src/libs.rs",
        "hip/src/sys.rs",
        // Upstream's TORCHCOMMS_BACKEND_LIB_PATH_<BACKEND>, only named in an error message.
        "bindings/python/src/create.rs",
        // `_comms._cvar(name)`: the cvars loader, for the Python package's knobs.
        "bindings/python/src/cvars.rs",
    ];
    let reads = ["env::var(", "env::var_os(", "os.environ", "getenv("];
    let mut found = 0;
    let mut bad = Vec::new();
    for f in files.iter().filter(|f| {
        !f.components()
            .any(|c| c.as_os_str().to_string_lossy().ends_with("tests"))
    }) {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let rel = f
            .strip_prefix(&root)
            .unwrap_or(f)
            .to_string_lossy()
            .into_owned();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") || !reads.iter().any(|r| line.contains(r)) {
                continue;
            }
            found += 1;
            let names: Vec<&str> = line
                .split('"')
                .skip(1)
                .step_by(2)
                .filter(|w| {
                    w.starts_with(|c: char| c.is_ascii_uppercase())
                        && w.chars()
                            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                })
                .collect();
            let ok = if names.is_empty() {
                dynamic_ok.contains(&rel.as_str()) || rel.ends_with(".py")
            } else {
                names.iter().all(|v| inputs.contains(v))
            };
            if !ok {
                bad.push(format!("{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found > 5,
        "found only {found} direct reads: is the scan looking at the sources?"
    );
    assert!(
        bad.is_empty(),
        "direct environment reads of tunables (declare them in cvars/cvars.toml and read them through torchcomms_cvars):\n{}",
        bad.join("\n")
    );
}

fn set(k: &str, v: Option<&str>) {
    // SAFETY (edition 2021: safe fns): ENV serialises every environment access of this binary.
    match v {
        Some(v) => std::env::set_var(k, v),
        None => std::env::remove_var(k),
    }
}

#[test]
fn comm_configuration_comes_from_the_cvars_and_bad_values_are_named() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let file = temp_dir("config").with_extension("toml");
    std::fs::write(
        &file,
        "CTRAN_CHUNK_BYTES = \"64K\"\nCTRAN_BACKENDS = [\"socket\"]\nCTRAN_ALLREDUCE_ALGO = \"tree\"\n\
         TORCHCOMMS_TRACE_BUFFER_SIZE = 7\n",
    )
    .unwrap();
    set("TORCHCOMMS_CONFIG", Some(file.to_str().unwrap()));
    set("TORCHCOMM_TIMEOUT_SECONDS", Some("12.5"));
    set("CTRAN_CHUNK_BYTES", Some("128K"));
    let cfg = CommConfig::from_env("cfg", 0, 2);
    set("CTRAN_CHUNK_BYTES", Some("lots"));
    let bad_bytes = CommConfig::from_env("cfg", 0, 2);
    set("CTRAN_CHUNK_BYTES", None);
    set("CTRAN_BROADCAST_ALGO", Some("ring"));
    let bad_algo = CommConfig::from_env("cfg", 0, 2);
    set("CTRAN_BROADCAST_ALGO", None);
    set("TORCHCOMMS_CONFIG", Some("/nonexistent/torchcomms.yaml"));
    let bad_file = CommConfig::from_env("cfg", 0, 2);
    set("TORCHCOMMS_CONFIG", None);
    set("TORCHCOMM_TIMEOUT_SECONDS", None);

    let cfg = cfg.unwrap();
    assert_eq!(
        cfg.chunk_bytes,
        128 << 10,
        "the environment overrides the file"
    );
    assert!(!cfg.use_shm, "CTRAN_BACKENDS from the file");
    assert_eq!(cfg.timeout, Duration::from_millis(12_500));
    assert_eq!(
        cfg.algos.choice(Collective::AllReduce),
        ctran::algos::select::Choice::parse(Collective::AllReduce, "tree", "x").unwrap()
    );
    assert_eq!(cfg.trace.buffer_size, 7);
    for (err, needles) in [
        (
            bad_bytes.unwrap_err(),
            &["CTRAN_CHUNK_BYTES", "lots", ">= 4096", "environment"][..],
        ),
        (
            bad_algo.unwrap_err(),
            &["CTRAN_BROADCAST_ALGO", "ring", "auto, tree, chain, direct"][..],
        ),
        (
            bad_file.unwrap_err(),
            &[
                "TORCHCOMMS_CONFIG",
                "/nonexistent/torchcomms.yaml",
                "no such file",
            ][..],
        ),
    ] {
        assert!(err.is_invalid_argument(), "{err}");
        let msg = err.to_string();
        for n in needles {
            assert!(msg.contains(n), "`{n}` missing from: {msg}");
        }
    }
}

/// Runs `f` on 2 thread-ranks over TCP.
fn two_ranks<R: Send>(name: &str, f: impl Fn(&Comm) -> R + Sync) -> Vec<R> {
    let store: Arc<HashStore> = Arc::new(HashStore::new());
    let configs: Vec<CommConfig> = {
        let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
        (0..2)
            .map(|rank| {
                let mut cfg = CommConfig::from_env(name, rank, 2).unwrap();
                cfg.timeout = Duration::from_secs(30);
                cfg.use_shm = false;
                cfg
            })
            .collect()
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = configs
            .into_iter()
            .map(|cfg| {
                let store = Arc::clone(&store);
                let f = &f;
                s.spawn(move || {
                    let comm = Comm::init(cfg, store).unwrap();
                    let r = f(&comm);
                    comm.finalize().unwrap();
                    r
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn every_kind_of_operation_is_traced() {
    let dir = temp_dir("ops");
    let out = two_ranks("traced", |c| {
        let me = c.rank();
        let mut v = vec![1.0f32; 4];
        c.run(
            Op::AllReduce {
                buf: span_of(&mut v),
                dtype: DataType::F32,
                op: ReduceOp::Max,
            },
            None,
        )
        .unwrap();
        let mut b = vec![0u8; 3];
        c.submit_with_options(
            Op::Broadcast {
                buf: span_of(&mut b),
                root: 1,
            },
            None,
            Vec::new(),
            Some("chain"),
            Some(true),
        )
        .wait_timeout(Duration::from_secs(30), me)
        .unwrap();
        let mut p = vec![me as u8; 5];
        let op = if me == 0 {
            Op::Send {
                buf: span_of(&mut p),
                peer: 1,
            }
        } else {
            Op::Recv {
                buf: span_of(&mut p),
                peer: 0,
            }
        };
        c.run(op, None).unwrap();
        let (mut s, mut r) = (vec![me as u8; 6], vec![0u8; 6]);
        c.run(
            Op::Batch {
                ops: vec![
                    P2p::Send {
                        buf: span_of(&mut s),
                        peer: 1 - me,
                    },
                    P2p::Recv {
                        buf: span_of(&mut r),
                        peer: 1 - me,
                    },
                ],
            },
            None,
        )
        .unwrap();
        let child = c
            .split(&[1, 0], "traced-child", None, false)
            .unwrap()
            .unwrap();
        let child_meta = child.trace().meta().clone();
        child.finalize().unwrap();
        let file = c.dump_trace(&dir).unwrap();
        (c.trace().snapshot(), child_meta, file)
    });
    for (rank, (d, child, file)) in out.iter().enumerate() {
        let find = |kind: RecordKind, op: &str| {
            d.records
                .iter()
                .find(|r| r.kind == kind && r.op == op)
                .unwrap_or_else(|| panic!("rank {rank}: no {op} in {:#?}", d.records))
        };
        assert_eq!(
            (d.rank, d.size, d.global_ranks.clone()),
            (rank, 2, vec![0, 1])
        );
        assert_eq!(d.transport.as_deref(), Some("socket"));
        let init = find(RecordKind::Comm, "init");
        assert_eq!(init.state, State::Completed);
        let ar = find(RecordKind::Collective, "all_reduce");
        assert_eq!(ar.seq, 2, "after the barrier of init");
        assert_eq!(
            (
                ar.dtype.as_deref(),
                ar.count,
                ar.in_bytes,
                ar.reduce_op.as_deref()
            ),
            (Some("f32"), Some(4), 16, Some("max"))
        );
        assert_eq!(ar.async_op, None);
        assert_eq!(ar.state, State::Completed);
        assert!(ar.algorithm.is_some() && ar.transport.as_deref() == Some("socket"));
        assert!(ar.enqueued_ns <= ar.started_ns && ar.started_ns <= ar.ended_ns);
        assert!(ar.timeout_ms == 30_000, "{}", ar.timeout_ms);
        let bc = find(RecordKind::Collective, "broadcast");
        assert_eq!(
            (bc.root, bc.async_op, bc.algorithm.as_deref()),
            (Some(1), Some(true), Some("chain"))
        );
        let p2p = find(RecordKind::P2p, if rank == 0 { "send" } else { "recv" });
        assert_eq!(
            (p2p.seq, p2p.peer, p2p.state),
            (1, Some(1 - rank), State::Completed)
        );
        let batch = find(RecordKind::P2p, "batch_op_issue");
        assert_eq!(batch.seq, 2);
        assert_eq!(batch.peers.as_ref().map(Vec::len), Some(2));
        assert_eq!((batch.in_bytes, batch.out_bytes), (6, 6));
        let split = find(RecordKind::Comm, "split");
        assert_eq!(split.state, State::Completed);
        assert!(split.detail.as_deref().unwrap().contains("traced-child"));
        assert_eq!(d.collective.completed, d.collective.enqueued);
        assert_eq!(d.p2p.completed, 2);
        // The child's members, in its rank order, are global ranks 1 and 0.
        assert_eq!(child.global_ranks, vec![1, 0]);
        assert_eq!(child.rank, 1 - rank);
        let dumped = colltrace::schema::parse_dumps(&std::fs::read(file).unwrap()).unwrap();
        assert_eq!(dumped[0].rank, rank);
        assert_eq!(dumped[0].comms[0].name, "traced");
    }
    // The process-wide dump writes one file per rank (here: thread-ranks of one process).
    let all = colltrace::dump_all(&dir).unwrap();
    for r in 0..2 {
        assert!(
            all.contains(&dir.join(format!("colltrace_rank{r}.json"))),
            "{all:?}"
        );
    }
}

#[test]
fn a_zero_buffer_turns_tracing_off() {
    let store: Arc<HashStore> = Arc::new(HashStore::new());
    let mut cfg = {
        let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
        CommConfig::from_env("untraced", 0, 1).unwrap()
    };
    cfg.trace.buffer_size = 0;
    let c = Comm::init(cfg, store).unwrap();
    c.run(Op::Barrier, None).unwrap();
    assert!(!c.trace().enabled());
    assert!(c.trace().snapshot().records.is_empty());
    c.finalize().unwrap();
}
