//! Every traced communicator of the process, the process-wide settings, and dumping.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::clock::now_ns;
use crate::schema::{CommState, Dump, Trigger, SCHEMA_NAME, SCHEMA_VERSION};
use crate::trace::CommTrace;
use crate::{DumpOn, Error, TraceConfig};

/// Communicators kept after they finished, for post-mortem dumps.
const KEEP_FINISHED: usize = 64;

#[derive(Debug)]
struct Settings {
    dir: PathBuf,
    dump_on: DumpOn,
}

#[derive(Debug, Default)]
struct Registry {
    comms: Mutex<Vec<Arc<CommTrace>>>,
    settings: Mutex<Option<Settings>>,
    instances: Mutex<HashMap<(String, usize), u64>>,
}

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Registry::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn register(t: &Arc<CommTrace>) {
    let mut comms = lock(&registry().comms);
    // Communicators that ended (finalized, or dropped: only this registry still holds them)
    // stay for post-mortem dumps, the newest KEEP_FINISHED of them.
    let ended =
        |c: &Arc<CommTrace>| Arc::strong_count(c) == 1 || matches!(c.state(), CommState::Finalized);
    let mut n_ended = comms.iter().filter(|c| ended(c)).count();
    while n_ended > KEEP_FINISHED {
        match comms.iter().position(ended) {
            Some(i) => {
                comms.remove(i);
                n_ended -= 1;
            }
            None => break,
        }
    }
    comms.push(Arc::clone(t));
}

/// Applies the process-wide part of `cfg` (dump directory and triggers; the SIGUSR1 handler and
/// the live endpoint start with the first configuration that asks for them). Communicator
/// creation calls it; the latest call wins for the directory and the triggers.
pub fn configure(cfg: &TraceConfig) {
    if cfg.buffer_size > 0 {
        crate::clock::init(cfg.tsc);
    }
    *lock(&registry().settings) = Some(Settings {
        dir: cfg.dir.clone(),
        dump_on: cfg.dump_on,
    });
    if cfg.buffer_size > 0 && cfg.dump_on.signal {
        crate::signal::install();
    }
    if let (Some(addr), true) = (cfg.http, cfg.buffer_size > 0) {
        crate::http::start(addr);
    }
}

/// The trace of the communicator named `name` in which this process is rank `rank` (the
/// newest such, when a name was reused), for bindings that know a communicator by name and
/// rank only. `None` when no traced communicator matches (tracing off, or a backend that
/// records none).
pub fn find(name: &str, rank: usize) -> Option<Arc<CommTrace>> {
    lock(&registry().comms)
        .iter()
        .rev()
        .find(|c| c.meta().name == name && c.meta().rank == rank)
        .cloned()
}

/// The directory automatic dumps go to.
pub fn trace_dir() -> PathBuf {
    lock(&registry().settings)
        .as_ref()
        .map(|s| s.dir.clone())
        .unwrap_or_else(|| TraceConfig::default().dir)
}

fn dump_on() -> DumpOn {
    lock(&registry().settings)
        .as_ref()
        .map(|s| s.dump_on)
        .unwrap_or_else(|| TraceConfig::default().dump_on)
}

/// The instance number of the next communicator named `name` on global rank `rank` (1, 2, ...).
pub fn next_instance(name: &str, rank: usize) -> u64 {
    let mut m = lock(&registry().instances);
    let c = m.entry((name.to_string(), rank)).or_insert(0);
    *c += 1;
    *c
}

fn host() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Everything this process knows, one [`Dump`] per global rank (one, unless ranks are threads
/// of one process).
pub fn snapshot(trigger: Trigger, reason: Option<&str>) -> Vec<Dump> {
    let comms: Vec<Arc<CommTrace>> = lock(&registry().comms).clone();
    let mut by_rank: BTreeMap<usize, Vec<Arc<CommTrace>>> = BTreeMap::new();
    for c in comms {
        by_rank.entry(c.meta().global_rank()).or_default().push(c);
    }
    let endpoint = crate::http::addr().map(|a| a.to_string());
    let (pid, host, now) = (std::process::id(), host(), now_ns());
    by_rank
        .into_iter()
        .map(|(rank, comms)| Dump {
            schema: SCHEMA_NAME.into(),
            version: SCHEMA_VERSION,
            rank,
            pid,
            host: host.clone(),
            trigger,
            reason: reason.map(Into::into),
            dumped_at_ns: now,
            endpoint: endpoint.clone(),
            comms: comms.iter().map(|c| c.snapshot()).collect(),
        })
        .collect()
}

/// Writes `dump` to `path` atomically (a temporary file renamed into place).
fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), Error> {
    let io = |e: std::io::Error| Error::Io {
        path: path.to_path_buf(),
        source: Arc::new(e),
    };
    // One temporary file per writer: two threads of a process may dump to the same path.
    static WRITERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let writer = WRITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("json.tmp{}-{writer}", std::process::id()));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    serde_json::to_writer_pretty(&mut f, value).map_err(|e| io(e.into()))?;
    f.flush().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io)
}

