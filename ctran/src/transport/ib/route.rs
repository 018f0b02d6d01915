//! Routing a communicator's peers through ib: opening the provider `CTRAN_IB_PROVIDER` names,
//! agreeing with each peer over the (already authenticated) socket mesh whether both ranks
//! have ib, and exchanging endpoints the same way. A peer whose rank could not open ib, or that
//! this rank could not, stays on socket; both ranks of a pair decide alike, since each tells
//! the other.

use std::fmt;
use std::sync::OnceLock;
use std::time::Instant;

use ibverbx::soft::{SoftConfig, SoftFabric};

use super::select::{self, IbChoice};
use super::{IbBackend, IbSettings, IbTransport, SoftBackend, VerbsBackend};
use crate::span::Span;
use crate::transport::socket::SocketTransport;
use crate::transport::{Delivery, OpTag, Transport, TransportError};

/// What the ib transport runs on (`CTRAN_IB_PROVIDER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IbProvider {
    /// libibverbs and the first active port `CTRAN_IB_HCA` allows.
    #[default]
    Verbs,
    /// The process's software fabric ([`soft_fabric`]): reaches only ranks that are threads of
    /// this process.
    Soft,
}

impl IbProvider {
    /// Its code in the set-up frame (0 there: no ib).
    fn code(self) -> u8 {
        match self {
            IbProvider::Verbs => 1,
            IbProvider::Soft => 2,
        }
    }

    /// From the cvar's value (`verbs` or `soft`).
    pub fn parse(s: &str) -> Option<IbProvider> {
        match s {
            "verbs" => Some(IbProvider::Verbs),
            "soft" => Some(IbProvider::Soft),
            _ => None,
        }
    }
}

/// The ib transport as the mapper holds it, whatever its backend.
pub trait IbRoute: Transport + Send + fmt::Debug {
    /// Whether a request is posted and unfinished, or a finished send awaits its `Ack`: either
    /// way the transport must be polled.
    fn has_pending(&self) -> bool;
    /// Whether `peer` is connected through ib.
    fn reaches(&self, peer: usize) -> bool;
    /// Fails every request to `peer`, which another transport found gone.
    fn peer_lost(&mut self, peer: usize, e: TransportError);
    /// One non-blocking pass (completions, control messages); whether anything moved.
    fn poll_once(&mut self) -> bool;
    /// [`IbTransport::close`].
    fn close(&mut self);
    /// [`IbTransport::endpoint`].
    fn endpoint_for(&mut self, peer: usize) -> Result<Vec<u8>, String>;
    /// Drops the queue pairs and rings made for `peer` by [`IbRoute::endpoint_for`] when it
    /// will not be connected.
    fn forget(&mut self, peer: usize);
    /// [`IbTransport::connect`].
    fn connect_to(&mut self, peer: usize, endpoint: &[u8]) -> Result<(), String>;
}

impl<B: IbBackend> IbRoute for IbTransport<B> {
    fn has_pending(&self) -> bool {
        IbTransport::has_pending(self) || self.awaits_acks()
    }

    fn reaches(&self, peer: usize) -> bool {
        self.peers.get(peer).is_some_and(Option::is_some)
    }

    fn peer_lost(&mut self, peer: usize, e: TransportError) {
        self.fail_peer(peer, e);
    }

    fn poll_once(&mut self) -> bool {
        self.pass()
    }

    fn close(&mut self) {
        IbTransport::close(self)
    }

    fn endpoint_for(&mut self, peer: usize) -> Result<Vec<u8>, String> {
        self.endpoint(peer).map_err(|e| e.to_string())
    }

    fn forget(&mut self, peer: usize) {
        self.halves.remove(&peer);
    }

    fn connect_to(&mut self, peer: usize, endpoint: &[u8]) -> Result<(), String> {
        self.connect(peer, endpoint).map_err(|e| e.to_string())
    }
}

