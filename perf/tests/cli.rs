//! Smoke tests of the built binary: a full local run over every dtype and reduction, and a bad
//! argument.

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_torchcomms-perf");

/// A path in the temp directory that no other test run uses.
fn temp_path(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::env::temp_dir().join(format!(
        "torchcomms-perf-{}-{nanos}-{name}",
        std::process::id()
    ))
}

/// A command that launches its own ranks whatever launcher started the test.
fn perf() -> Command {
    let mut cmd = Command::new(BIN);
    for v in [
        "TORCHCOMM_RANK",
        "TORCHCOMM_SIZE",
        "RANK",
        "WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_RANK",
        "PMI_SIZE",
        "PALS_RANKID",
        "SLURM_PROCID",
        "SLURM_NTASKS",
    ] {
        cmd.env_remove(v);
    }
    cmd
}

/// Runs `cmd` (whose `--json` goes to `json`), asserts it succeeded and returns the JSON rows
/// and the printed tables.
fn rows_of(cmd: &mut Command, json: &Path) -> (Vec<serde_json::Value>, String) {
    let out = cmd.output().expect("run torchcomms-perf");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let text = std::fs::read_to_string(json).expect("the --json file");
    // Best effort: a leftover file in the temp directory harms nobody.
    let _ = std::fs::remove_file(json);
    (serde_json::from_str(&text).expect("a JSON array"), stdout)
}

