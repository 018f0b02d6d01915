//! Creating communicators: from a store (addresses and a public nonce under the communicator's
//! prefix), or by splitting a parent (the same exchange carried by the parent's own all_gather,
//! so no store is needed after the first communicator).
//!
//! The store is unauthenticated (torch's protocol), so nothing secret goes there: each
//! communicator's secret derives from the job key and the nonce
//! ([`JobKey::comm_secret`](torchcomms_core::bootstrap::auth::JobKey::comm_secret)), and every
//! transport connection proves knowledge of a key derived from that secret.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytemuck::{Pod, Zeroable};

use super::cpus::{host_cores, RankCpus, RANK_CPUS_BYTES};
use super::stable_hash::StableHasher;
use super::{Comm, CommConfig, Op};
use crate::bootstrap::auth::JobKey;
use crate::bootstrap::bind::BindAddr;
use crate::bootstrap::{PrefixStore, Store};
use crate::error::{Error, Result};
use crate::transport::mapper::Mapper;
use crate::transport::shm::ShmTransport;
use crate::transport::socket::mesh::{
    connect_mesh, default_listen_ip, Listener, MeshPlan, DEFAULT_SPIN,
};
use crate::transport::socket::{SocketTransport, Waker};

/// How many communicators of each name this rank created: all ranks create them in the same
/// order, so the count gives every instance its own store prefix. Keyed by rank too, for ranks
/// that are threads of one process.
fn next_instance(name: &str, rank: usize) -> u64 {
    static COUNTS: OnceLock<Mutex<HashMap<(String, usize), u64>>> = OnceLock::new();
    let mut m = COUNTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let c = m.entry((name.to_string(), rank)).or_insert(0);
    *c += 1;
    *c
}

/// The address peers should use to reach this rank.
fn advertised_ip(config: &CommConfig, store_hint: Option<IpAddr>) -> IpAddr {
    if let Some(ip) = config.socket.ifaddr {
        return ip;
    }
    if let Some(hint) = store_hint.filter(|ip| !ip.is_loopback()) {
        return hint;
    }
    let master = crate::bootstrap::bind::master_addr_ipv4();
    match master {
        Some(ip) => default_listen_ip(Some(ip)),
        None => store_hint.unwrap_or(IpAddr::from([127, 0, 0, 1])),
    }
}

