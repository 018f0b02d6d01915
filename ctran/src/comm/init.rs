//! Creating communicators: from a store (addresses and a secret under the communicator's
//! prefix), or by splitting a parent (the same exchange carried by the parent's own all_gather,
//! so no store is needed after the first communicator).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{Comm, CommConfig, Op};
use crate::bootstrap::{PrefixStore, Store};
use crate::error::{Error, Result};
use crate::span::Span;
use crate::transport::socket::mesh::{connect_mesh, default_listen_ip, Listener, MeshPlan};

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
    let master = std::env::var("MASTER_ADDR").ok().and_then(|host| {
        (host.as_str(), 0)
            .to_socket_addrs()
            .ok()?
            .map(|a| a.ip())
            .find(|ip| ip.is_ipv4())
    });
    match master {
        Some(ip) => default_listen_ip(Some(ip)),
        None => store_hint.unwrap_or(IpAddr::from([127, 0, 0, 1])),
    }
}

fn listen(config: &CommConfig, store_hint: Option<IpAddr>) -> Result<(Listener, SocketAddr)> {
    let ip = advertised_ip(config, store_hint);
    // Listen on every interface, advertise the one peers can route to.
    let any = if ip.is_ipv4() {
        IpAddr::from([0, 0, 0, 0])
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    };
    let listener = Listener::bind(any)?;
    let port = listener.addr().port();
    Ok((listener, SocketAddr::new(ip, port)))
}

fn random_secret() -> [u8; 16] {
    rand::random()
}

pub(super) fn init_with_store(config: CommConfig, store: Arc<dyn Store>) -> Result<Comm> {
    let deadline = Instant::now() + config.timeout;
    let fail = |reason: String| Error::Bootstrap {
        comm: config.name.clone(),
        reason,
    };
    let prefix = format!(
        "torchcomms/{}/{}",
        config.name,
        next_instance(&config.name, config.rank)
    );
    let store = PrefixStore::new(prefix, store);
    let (listener, advertised) = listen(&config, store.local_addr_hint())?;
    let (rank, size) = (config.rank, config.size);

    if rank == 0 {
        store.set("secret", &random_secret())?;
    }
    store.set(&format!("addr/{rank}"), advertised.to_string().as_bytes())?;
    let left = || deadline.saturating_duration_since(Instant::now());
    let secret: [u8; 16] = store
        .get("secret", left())?
        .try_into()
        .map_err(|_| fail("the store holds a malformed secret".into()))?;
    let mut addrs = Vec::with_capacity(size);
    for r in 0..size {
        let raw = store.get(&format!("addr/{r}"), left())?;
        let text = String::from_utf8_lossy(&raw);
        addrs.push(
            text.parse::<SocketAddr>()
                .map_err(|_| fail(format!("rank {r} published a bad address {text:?}")))?,
        );
    }
    let plan = MeshPlan {
        comm: config.name.clone(),
        rank,
        addrs,
        secret,
    };
    let transport = connect_mesh(listener, &plan, &config.socket, deadline)?;
    let comm = Comm::start(config, transport)?;
    // Nobody leaves before everybody has read the store, so the store can go away right after.
    comm.run(Op::Barrier, Some(left().max(Duration::from_millis(1))))?;
    Ok(comm)
}

/// What each parent rank tells the others during a split (fixed size, so it rides one
/// all_gather).
const RECORD: usize = 64;

fn encode_record(
    color: Option<usize>,
    index: usize,
    list_hash: u64,
    secret: &[u8; 16],
    addr: Option<SocketAddr>,
) -> [u8; RECORD] {
    let mut b = [0u8; RECORD];
    b[0..8].copy_from_slice(&color.map_or(-1i64, |c| c as i64).to_le_bytes());
    b[8..16].copy_from_slice(&(index as u64).to_le_bytes());
    b[16..24].copy_from_slice(&list_hash.to_le_bytes());
    b[24..40].copy_from_slice(secret);
    if let Some(a) = addr {
        let ip6 = match a.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        b[40..56].copy_from_slice(&ip6.octets());
        b[56..58].copy_from_slice(&a.port().to_le_bytes());
    }
    b
}

struct Record {
    color: Option<usize>,
    index: usize,
    list_hash: u64,
    secret: [u8; 16],
    addr: SocketAddr,
}

fn decode_record(b: &[u8]) -> Record {
    let color = i64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
    let ip6 = Ipv6Addr::from(<[u8; 16]>::try_from(&b[40..56]).expect("16 bytes"));
    let ip = ip6.to_ipv4_mapped().map_or(IpAddr::V6(ip6), IpAddr::V4);
    Record {
        color: usize::try_from(color).ok(),
        index: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")) as usize,
        list_hash: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
        secret: b[24..40].try_into().expect("16 bytes"),
        addr: SocketAddr::new(
            ip,
            u16::from_le_bytes(b[56..58].try_into().expect("2 bytes")),
        ),
    }
}

pub(super) fn split(
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
    config.abort_process_on_error = abort_process_on_error;
    let color = ranks.iter().copied().min();
    let list_hash = {
        let mut h = DefaultHasher::new();
        ranks.hash(&mut h);
        name.hash(&mut h);
        h.finish()
    };
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

    let size = parent.size();
    let mut gathered = vec![0u8; RECORD * size];
    let mut input = mine;
    // SAFETY: `input` and `gathered` live on this stack frame until `run` returns, which is
    // after the operation completed or failed for good.
    let (input_span, out_span) = unsafe {
        (
            Span::from_slice(&mut input),
            Span::from_slice(&mut gathered),
        )
    };
    let outputs = (0..size)
        .map(|r| out_span.sub(r * RECORD, RECORD))
        .collect();
    parent.run(
        Op::AllGather {
            input: input_span,
            outputs,
        },
        Some(timeout),
    )?;

    let Some((listener, _)) = listener else {
        return Ok(None);
    };
    let records: Vec<Record> = gathered.chunks_exact(RECORD).map(decode_record).collect();
    let mut addrs = Vec::with_capacity(ranks.len());
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
    }
    let plan = MeshPlan {
        comm: name.to_string(),
        rank: config.rank,
        addrs,
        secret: records[ranks[0]].secret,
    };
    let transport = connect_mesh(listener, &plan, &config.socket, deadline)?;
    let child = Comm::start(config, transport)?;
    child.run(
        Op::Barrier,
        Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        ),
    )?;
    Ok(Some(child))
}
