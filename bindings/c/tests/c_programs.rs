//! C and C++ programs against the generated header and the built library: compiled with the
//! system compiler (`CC`/`CXX`, default gcc/g++), then run as real ranks (one process each,
//! `TORCHCOMM_RANK`/`TORCHCOMM_SIZE`, `MASTER_ADDR`/`MASTER_PORT` on a free loopback port),
//! every job bounded by a timeout. A program exits non-zero on a wrong result.
//!
//! - `examples/c/allreduce.c` (shared library) and `examples/cpp/allreduce.cpp` (static
//!   library, through the RAII wrapper `examples/cpp/torchcomms.hpp`) over 4 ranks;
//! - `tests/c/collectives.c`: every operation, the store, split, async work, over 1, 3, 4 ranks;
//! - `tests/c/errors.c`: the error paths and their messages, over 2 ranks;
//! - `tests/c/windows.c`: one-sided windows (a put + signal ring, bad input), over 3 ranks;
//! - `tests/c/reconfigure.c`: reconfigurations (reversed order, a shrink, bad lists), over 3 ranks.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long one job (all its ranks) may run before its processes are killed.
const JOB_TIMEOUT: Duration = Duration::from_secs(120);

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn repo_root() -> PathBuf {
    crate_dir()
        .parent()
        .and_then(Path::parent)
        .expect("bindings/c sits two levels below the repository root")
        .to_path_buf()
}

/// The folder holding `libtorchcomms_c.{so,a}`. Cargo builds every crate type of the library
/// before this test, into `target/<profile>/deps` beside the test executable (a `cargo build`
/// also copies them up to `target/<profile>`, where an older copy may linger: deps first).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test executable");
    let deps = exe.parent().expect("target/<profile>/deps");
    for dir in [deps, deps.parent().expect("target/<profile>")] {
        if dir.join("libtorchcomms_c.so").is_file() && dir.join("libtorchcomms_c.a").is_file() {
            return dir.to_path_buf();
        }
    }
    panic!(
        "libtorchcomms_c.so/.a not found next to {}; build them with `cargo build -p torchcomms-c`",
        exe.display()
    );
}

/// Where compiled programs go.
fn out_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("torchcomms-c");
    std::fs::create_dir_all(&d).expect("create the output folder");
    d
}

/// The C or C++ compiler: `CC`/`CXX`, else gcc/g++.
fn compiler(cpp: bool) -> String {
    let (var, default) = if cpp { ("CXX", "g++") } else { ("CC", "gcc") };
    std::env::var(var).unwrap_or_else(|_| default.into())
}

#[derive(Clone, Copy, Debug)]
enum Link {
    Shared,
    Static,
}