#[test]
fn every_dtype_and_redop_on_three_ranks() {
    let json = temp_path("rows.json");
    let mut cmd = perf();
    cmd.args([
        "-n",
        "3",
        "-b",
        "8",
        "-e",
        "64K",
        "--dtype",
        "all",
        "--redop",
        "all",
        "-w",
        "1",
        "-i",
        "2",
        "--timeout",
        "120",
        "--json",
    ])
    .arg(&json);
    let (rows, stdout) = rows_of(&mut cmd, &json);

    // Every op, every dtype and every valid reduction printed rows.
    let ops = [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "broadcast",
        "reduce",
        "scatter",
        "gather",
        "send_recv",
    ];
    for op in ops {
        assert!(stdout.contains(&format!("# {op}\n")), "no table for {op}");
        let n = rows.iter().filter(|r| r["op"] == op).count();
        assert!(n > 0, "no rows for {op}");
    }
    for dtype in [
        "f16", "bf16", "f32", "f64", "i8", "u8", "i32", "i64", "bool",
    ] {
        for redop in ["sum", "prod", "min", "max", "avg"] {
            let found = rows
                .iter()
                .any(|r| r["op"] == "all_reduce" && r["dtype"] == dtype && r["redop"] == redop);
            let valid = !(dtype == "bool" && redop == "avg");
            assert_eq!(found, valid, "all_reduce {dtype} {redop}");
        }
    }
    assert!(stdout.contains("n/a"), "invalid combinations print n/a");
    // 9 ops x 9 dtypes x 14 sizes is the order of magnitude; reductions add more.
    assert!(rows.len() > 500, "only {} rows", rows.len());

    for r in &rows {
        assert_eq!(r["nranks"], 3, "{r}");
        assert_eq!(r["wrong"], 0, "{r}");
        let t = r["time_us"].as_f64().expect("time_us");
        assert!(t > 0.0, "{r}");
        for k in ["bytes", "count"] {
            assert!(r[k].is_u64(), "{k} in {r}");
        }
        for k in ["algbw_gbps", "busbw_gbps"] {
            assert!(r[k].as_f64().is_some_and(|v| v >= 0.0), "{k} in {r}");
        }
    }
    let bytes: Vec<u64> = rows
        .iter()
        .filter(|r| r["op"] == "all_reduce" && r["dtype"] == "f32" && r["redop"] == "sum")
        .map(|r| r["bytes"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(bytes.first(), Some(&8));
    assert_eq!(bytes.last(), Some(&65536));
    assert!(stdout.contains("Out of bounds values : 0 OK"), "{stdout}");
}

#[test]
fn algo_all_prints_one_table_per_algorithm_and_the_auto_summary() {
    let json = temp_path("algos.json");
    let mut cmd = perf();
    cmd
        // Over TCP, with 4 KiB staging chunks: tree scatter cannot hold 3 blocks of 2 KiB.
        .env("CTRAN_BACKENDS", "socket")
        .env("CTRAN_CHUNK_BYTES", "4096")
        .args([
            "-n",
            "3",
            "--op",
            "all_reduce,scatter,send_recv",
            "-b",
            "8",
            "-e",
            "8K",
            "-f",
            "4",
            "--algo",
            "all",
            "-w",
            "1",
            "-i",
            "2",
            "--rounds",
            "2",
            "--timeout",
            "120",
            "--json",
        ])
        .arg(&json);
    let (rows, stdout) = rows_of(&mut cmd, &json);
    for (op, algos) in [
        (
            "all_reduce",
            &["ring", "halving_doubling", "direct", "tree", "auto"][..],
        ),
        ("scatter", &["tree", "direct", "auto"][..]),
    ] {
        for algo in algos {
            assert!(
                stdout.contains(&format!("# {op} algo {algo}\n")),
                "no table for {op} {algo}:\n{stdout}"
            );
            let n = rows
                .iter()
                .filter(|r| r["op"] == op && r["algo"] == *algo)
                .count();
            // 8 B, 32 B, 128 B, 512 B, 2 KiB, 8 KiB (scatter: 8 B rounds down to 0 bytes).
            assert!(n >= 5, "{n} rows for {op} {algo}");
        }
        assert!(
            stdout.contains(&format!("# {op}: auto against the best algorithm")),
            "{stdout}"
        );
    }
    // Tree scatter of 8 KiB (3 blocks of 2 KiB) does not fit a 4 KiB chunk: n/a, with why.
    assert!(
        stdout.contains("tree needs all 3 blocks to fit one staging chunk"),
        "{stdout}"
    );
    assert!(!rows
        .iter()
        .any(|r| r["op"] == "scatter" && r["algo"] == "tree" && r["bytes"] == 8184));
    // send_recv has no algorithms: one table, run as is.
    assert!(stdout.contains("# send_recv\n"), "{stdout}");
    assert!(
        stdout.contains("# auto within 10% of the best algorithm: "),
        "{stdout}"
    );
    assert!(rows.iter().all(|r| r["wrong"] == 0), "{rows:?}");
}

/// `--bind`: each launched rank runs on its own CPU, and the engine counts the host's cores as
/// the union of the ranks' CPUs (each rank alone sees one).
#[test]
fn bind_gives_each_rank_its_own_cpu_and_the_engine_counts_them_all() {
    // The launcher splits the CPUs of its mask (a quota is not a mask).
    let mask = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
    let cpus = (0..nix::sched::CpuSet::count())
        .filter(|&c| mask.is_set(c).unwrap())
        .count();
    let out = perf()
        .args([
            "-n",
            "2",
            "--bind",
            "--op",
            "all_reduce",
            "-b",
            "8",
            "-e",
            "8",
        ])
        .args(["-w", "1", "-i", "2"])
        .env("CTRAN_BACKENDS", "socket")
        .env(
            "RUST_LOG",
            "torchcomms_perf=info,ctran::algos::select::calibrate=debug",
        )
        .env("NO_COLOR", "1")
        .output()
        .expect("run torchcomms-perf");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {}\n{stderr}", out.status);
    let bound: Vec<&str> = stderr.lines().filter(|l| l.contains("bound")).collect();
    assert_eq!(bound.len(), 2, "one line per rank:\n{stderr}");
    for line in &bound {
        let list = line
            .split("cpus=[")
            .nth(1)
            .and_then(|r| r.split(']').next());
        assert_eq!(
            list.map(|l| l.split(',').count()),
            Some(1),
            "one CPU per rank: {line}"
        );
    }
    let expected = format!("cores_per_host: {}", cpus.min(2));
    assert!(
        stderr
            .lines()
            .filter(|l| l.contains("cost model agreed"))
            .all(|l| l.contains(&expected)),
        "{expected} on every rank:\n{stderr}"
    );
    assert!(stderr.contains("cost model agreed"), "{stderr}");
}

/// A rank given a CPU list it cannot parse stops with an error naming the variable.
#[test]
fn a_bad_cpu_list_names_the_variable() {
    let out = perf()
        .args(["--op", "all_reduce", "-b", "8", "-e", "8"])
        .env("TORCHCOMM_RANK", "0")
        .env("TORCHCOMM_SIZE", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", "1")
        .env("TORCHCOMMS_PERF_CPUS", "0,x")
        .output()
        .expect("run torchcomms-perf");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("TORCHCOMMS_PERF_CPUS"), "{stderr}");
    assert!(stderr.contains("\"x\" is not a CPU number"), "{stderr}");
}

#[test]
fn a_bad_dtype_names_the_argument() {
    let out = perf()
        .args(["-n", "2", "--dtype", "f7"])
        .output()
        .expect("run torchcomms-perf");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--dtype"), "{stderr}");
    assert!(stderr.contains("f7"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing runs: {:?}", out.stdout);
}

#[test]
fn a_root_outside_the_job_fails_before_launching() {
    let out = perf()
        .args(["-n", "2", "--root", "2", "-e", "64"])
        .output()
        .expect("run torchcomms-perf");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--root"), "{stderr}");
}

/// `--trace-ab` on two ranks: the settings alternate, rank 0 reports both and the paired
/// ratio, and every rank checked that its trace recorded every operation of the `on` blocks
/// and none of the `off` ones (it fails otherwise).
#[test]
fn trace_ab_switches_recording_within_the_run() {
    let ab = |buffer: &str| {
        perf()
            .args([
                "-n",
                "2",
                "--op",
                "all_reduce",
                "-b",
                "8",
                "-e",
                "8",
                "-w",
                "10",
            ])
            .args([
                "-i",
                "400",
                "--ab-block",
                "50",
                "--trace-ab",
                "--timeout",
                "120",
            ])
            .env("TORCHCOMMS_TRACE_BUFFER_SIZE", buffer)
            .output()
            .expect("run torchcomms-perf")
    };
    let out = ab("100");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("records taken: 200 in on blocks (expected at least 200), 0 in off blocks"),
        "{stdout}"
    );
    assert!(
        stdout.contains("8 blocks of 50 iterations (2 groups"),
        "{stdout}"
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("trace-ab nranks=2 blocks=8 block=50 groups=2 "))
        .unwrap_or_else(|| panic!("no summary line: {stdout}"));
    for key in ["off_us=", "on_us=", "ratio=", "lo=", "hi="] {
        let v: f64 = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} in {line}"));
        assert!(v.is_finite(), "{line}");
    }
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
    // Tracing off for the whole process: nothing to switch.
    let out = ab("0");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("keeps no colltrace"), "{stderr}");
}
