//! The local launcher: starts `-n` copies of this program as the ranks of one job on this host,
//! waits for them, and stops them all when one fails or the time is up.

use std::ffi::OsString;
use std::net::{Ipv4Addr, TcpListener};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::bench::WRONG_EXIT;
use crate::bind;
use crate::cli::Settings;

/// Variables of launchers that a child must not see: `TORCHCOMM_RANK`/`SIZE` name its rank,
/// and a stray torchrun agent-store flag would make rank 0 skip serving the store.
const CLEARED_VARS: [&str; 1] = ["TORCHELASTIC_USE_AGENT_STORE"];

/// A TCP port that was free a moment ago, for the store of rank 0.
fn free_port() -> Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .context("finding a free port on 127.0.0.1 for MASTER_PORT")?;
    Ok(l.local_addr()?.port())
}

/// Starts the ranks and supervises them; returns the exit status of the whole run.
pub(crate) fn launch(s: &Settings) -> Result<ExitCode> {
    let n = s.nranks;
    if s.root >= n {
        bail!(
            "invalid value for '--root': {} is not a rank (launching {n} ranks with -n)",
            s.root
        );
    }
    let exe = std::env::current_exe().context("finding this program to start the ranks")?;
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let port = free_port()?;
    tracing::debug!(n, port, exe = %exe.display(), "launching local ranks");
    let cpus = if s.bind {
        Some(bind::plan(&bind::allowed_cpus()?, n))
    } else {
        None
    };
    let mut ranks: Vec<Rank> = Vec::with_capacity(n);
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(&args)
            .env("TORCHCOMM_RANK", r.to_string())
            .env("TORCHCOMM_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("TORCHCOMM_ABORT_ON_ERROR", "0")
            .stdin(Stdio::null());
        for v in CLEARED_VARS {
            cmd.env_remove(v);
        }
        match &cpus {
            Some(plan) => cmd.env(bind::BIND_VAR, bind::encode(&plan[r])),
            None => cmd.env_remove(bind::BIND_VAR),
        };
        match cmd.spawn() {
            Ok(child) => ranks.push(Rank {
                rank: r,
                child,
                status: None,
            }),
            Err(e) => {
                stop(&mut ranks);
                return Err(e).with_context(|| format!("starting rank {r} ({})", exe.display()));
            }
        }
    }
    supervise(ranks, s.launch_timeout)
}

/// A started rank.
#[derive(Debug)]
struct Rank {
    rank: usize,
    child: Child,
    status: Option<ExitStatus>,
}

/// Kills (by pid) and reaps every rank still running.
fn stop(ranks: &mut [Rank]) {
    for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
        if let Err(e) = r.child.kill() {
            tracing::warn!(rank = r.rank, "cannot stop rank: {e}");
        }
        r.status = r.child.wait().ok();
    }
}

fn supervise(mut ranks: Vec<Rank>, limit: Duration) -> Result<ExitCode> {
    let deadline = Instant::now() + limit;
    loop {
        let mut failed = None;
        for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
            match r.child.try_wait() {
                Ok(Some(st)) => {
                    r.status = Some(st);
                    if !st.success() && st.code() != Some(i32::from(WRONG_EXIT)) {
                        failed.get_or_insert((r.rank, st));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    let rank = r.rank;
                    stop(&mut ranks);
                    return Err(e).with_context(|| format!("waiting for rank {rank}"));
                }
            }
        }
        if let Some((rank, st)) = failed {
            stop(&mut ranks);
            bail!("rank {rank} failed ({st}); stopped the other ranks");
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            break;
        }
        if Instant::now() >= deadline {
            stop(&mut ranks);
            bail!(
                "the ranks were still running after --launch-timeout {:?}; stopped them",
                limit
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let wrong = ranks.iter().any(|r| r.status.is_some_and(|s| !s.success()));
    Ok(if wrong {
        ExitCode::from(WRONG_EXIT)
    } else {
        ExitCode::SUCCESS
    })
}