/// Compiles `source` (C when `cpp` is false) against the header and the library.
fn compile(
    name: &str,
    source: &Path,
    cpp: bool,
    link: Link,
    extra_includes: &[PathBuf],
) -> PathBuf {
    let compiler = compiler(cpp);
    let lib = lib_dir();
    let exe = out_dir().join(name);
    let mut cmd = Command::new(&compiler);
    cmd.arg(if cpp { "-std=c++17" } else { "-std=c11" })
        .args([
            "-D_POSIX_C_SOURCE=200809L",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-O1",
            "-g",
        ])
        .arg("-I")
        .arg(crate_dir().join("include"));
    for inc in extra_includes {
        cmd.arg("-I").arg(inc);
    }
    cmd.arg(source).arg("-o").arg(&exe);
    match link {
        Link::Shared => {
            cmd.arg("-L").arg(&lib).arg("-ltorchcomms_c");
            // DT_RPATH (not RUNPATH) so the library just built wins over an older copy that
            // cargo's LD_LIBRARY_PATH may list first.
            cmd.arg("-Wl,--disable-new-dtags")
                .arg(format!("-Wl,-rpath,{}", lib.display()));
        }
        Link::Static => {
            // The system libraries the Rust standard library needs (`--print native-static-libs`).
            cmd.arg(lib.join("libtorchcomms_c.a")).args([
                "-lgcc_s",
                "-lutil",
                "-lrt",
                "-lpthread",
                "-lm",
                "-ldl",
                "-lc",
            ]);
        }
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run {compiler} (install gcc/g++ or set CC/CXX): {e}"));
    assert!(
        out.status.success(),
        "{compiler} failed to build {}:\n{:?}\n{}{}",
        source.display(),
        cmd,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// What one rank did.
#[derive(Debug)]
struct Rank {
    rank: usize,
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("an ephemeral port")
}

/// Launcher variables that would override the ones this harness sets.
const FOREIGN_ENV: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "TORCHELASTIC_USE_AGENT_STORE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
];

/// Runs `n` ranks of `exe` and waits for them (killing them all at the timeout).
fn run_ranks(exe: &Path, n: usize) -> Vec<Rank> {
    let port = free_port();
    let start = Instant::now();
    let mut children: Vec<(usize, Child)> = Vec::new();
    for rank in 0..n {
        let mut cmd = Command::new(exe);
        for var in FOREIGN_ENV {
            cmd.env_remove(var);
        }
        cmd.env("TORCHCOMM_RANK", rank.to_string())
            .env("TORCHCOMM_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("TORCHCOMM_ABORT_ON_ERROR", "0")
            .env("TORCHCOMM_TIMEOUT_SECONDS", "60")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        children.push((
            rank,
            cmd.spawn()
                .unwrap_or_else(|e| panic!("spawn {}: {e}", exe.display())),
        ));
    }
    // Drain the pipes on threads so a chatty rank never blocks.
    let readers: Vec<_> = children
        .iter_mut()
        .map(|(_, c)| {
            let mut out = c.stdout.take().expect("piped stdout");
            let mut err = c.stderr.take().expect("piped stderr");
            std::thread::spawn(move || {
                let (mut o, mut e) = (String::new(), String::new());
                let _ = out.read_to_string(&mut o);
                let _ = err.read_to_string(&mut e);
                (o, e)
            })
        })
        .collect();
    let mut status: Vec<Option<ExitStatus>> = vec![None; n];
    let mut running = n;
    while running > 0 {
        for (i, (_, child)) in children.iter_mut().enumerate() {
            if status[i].is_none() {
                if let Ok(Some(s)) = child.try_wait() {
                    status[i] = Some(s);
                    running -= 1;
                }
            }
        }
        if running > 0 && start.elapsed() > JOB_TIMEOUT {
            for (i, (_, child)) in children.iter_mut().enumerate() {
                if status[i].is_none() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    children
        .into_iter()
        .zip(readers)
        .zip(status)
        .map(|(((rank, _), reader), status)| {
            let (stdout, stderr) = reader.join().unwrap_or_default();
            Rank {
                rank,
                status,
                stdout,
                stderr,
            }
        })
        .collect()
}

/// Runs `n` ranks and checks every one exited 0 and printed `"<tag> OK rank r/n"`.
fn run_and_check(exe: &Path, n: usize, tag: &str) -> Vec<Rank> {
    let start = Instant::now();
    let ranks = run_ranks(exe, n);
    assert_eq!(ranks.len(), n, "every rank ran");
    for r in &ranks {
        let ok = r.status.is_some_and(|s| s.success());
        let line = format!("{tag} OK rank {}/{n}", r.rank);
        assert!(
            ok && r.stdout.contains(&line),
            "{} rank {} of {n}: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            exe.display(),
            r.rank,
            match r.status {
                None => format!("killed after {JOB_TIMEOUT:?}"),
                Some(s) => format!("exited with {s}"),
            },
            r.stdout,
            r.stderr
        );
    }
    eprintln!("{} over {n} ranks: {:.1?}", exe.display(), start.elapsed());
    ranks
}

#[test]
fn c_example_allreduce_4_ranks_shared_library() {
    let exe = compile(
        "allreduce_c",
        &repo_root().join("examples/c/allreduce.c"),
        false,
        Link::Shared,
        &[],
    );
    run_and_check(&exe, 4, "allreduce");
}

#[test]
fn cpp_example_allreduce_4_ranks_static_library() {
    let exe = compile(
        "allreduce_cpp",
        &repo_root().join("examples/cpp/allreduce.cpp"),
        true,
        Link::Static,
        &[repo_root().join("examples/cpp")],
    );
    run_and_check(&exe, 4, "allreduce");
}

fn collectives_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        compile(
            "collectives",
            &crate_dir().join("tests/c/collectives.c"),
            false,
            Link::Shared,
            &[],
        )
    })
}

#[test]
fn c_collectives_1_rank() {
    run_and_check(collectives_exe(), 1, "collectives");
}

#[test]
fn c_collectives_3_ranks() {
    run_and_check(collectives_exe(), 3, "collectives");
}

#[test]
fn c_collectives_4_ranks() {
    run_and_check(collectives_exe(), 4, "collectives");
}

#[test]
fn c_windows_3_ranks() {
    let exe = compile(
        "windows",
        &crate_dir().join("tests/c/windows.c"),
        false,
        Link::Shared,
        &[],
    );
    run_and_check(&exe, 3, "windows");
}

/// The CUDA program only compiles here (no GPU); `scripts/gpu-test.sh` runs it on the GPU
/// machines.
#[test]
fn c_cuda_program_compiles() {
    let exe = compile(
        "cuda",
        &crate_dir().join("tests/c/cuda.c"),
        false,
        Link::Shared,
        &[],
    );
    assert!(exe.is_file());
}

#[test]
fn c_reconfigure_3_ranks() {
    let exe = compile(
        "reconfigure",
        &crate_dir().join("tests/c/reconfigure.c"),
        false,
        Link::Shared,
        &[],
    );
    run_and_check(&exe, 3, "reconfigure");
}

#[test]
fn c_error_paths_2_ranks() {
    let exe = compile(
        "errors",
        &crate_dir().join("tests/c/errors.c"),
        false,
        Link::Shared,
        &[],
    );
    let ranks = run_and_check(&exe, 2, "errors");
    // Rank 0 prints each error with its message: make sure they are there and readable.
    let printed = &ranks[0].stdout;
    for needle in [
        "invalid argument",
        "not supported",
        "timeout",
        "communication error",
        "NULL",
    ] {
        assert!(
            printed.contains(needle),
            "no {needle:?} among the errors:\n{printed}"
        );
    }
}

#[test]
fn header_compiles_as_c99_and_cpp() {
    let dir = out_dir();
    for (name, std, cpp) in [
        ("hdr_c99.c", "-std=c99", false),
        ("hdr_cpp.cpp", "-std=c++11", true),
    ] {
        let src = dir.join(name);
        std::fs::write(
            &src,
            "#include <torchcomms.h>\nint main(void) { return TC_OK; }\n",
        )
        .expect("write a probe source");
        let compiler = compiler(cpp);
        let out = Command::new(&compiler)
            .args([
                std,
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pedantic",
                "-fsyntax-only",
                "-I",
            ])
            .arg(crate_dir().join("include"))
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("run {compiler}: {e}"));
        assert!(
            out.status.success(),
            "{compiler} {std} rejects torchcomms.h:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