/// The software fabric every communicator of this process with `CTRAN_IB_PROVIDER=soft`
/// shares (each rank is one device of it).
pub fn soft_fabric() -> &'static SoftFabric {
    static FABRIC: OnceLock<SoftFabric> = OnceLock::new();
    FABRIC.get_or_init(|| SoftFabric::new(SoftConfig::default()))
}

/// What to build on a backend once [`open_backend`] opened one (a generic function, which a
/// closure cannot be).
pub(crate) trait WithBackend {
    /// What is built.
    type Out;
    /// Builds it on `backend`.
    fn with<B: IbBackend>(self, backend: B) -> Result<Self::Out, String>;
}

/// Opens `provider`'s backend (on the software fabric, a device named `device`; over verbs,
/// the first active port `cfg.hca` allows, sized for `peers` peers) and hands it to `build`,
/// or says why it cannot be opened.
pub(crate) fn open_backend<W: WithBackend>(
    provider: IbProvider,
    cfg: &ibverbx::IbConfig,
    device: &str,
    peers: usize,
    build: W,
) -> Result<W::Out, String> {
    match provider {
        IbProvider::Soft => build.with(SoftBackend::new(soft_fabric().device(device))),
        IbProvider::Verbs => match select::choose(&["ib"], &select::probe(), &cfg.hca) {
            IbChoice::NotUsed(why) => Err(why),
            IbChoice::Use(p) => {
                let backend = VerbsBackend::open(&p.device, p.port, cfg, peers)
                    .map_err(|e| format!("{}:{}: {e}", p.device, p.port))?;
                build.with(backend)
            }
        },
    }
}

/// Opens ib for `rank` of `size` ranks, or says why it cannot be used.
fn open(provider: IbProvider, rank: usize, size: usize) -> Result<Box<dyn IbRoute>, String> {
    struct Transport {
        rank: usize,
        size: usize,
        settings: IbSettings,
    }
    impl WithBackend for Transport {
        type Out = Box<dyn IbRoute>;
        fn with<B: IbBackend>(self, backend: B) -> Result<Box<dyn IbRoute>, String> {
            let t = IbTransport::new(backend, self.rank, self.size, self.settings);
            Ok(Box::new(t.map_err(|e| e.to_string())?))
        }
    }
    let cfg = ibverbx::IbConfig::from_env().map_err(|e| e.to_string())?;
    let settings = IbSettings::from_config(&cfg);
    let build = Transport {
        rank,
        size,
        settings,
    };
    open_backend(
        provider,
        &cfg,
        &format!("soft{rank}"),
        size.saturating_sub(1),
        build,
    )
}

/// Bytes of the frame each rank sends each peer: the provider it opened (1 byte, 0 for none),
/// the endpoint's length (4) and the endpoint, zero-padded. Every frame has this size, so a
/// rank without ib and one with it still exchange matching messages. A pair uses ib when both
/// opened the same provider.
const FRAME: usize = 4096;