fn create_dir(dir: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Io {
        path: dir.to_path_buf(),
        source: Arc::new(e),
    })
}

/// The file a rank's dump goes to: `colltrace_rank<N>.json`.
pub fn dump_file_name(rank: usize) -> String {
    format!("colltrace_rank{rank}.json")
}

/// Writes one file per rank of this process into `dir`, with `trigger` and `reason`.
pub fn dump(dir: &Path, trigger: Trigger, reason: Option<&str>) -> Result<Vec<PathBuf>, Error> {
    create_dir(dir)?;
    let mut paths = Vec::new();
    for d in snapshot(trigger, reason) {
        let path = dir.join(dump_file_name(d.rank));
        write_json(&path, &d)?;
        paths.push(path);
    }
    Ok(paths)
}

/// Writes every rank's trace of this process into `dir` (one `colltrace_rank<N>.json` per
/// rank): the dump API that the Python and C bindings call.
pub fn dump_all(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    dump(dir, Trigger::Api, Some("requested through the API"))
}

/// Dumps into the configured directory (`TORCHCOMMS_TRACE_DIR`).
pub fn dump_configured(trigger: Trigger, reason: Option<&str>) -> Result<Vec<PathBuf>, Error> {
    dump(&trace_dir(), trigger, reason)
}

impl CommTrace {
    /// Writes only this communicator, as `colltrace_rank<N>_<name>_<instance>.json` in `dir`.
    pub fn dump_to(
        &self,
        dir: &Path,
        trigger: Trigger,
        reason: Option<&str>,
    ) -> Result<PathBuf, Error> {
        create_dir(dir)?;
        let m = self.meta();
        let d = Dump {
            schema: SCHEMA_NAME.into(),
            version: SCHEMA_VERSION,
            rank: m.global_rank(),
            pid: std::process::id(),
            host: host(),
            trigger,
            reason: reason.map(Into::into),
            dumped_at_ns: now_ns(),
            endpoint: crate::http::addr().map(|a| a.to_string()),
            comms: vec![self.snapshot()],
        };
        let safe: String = m
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = dir.join(format!(
            "colltrace_rank{}_{safe}_{}.json",
            d.rank, m.instance
        ));
        write_json(&path, &d)?;
        Ok(path)
    }
}

/// Records that the communicator of `trace` failed (or was aborted, for
/// [`Trigger::Abort`]) and, when `TORCHCOMMS_TRACE_DUMP_ON` names the trigger, dumps every
/// rank of this process into the configured directory. Returns the files written.
pub fn on_failure(trace: &CommTrace, trigger: Trigger, reason: &str) -> Vec<PathBuf> {
    let state = if trigger == Trigger::Abort {
        CommState::Aborted
    } else {
        CommState::Failed
    };
    trace.set_state(state, Some(reason.to_string()));
    if !trace.enabled() || !dump_on().wants(trigger) {
        return Vec::new();
    }
    match dump_configured(trigger, Some(reason)) {
        Ok(paths) => {
            tracing::error!(
                comm = %trace.meta().name,
                rank = trace.meta().rank,
                "colltrace: {} dumped to {paths:?}",
                trigger.name()
            );
            paths
        }
        Err(e) => {
            tracing::error!(comm = %trace.meta().name, "colltrace: dump failed: {e}");
            Vec::new()
        }
    }
}

/// The address of the live endpoint, when one is served.
pub fn http_addr() -> Option<SocketAddr> {
    crate::http::addr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CommMeta;

    fn meta(name: &str, rank: usize, instance: u64) -> CommMeta {
        CommMeta {
            name: name.into(),
            instance,
            rank,
            size: 2,
            global_ranks: vec![0, 1],
        }
    }

    #[test]
    fn find_returns_the_newest_trace_of_a_name_and_rank() {
        let _first = CommTrace::new(meta("find-test", 0, 1), 4);
        let other_rank = CommTrace::new(meta("find-test", 1, 1), 4);
        let newest = CommTrace::new(meta("find-test", 0, 2), 4);
        assert!(Arc::ptr_eq(&find("find-test", 0).unwrap(), &newest));
        assert!(Arc::ptr_eq(&find("find-test", 1).unwrap(), &other_rank));
        assert!(find("find-test", 2).is_none());
        assert!(find("find-test-other", 0).is_none());
        // Tracing off: nothing is registered, nothing is found.
        let _off = CommTrace::new(meta("find-off", 0, 1), 0);
        assert!(find("find-off", 0).is_none());
    }
}