fn listen(config: &CommConfig, store_hint: Option<IpAddr>) -> Result<(Listener, SocketAddr)> {
    let ip = advertised_ip(config, store_hint);
    // Bind the advertised address only (TORCHCOMMS_BIND_ADDR=all: every interface, as before).
    let bind = match BindAddr::from_cvars()? {
        BindAddr::Auto => ip,
        BindAddr::Ip(bind) => bind,
        BindAddr::All if ip.is_ipv4() => IpAddr::from([0, 0, 0, 0]),
        BindAddr::All => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let listener = Listener::bind(bind)?;
    let port = listener.addr().port();
    Ok((listener, SocketAddr::new(ip, port)))
}

/// Identifies "this host" for shared memory: same kernel boot and same network namespace (ranks
/// in different network namespaces act as different hosts and talk over TCP).
pub(crate) fn host_id() -> u64 {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let netns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    StableHasher::new()
        .str(read("/proc/sys/kernel/random/boot_id").trim())
        .str(&netns)
        .str(&host)
        .finish()
}

/// The name of the shared-memory segment of this host's ranks of a communicator, whose first
/// local rank is `first`.
fn segment_name(secret: &[u8; 16], host: u64, first: usize) -> String {
    let h = StableHasher::new().bytes(secret).u64(host).finish();
    format!("/tcrs-{first}-{h:016x}")
}

/// Runs the rest of set-up (`rest`); if it fails, removes this host's shared-memory segment of
/// the communicator, which a local rank that died after creating it would leave behind (the
/// survivors may fail before they reach the segment).
fn unlinking_on_failure<T>(
    (use_shm, rank): (bool, usize),
    hosts: &[u64],
    secret: &[u8; 16],
    rest: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let result = rest();
    if result.is_err() && use_shm {
        let me = hosts[rank];
        if let Some(first) = (0..hosts.len()).find(|&r| hosts[r] == me) {
            crate::transport::shm::remove_segment(&segment_name(secret, me, first));
        }
    }
    result
}

/// The transports of a communicator, the cores of this rank's host and the waker of its
/// progress thread.
struct Transports {
    mapper: Mapper,
    host_cores: usize,
    waker: Arc<Waker>,
}

/// Sets up shared memory with the ranks of `hosts` (host id per rank) that share this rank's
/// host, when enabled, and returns the transports of the communicator. `cpus` holds every
/// rank's CPUs: the host's cores are the union of its ranks' (see [`cpus`](super::cpus)).
fn transports(
    config: &mut CommConfig,
    socket: SocketTransport,
    hosts: &[u64],
    cpus: &[RankCpus],
    secret: &[u8; 16],
    deadline: Instant,
) -> Result<Transports> {
    let mut socket = socket;
    let waker = Arc::clone(socket.waker());
    let me = hosts[config.rank];
    let local: Vec<usize> = (0..hosts.len()).filter(|&r| hosts[r] == me).collect();
    let cores = host_cores(local.iter().map(|&r| &cpus[r]));
    // A rank runs two threads that wait on each other (the caller and the progress thread):
    // spinning only pays when each has a core, on the host and within this rank's own CPUs.
    let own = cpus[config.rank].set.count();
    config
        .wait_spin
        .get_or_insert(if 2 * local.len() <= cores && own >= 2 {
            DEFAULT_WAIT_SPIN
        } else {
            Duration::ZERO
        });
    if config.socket.spin.is_none() {
        socket.set_spin(if local.len() <= cores {
            DEFAULT_SPIN
        } else {
            Duration::ZERO
        });
    }
    if config.socket.buf_bytes.is_none() && local.len() <= cores {
        let peers = local.iter().copied().filter(|&r| r != config.rank);
        socket.set_buffers(peers, LOCAL_BUF_BYTES);
    }
    let shm = if config.use_shm && local.len() > 1 {
        let name = segment_name(secret, me, local[0]);
        // A local peer that dies during set-up closes its connection: fail in moments.
        let peers: Vec<usize> = local
            .iter()
            .copied()
            .filter(|&r| r != config.rank)
            .collect();
        let mut alive = || socket.probe_idle(peers.iter().copied());
        let shm = ShmTransport::attach(
            &name,
            config.rank,
            config.size,
            &local,
            cores,
            &config.shm,
            deadline,
            &mut alive,
        )
        .map_err(|e| Error::Bootstrap {
            comm: config.name.clone(),
            reason: format!("shared memory: {e}"),
        })?;
        Some(shm)
    } else {
        None
    };
    let ib = if config.want_ib {
        let peers: Vec<usize> = (0..config.size)
            .filter(|&p| p != config.rank && !shm.as_ref().is_some_and(|s| s.reaches(p)))
            .collect();
        crate::transport::ib::connect_peers(
            config.ib_provider,
            &mut socket,
            config.rank,
            config.size,
            &peers,
            deadline,
        )
        .map_err(|reason| Error::Bootstrap {
            comm: config.name.clone(),
            reason,
        })?
    } else {
        None
    };
    Ok(Transports {
        mapper: Mapper::new(socket, shm, ib),
        host_cores: cores,
        waker,
    })
}

/// Socket buffers between ranks of one host that each have a core (`CTRAN_SOCKET_BUF_BYTES`
/// unset). The kernel starts a connection with small windows (16 KiB to send, 128 KiB to
/// receive) and grows them slowly on loopback, so a message above about 64 KiB waits for the
/// receiver's window updates. Measured with 2 ranks of 2 cores: auto at 128-512 KiB took 0.46-0.6
/// of the time with 4 MiB buffers, broadcast at 8-64 MiB 0.63-0.77. With more ranks than cores
/// (4 on 2) the larger buffers gained nothing (`docs/perf/algorithms.md`).
const LOCAL_BUF_BYTES: usize = 4 << 20;

/// How long a waiting caller or idle progress thread spins when cores allow (`CTRAN_WAIT_SPIN_US`
/// unset): longer than a small collective on one host takes, far shorter than a sleep costs.
const DEFAULT_WAIT_SPIN: Duration = Duration::from_micros(30);

fn random_secret() -> [u8; 16] {
    rand::random()
}

/// The job key, or an error that says where it was looked for.
fn job_key(comm: &str) -> Result<JobKey> {
    let (key, source) = JobKey::load().map_err(|e| Error::Bootstrap {
        comm: comm.to_string(),
        reason: format!("no job key: {e}"),
    })?;
    tracing::debug!(comm, %source, fingerprint = format_args!("{:016x}", key.fingerprint()),
        "job key");
    Ok(key)
}

/// What a communicator's connections prove they hold: derived from its secret and the job key,
/// so that even a secret seen on the wire (a split's, inside the parent's traffic) is useless
/// without the key.
fn mesh_key(key: &JobKey, comm: &str, secret: &[u8; 16]) -> [u8; 32] {
    key.mac(&[b"torchcomms-rs mesh key v1", comm.as_bytes(), secret])
}

pub(super) fn init_with_store(config: CommConfig, store: Arc<dyn Store>) -> Result<Comm> {
    let trace = super::trace::new_trace(&config, (0..config.size).collect());
    let step = trace.begin_comm_op("init", config.timeout, None);
    let result = connect_with_store(config, store, &trace);
    super::trace::end_init(&trace, step, &result);
    result
}

fn connect_with_store(
    mut config: CommConfig,
    store: Arc<dyn Store>,
    trace: &Arc<colltrace::CommTrace>,
) -> Result<Comm> {
    let deadline = Instant::now() + config.timeout;
    let fail = |reason: String| Error::Bootstrap {
        comm: config.name.clone(),
        reason,
    };
    let instance = match config.dedicated_store {
        true => 0,
        false => next_instance(&config.name, config.rank),
    };
    let prefix = format!("torchcomms/{}/{instance}", config.name);
    let root = Arc::clone(&store);
    let store = PrefixStore::new(prefix, store);
    let (listener, advertised) = listen(&config, store.local_addr_hint())?;
    let (rank, size) = (config.rank, config.size);
    let key = job_key(&config.name)?;

    if rank == 0 {
        // Public: the secret derives from it and the job key, which never enters the store.
        store.set("nonce", &random_secret())?;
    }
    store.set(&format!("addr/{rank}"), advertised.to_string().as_bytes())?;
    let mut host = host_id().to_le_bytes().to_vec();
    host.extend_from_slice(&std::process::id().to_le_bytes());
    host.extend_from_slice(&pid_namespace().to_le_bytes());
    host.extend_from_slice(&RankCpus::of_this_thread().to_bytes());
    store.set(&format!("host/{rank}"), &host)?;
    let left = || deadline.saturating_duration_since(Instant::now());
    let nonce = decode_nonce(&store.get("nonce", left())?)
        .ok_or_else(|| fail("the store holds a malformed nonce".into()))?;
    let derived = key.comm_secret(store.prefix(), &nonce);
    let secret: [u8; 16] = derived[..16].try_into().expect("16 of 32 bytes");
    let mut addrs = Vec::with_capacity(size);
    for r in 0..size {
        let raw = store.get(&format!("addr/{r}"), left())?;
        addrs.push(
            decode_addr(&raw)
                .map_err(|text| fail(format!("rank {r} published a bad address {text:?}")))?,
        );
    }
    let mut hosts = Vec::with_capacity(size);
    let mut cpus = Vec::with_capacity(size);
    let mut local_pids = Vec::with_capacity(size);
    let (my_host, my_pidns) = (host_id(), pid_namespace());
    for r in 0..size {
        let raw = store.get(&format!("host/{r}"), left())?;
        let h = decode_host(&raw)
            .ok_or_else(|| fail(format!("rank {r} published a bad host record")))?;
        local_pids.push((h.id == my_host && h.pidns == my_pidns).then_some(h.pid));
        hosts.push(h.id);
        cpus.push(h.cpus);
    }
    let plan = MeshPlan {
        comm: config.name.clone(),
        rank,
        addrs,
        key: mesh_key(&key, &config.name, &secret),
        handshake_timeout: config.handshake_timeout,
        protection: config.protection,
        local_pids,
    };
    let t = unlinking_on_failure((config.use_shm, config.rank), &hosts, &secret, || {
        let socket = connect_mesh(listener, &plan, &config.socket, deadline)?;
        transports(&mut config, socket, &hosts, &cpus, &secret, deadline)
    })?;
    let comm = Comm::start(config, t.mapper, t.host_cores, t.waker, Arc::clone(trace))?;
    super::trace::publish_endpoint(&*root, &store, comm.config(), advertised.ip());
    // Nobody leaves before everybody has read the store, so the store can go away right after.
    comm.run(Op::Barrier, Some(left().max(Duration::from_millis(1))))?;
    Ok(comm)
}

/// The communicator's public nonce as rank 0 published it in the store.
fn decode_nonce(raw: &[u8]) -> Option<[u8; 16]> {
    raw.try_into().ok()
}

/// A rank's listening address as it published it in the store (text); the text on failure.
fn decode_addr(raw: &[u8]) -> std::result::Result<SocketAddr, String> {
    let text = String::from_utf8_lossy(raw);
    text.parse().map_err(|_| text.into_owned())
}

/// A rank's host record as it published it in the store.
struct HostRecord {
    id: u64,
    pid: u32,
    /// Identifies the rank's pid namespace: its pid means something here only when equal.
    pidns: u64,
    cpus: RankCpus,
}

/// A rank's host record from the store: host id, pid, pid namespace, then its CPUs.
fn decode_host(raw: &[u8]) -> Option<HostRecord> {
    let (id, rest) = raw.split_at_checked(8)?;
    let (pid, rest) = rest.split_at_checked(4)?;
    let (pidns, rank_cpus) = rest.split_at_checked(8)?;
    Some(HostRecord {
        id: u64::from_le_bytes(id.try_into().ok()?),
        pid: u32::from_le_bytes(pid.try_into().ok()?),
        pidns: u64::from_le_bytes(pidns.try_into().ok()?),
        cpus: RankCpus::from_bytes(rank_cpus)?,
    })
}

/// This process's pid namespace, hashed (0 when /proc does not say).
fn pid_namespace() -> u64 {
    let ns = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    StableHasher::new().str(&ns).finish()
}

/// What each parent rank tells the others during a split, as it is on the wire (fixed size, so
/// it rides one all_gather): integers little-endian.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct WireRecord {
    /// The new communicator's lowest parent rank, or -1 when this rank is not in it.
    color: i64,
    /// This rank's position in the new communicator.
    index: u64,
    list_hash: u64,
    secret: [u8; 16],
    /// Listening address (IPv4 mapped into IPv6) and port; zero when not in the new one.
    ip6: [u8; 16],
    port: u16,
    /// Zero.
    reserved: [u8; 6],
    host: u64,
    cpus: [u8; RANK_CPUS_BYTES],
}