/// Opens ib and connects it to `peers` (those shared memory does not reach) over `socket`,
/// before anything else runs on the mesh. Returns `None` when no peer uses it (logged with the
/// reason); an error when a peer's endpoint is unusable or the exchange fails by `deadline`.
pub(crate) fn connect(
    provider: IbProvider,
    socket: &mut SocketTransport,
    rank: usize,
    size: usize,
    peers: &[usize],
    deadline: Instant,
) -> Result<Option<Box<dyn IbRoute>>, String> {
    if peers.is_empty() {
        tracing::debug!("ib: not needed: shared memory reaches every peer");
        return Ok(None);
    }
    let mut ib = match open(provider, rank, size) {
        Ok(t) => Some(t),
        Err(why) => {
            tracing::info!("ib: not used: {why}; peers use socket");
            None
        }
    };
    let mut frames = Vec::with_capacity(peers.len());
    for &peer in peers {
        let mut f = vec![0u8; FRAME];
        if let Some(t) = ib.as_mut() {
            let ep = t.endpoint_for(peer)?;
            if ep.len() > FRAME - 5 {
                return Err(format!(
                    "ib: an endpoint of {} bytes does not fit the set-up frame ({} bytes): \
                     lower CTRAN_IB_MAX_QPS",
                    ep.len(),
                    FRAME - 5
                ));
            }
            f[0] = provider.code();
            f[1..5].copy_from_slice(&(ep.len() as u32).to_le_bytes());
            f[5..5 + ep.len()].copy_from_slice(&ep);
        }
        frames.push(f);
    }
    let theirs = exchange(socket, peers, &mut frames, deadline)?;
    let mut used = Vec::new();
    for (&peer, f) in peers.iter().zip(&theirs) {
        let Some(t) = ib.as_mut() else {
            continue;
        };
        if f[0] != provider.code() {
            t.forget(peer);
            continue;
        }
        let len = u32::from_le_bytes(f[1..5].try_into().expect("4 bytes")) as usize;
        let ep = f.get(5..5 + len).ok_or_else(|| {
            format!("ib: peer {peer} sent an endpoint length {len} past its frame")
        })?;
        t.connect_to(peer, ep).map_err(|e| match provider {
            IbProvider::Soft => format!(
                "{e} (CTRAN_IB_PROVIDER=soft reaches only ranks that are threads of one \
                     process)"
            ),
            IbProvider::Verbs => e,
        })?;
        used.push(peer);
    }
    // Nobody writes before every peer's queue pairs are connected (a write to a QP that is not
    // ready to receive fails once retries run out): a second round says "connected".
    let mut ready: Vec<Vec<u8>> = peers.iter().map(|_| vec![1u8]).collect();
    exchange(socket, peers, &mut ready, deadline)?;
    if used.is_empty() {
        if ib.is_some() {
            tracing::info!("ib: not used: no peer opened {provider:?} ib; peers use socket");
        }
        return Ok(None);
    }
    if used.len() < peers.len() {
        tracing::info!(
            "ib: peers {:?} did not open {provider:?} ib: they use socket",
            peers
                .iter()
                .filter(|p| !used.contains(p))
                .collect::<Vec<_>>()
        );
    }
    tracing::info!("ib: peers {used:?} use ib ({provider:?})");
    Ok(ib)
}

/// Sends `frames[i]` to `peers[i]` and receives a frame of the same length from each, over
/// `socket`.
fn exchange(
    socket: &mut SocketTransport,
    peers: &[usize],
    frames: &mut [Vec<u8>],
    deadline: Instant,
) -> Result<Vec<Vec<u8>>, String> {
    let mut theirs: Vec<Vec<u8>> = frames.iter().map(|f| vec![0u8; f.len()]).collect();
    let failed = |e: TransportError| {
        format!("ib: exchanging endpoints: {e} (does every rank have ib in CTRAN_BACKENDS?)")
    };
    let mut reqs = Vec::with_capacity(2 * peers.len());
    for ((&peer, mine), buf) in peers.iter().zip(frames.iter_mut()).zip(theirs.iter_mut()) {
        // SAFETY: both buffers outlive the requests, which finish (or fail) before this
        // function returns: the loop below waits for each, and an error aborts the socket
        // transport, which fails them all.
        let (out, inb) = unsafe { (Span::from_slice(mine), Span::from_slice(buf)) };
        reqs.push(
            socket
                .post_send(peer, out, OpTag::P2P, Delivery::Eager)
                .map_err(failed)?,
        );
        reqs.push(socket.post_recv(peer, inb, OpTag::P2P).map_err(failed)?);
    }
    let mut open = reqs;
    while !open.is_empty() {
        let mut still = Vec::with_capacity(open.len());
        for r in open {
            match socket.test(r) {
                Ok(true) => {}
                Ok(false) => still.push(r),
                Err(e) => {
                    socket.abort("ib set-up failed");
                    return Err(failed(e));
                }
            }
        }
        open = still;
        if open.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            socket.abort("ib set-up timed out");
            return Err("ib: exchanging endpoints: timed out".into());
        }
        if let Err(e) = socket.progress(deadline, false) {
            socket.abort("ib set-up failed");
            return Err(failed(e));
        }
    }
    Ok(theirs)
}
