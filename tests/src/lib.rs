//! Launches real ranks as processes (the `tc-worker` binary) and collects what each printed.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub mod faults;
pub mod values;

/// What one rank did.
#[derive(Debug)]
pub struct RankOutput {
    /// The rank.
    pub rank: usize,
    /// How it exited (`None`: killed by the harness at the job timeout).
    pub status: Option<ExitStatus>,
    /// Everything it printed to stdout.
    pub stdout: String,
    /// Everything it printed to stderr.
    pub stderr: String,
    /// Time from launch to exit.
    pub elapsed: Duration,
}

impl RankOutput {
    /// True when the rank exited with status 0.
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// A free TCP port on loopback (bound then released; good enough for tests on one machine).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// A job of `n` ranks running `args` of the worker binary.
#[derive(Debug, Clone)]
pub struct Job {
    /// Number of ranks.
    pub n: usize,
    /// Worker arguments (scenario and its flags).
    pub args: Vec<String>,
    /// Extra environment for every rank.
    pub env: Vec<(String, String)>,
    /// Kill every rank still running after this long.
    pub timeout: Duration,
    /// Ranks not to launch (started by the test itself, or never).
    pub skip_ranks: Vec<usize>,
}

impl Job {
    /// A job of `n` ranks running worker scenario `args`.
    pub fn new(n: usize, args: &[&str]) -> Job {
        Job {
            n,
            args: args.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            timeout: Duration::from_secs(240),
            skip_ranks: Vec::new(),
        }
    }

    /// Adds an environment variable for every rank.
    pub fn env(mut self, k: &str, v: &str) -> Job {
        self.env.push((k.into(), v.into()));
        self
    }

    /// The environment rank `rank` gets: torchcomms' launcher variables and a fresh port.
    pub fn rank_env(&self, rank: usize, port: u16) -> Vec<(String, String)> {
        let mut env = vec![
            ("TORCHCOMM_RANK".to_string(), rank.to_string()),
            ("TORCHCOMM_SIZE".to_string(), self.n.to_string()),
            ("MASTER_ADDR".to_string(), "127.0.0.1".to_string()),
            ("MASTER_PORT".to_string(), port.to_string()),
            ("TORCHCOMM_ABORT_ON_ERROR".to_string(), "0".to_string()),
        ];
        env.extend(self.env.iter().cloned());
        env
    }

    /// Starts one rank.
    pub fn spawn_rank(&self, worker: &Path, rank: usize, port: u16) -> Child {
        let mut cmd = Command::new(worker);
        cmd.args(&self.args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
        for (k, v) in self.rank_env(rank, port) {
            cmd.env(k, v);
        }
        cmd.spawn()
            .unwrap_or_else(|e| panic!("spawn rank {rank} of {}: {e}", worker.display()))
    }

    /// Runs the job on a fresh port and waits for every rank.
    pub fn run(&self, worker: &Path) -> Vec<RankOutput> {
        let port = free_port();
        let children: Vec<(usize, Child)> = (0..self.n)
            .filter(|r| !self.skip_ranks.contains(r))
            .map(|r| (r, self.spawn_rank(worker, r, port)))
            .collect();
        collect(children, self.timeout)
    }
}

/// Waits for `children` (rank, process), killing those still running at `timeout`.
pub fn collect(children: Vec<(usize, Child)>, timeout: Duration) -> Vec<RankOutput> {
    let start = Instant::now();
    // Drain pipes on threads so a chatty rank never blocks on a full pipe.
    let mut readers = Vec::new();
    let mut procs = Vec::new();
    for (rank, mut child) in children {
        let mut out = child.stdout.take().expect("piped stdout");
        let mut err = child.stderr.take().expect("piped stderr");
        let t_out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let t_err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        readers.push((t_out, t_err));
        procs.push((rank, child, None::<(Option<ExitStatus>, Duration)>));
    }
    while procs.iter().any(|p| p.2.is_none()) {
        for p in procs.iter_mut().filter(|p| p.2.is_none()) {
            if let Ok(Some(status)) = p.1.try_wait() {
                p.2 = Some((Some(status), start.elapsed()));
            } else if start.elapsed() > timeout {
                let _ = p.1.kill();
                let _ = p.1.wait();
                p.2 = Some((None, start.elapsed()));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    procs
        .into_iter()
        .zip(readers)
        .map(|((rank, _, done), (o, e))| {
            let (status, elapsed) = done.expect("every process finished");
            RankOutput {
                rank,
                status,
                stdout: o.join().unwrap_or_default(),
                stderr: e.join().unwrap_or_default(),
                elapsed,
            }
        })
        .collect()
}

/// Panics with every rank's output unless all ranks exited 0.
pub fn assert_all_ok(outs: &[RankOutput], what: &str) {
    assert!(!outs.is_empty(), "{what}: no rank ran");
    for o in outs {
        assert!(
            o.ok(),
            "{what}: rank {} exited with {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            o.rank,
            o.status,
            o.stdout,
            o.stderr
        );
    }
}

/// Runs this executable once per rank (`TORCHCOMM_RANK`/`SIZE`, `MASTER_ADDR`/`PORT` on a free
/// loopback port, plus `env`) and waits for every rank, inheriting their output: the GPU
/// binaries that are their own ranks. The error names every rank that failed.
pub fn run_self_as_ranks(n: usize, env: &[(&str, String)]) -> std::io::Result<()> {
    let port = free_port();
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.env("TORCHCOMM_RANK", r.to_string())
            .env("TORCHCOMM_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
        for (k, v) in env {
            cmd.env(k, v);
        }
        children.push(cmd.spawn()?);
    }
    let mut failed = Vec::new();
    for (r, mut c) in children.into_iter().enumerate() {
        let st = c.wait()?;
        if !st.success() {
            failed.push(format!("rank {r}: {st}"));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(std::io::Error::other(failed.join("; ")))
    }
}

/// Exit status of a GPU check program that tested nothing because there is no usable CUDA
/// here: the automake convention for SKIP, so that a skip is never read as a pass.
pub const EXIT_SKIPPED: u8 = 77;

/// The exit status of a GPU check program named `name`: 0 when it passed (`Ok(true)`),
/// [`EXIT_SKIPPED`] when nothing could be tested (`Ok(false)`), 1 (with the error printed)
/// when a check failed.
pub fn gpu_exit<E: std::fmt::Display>(name: &str, r: Result<bool, E>) -> std::process::ExitCode {
    match r {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(EXIT_SKIPPED),
        Err(e) => {
            eprintln!("{name}: FAILED: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