/// Bytes of a [`WireRecord`].
const RECORD: usize = 72 + RANK_CPUS_BYTES;

const _: () = assert!(std::mem::size_of::<WireRecord>() == RECORD);

fn encode_record(
    color: Option<usize>,
    index: usize,
    list_hash: u64,
    secret: &[u8; 16],
    addr: Option<SocketAddr>,
) -> [u8; RECORD] {
    let (ip6, port) = match addr {
        Some(a) => {
            let ip6 = match a.ip() {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            (ip6.octets(), a.port())
        }
        None => ([0; 16], 0),
    };
    bytemuck::cast(WireRecord {
        color: color.map_or(-1i64, |c| c as i64).to_le(),
        index: (index as u64).to_le(),
        list_hash: list_hash.to_le(),
        secret: *secret,
        ip6,
        port: port.to_le(),
        reserved: [0; 6],
        host: host_id().to_le(),
        cpus: RankCpus::of_this_thread().to_bytes(),
    })
}

struct Record {
    color: Option<usize>,
    index: usize,
    list_hash: u64,
    secret: [u8; 16],
    addr: SocketAddr,
    host: u64,
    cpus: RankCpus,
}

fn decode_record(b: &[u8; RECORD]) -> Record {
    // The gathered buffer gives no alignment: read the record by value.
    let w: WireRecord = bytemuck::pod_read_unaligned(b);
    let ip6 = Ipv6Addr::from(w.ip6);
    let ip = ip6.to_ipv4_mapped().map_or(IpAddr::V6(ip6), IpAddr::V4);
    Record {
        color: usize::try_from(i64::from_le(w.color)).ok(),
        index: u64::from_le(w.index) as usize,
        list_hash: u64::from_le(w.list_hash),
        secret: w.secret,
        host: u64::from_le(w.host),
        cpus: RankCpus::from_bytes(&w.cpus).expect("a record holds a CPU set"),
        addr: SocketAddr::new(ip, u16::from_le(w.port)),
    }
}

pub(super) fn split(
    parent: &Comm,
    ranks: &[usize],
    name: &str,
    timeout: Duration,
    abort_process_on_error: bool,
) -> Result<Option<Comm>> {
    let detail = format!("new communicator `{name}` of parent ranks {ranks:?}");
    let step = parent.trace().begin_comm_op("split", timeout, Some(detail));
    let result = split_inner(parent, ranks, name, timeout, abort_process_on_error);
    step.finish(super::trace::outcome(
        &result.as_ref().map(|_| ()).map_err(Clone::clone),
    ));
    result
}

fn split_inner(
    parent: &Comm,
    ranks: &[usize],
    name: &str,
    timeout: Duration,
    abort_process_on_error: bool,
) -> Result<Option<Comm>> {
    let deadline = Instant::now() + timeout;
    let me = parent.rank();
    let joining = !ranks.is_empty();
    let index = ranks.iter().position(|&r| r == me);
    if joining && index.is_none() {
        return Err(Error::invalid(
            "ranks",
            format!("a list that contains this rank ({me})"),
            format!("{ranks:?}"),
        ));
    }
    let mut config = CommConfig::from_env(name, index.unwrap_or(0), ranks.len().max(1))?;
    config.timeout = timeout;
    config.socket = parent.config().socket.clone();
    config.chunk_bytes = parent.config().chunk_bytes;
    config.use_shm = parent.config().use_shm;
    config.want_ib = parent.config().want_ib;
    config.ib_provider = parent.config().ib_provider;
    config.shm = parent.config().shm.clone();
    config.abort_process_on_error = abort_process_on_error;
    let color = ranks.iter().copied().min();
    let list_hash = StableHasher::new().usizes(ranks).str(name).finish();
    let secret = random_secret();
    let listener = if joining {
        Some(listen(&config, None)?)
    } else {
        None
    };
    let mine = encode_record(
        color,
        index.unwrap_or(0),
        list_hash,
        &secret,
        listener.as_ref().map(|l| l.1),
    );

    let gathered = parent.all_gather_bytes(&mine, Some(timeout))?;

    let Some((listener, _)) = listener else {
        return Ok(None);
    };
    let records: Vec<Record> = gathered
        .chunks_exact(RECORD)
        .map(|c| decode_record(c.try_into().expect("chunks of RECORD bytes")))
        .collect();
    let mut addrs = Vec::with_capacity(ranks.len());
    let mut hosts = Vec::with_capacity(ranks.len());
    let mut cpus = Vec::with_capacity(ranks.len());
    for (i, &r) in ranks.iter().enumerate() {
        let rec = &records[r];
        if rec.color != color || rec.list_hash != list_hash || rec.index != i {
            return Err(Error::invalid(
                "ranks",
                "the same list of ranks and name on every member of the new communicator",
                format!(
                    "rank {me} passed {ranks:?}, parent rank {r} passed a different list or name"
                ),
            ));
        }
        addrs.push(rec.addr);
        hosts.push(rec.host);
        cpus.push(rec.cpus);
    }
    let key = job_key(name)?;
    let plan = MeshPlan {
        comm: name.to_string(),
        rank: config.rank,
        addrs,
        key: mesh_key(&key, name, &records[ranks[0]].secret),
        handshake_timeout: config.handshake_timeout,
        protection: config.protection,
        local_pids: Vec::new(),
    };
    let child_secret = records[ranks[0]].secret;
    let parent_ranks = &parent.trace().meta().global_ranks;
    let global = ranks
        .iter()
        .map(|&r| parent_ranks.get(r).copied().unwrap_or(r))
        .collect();
    let trace = super::trace::new_trace(&config, global);
    let step = trace.begin_comm_op(
        "init",
        timeout,
        Some(format!("split from `{}`", parent.name())),
    );
    let child = (|| {
        let shm = (config.use_shm, config.rank);
        let t = unlinking_on_failure(shm, &hosts, &child_secret, || {
            let socket = connect_mesh(listener, &plan, &config.socket, deadline)?;
            transports(&mut config, socket, &hosts, &cpus, &child_secret, deadline)
        })?;
        let child = Comm::start(config, t.mapper, t.host_cores, t.waker, Arc::clone(&trace))?;
        child.run(
            Op::Barrier,
            Some(
                deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
            ),
        )?;
        Ok(child)
    })();
    super::trace::end_init(&trace, step, &child);
    child.map(Some)
}

/// Fuzzing entry of the decoders of what other ranks published (feature `fuzzing`): the first
/// byte picks the record, the rest is its bytes.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_records(data: &[u8]) {
    let Some((&which, raw)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => {
            let _ = decode_nonce(raw);
        }
        1 => {
            let _ = decode_addr(raw);
        }
        2 => {
            if let Some(h) = decode_host(raw) {
                // What the host's cores are computed from; must not panic on any mask.
                super::cpus::host_cores([&h.cpus]);
            }
        }
        _ => {
            for c in raw.chunks_exact(RECORD) {
                let r = decode_record(c.try_into().expect("chunks of RECORD bytes"));
                super::cpus::host_cores([&r.cpus]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_record_keeps_its_wire_layout() {
        let addr: SocketAddr = "10.1.2.3:4567".parse().unwrap();
        let b = encode_record(Some(2), 5, 0xABCD, &[9; 16], Some(addr));
        assert_eq!(b[0..8], 2i64.to_le_bytes());
        assert_eq!(b[8..16], 5u64.to_le_bytes());
        assert_eq!(b[16..24], 0xABCDu64.to_le_bytes());
        assert_eq!(b[24..40], [9; 16]);
        let ip6 = std::net::Ipv4Addr::new(10, 1, 2, 3)
            .to_ipv6_mapped()
            .octets();
        assert_eq!(b[40..56], ip6);
        assert_eq!(b[56..58], 4567u16.to_le_bytes());
        assert_eq!(b[58..64], [0; 6]);
        assert_eq!(b[64..72], host_id().to_le_bytes());
        let r = decode_record(&b);
        assert_eq!(
            (r.color, r.index, r.list_hash, r.addr),
            (Some(2), 5, 0xABCD, addr)
        );
        let none = decode_record(&encode_record(None, 0, 0, &[0; 16], None));
        assert_eq!(none.color, None);
    }
}
