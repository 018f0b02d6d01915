//! Setting up the full mesh of TCP connections of one communicator.
//!
//! Every rank listens on one port and publishes its address. Rank `i` connects to every rank
//! above it and accepts from every rank below. Each connection proves, in both directions,
//! that its end holds the communicator's key, which derives from the job key (see
//! [`handshake`](super::handshake)); anything else that connects is refused and logged.
//!
//! All handshakes, outgoing and incoming, run at once in one `poll` loop, each with its own
//! deadline: a connection that sends nothing holds one slot of [`MAX_PENDING`] until its
//! deadline or until newer connections push it out, and delays no one (a sequential accept
//! loop that waited 2 s per silent client let 70 such sockets fail every rank's init).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::conn::Conn;
use super::handshake::{Outcome, Shake};
use super::protect::{Protection, Session};
use super::{SocketTransport, Waker};
use crate::error::{Error, Result};

/// Most incoming handshakes in progress; the oldest is dropped for a new one. A real peer
/// answers within a round trip, so it survives any number of idle intruders.
pub const MAX_PENDING: usize = 64;

/// Spin before sleeping when every local rank has a core of its own.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// Tunables of the TCP transport.
#[derive(Debug, Clone, Default)]
pub struct SocketConfig {
    /// Address to listen on; `None` picks the address this host uses to reach the store.
    pub ifaddr: Option<IpAddr>,
    /// How long a waiting rank spins before it sleeps in `poll`; `None` decides from the number
    /// of ranks sharing this host's cores (spinning only pays when each has a core).
    pub spin: Option<Duration>,
    /// Socket send/receive buffer size in bytes; 0 keeps the kernel's auto-tuning. `None`
    /// decides at creation (see `LOCAL_BUF_BYTES` in `comm::init`).
    pub buf_bytes: Option<usize>,
}

/// A bound, listening socket whose address is published before the mesh is connected.
#[derive(Debug)]
pub struct Listener {
    sock: Socket,
    addr: SocketAddr,
}

impl Listener {
    /// Listens on `ip` with a port chosen by the OS.
    pub fn bind(ip: IpAddr) -> Result<Listener> {
        let ctx = |what: &str| format!("{what} on {ip}");
        let sock = Socket::new(
            Domain::for_address(SocketAddr::new(ip, 0)),
            Type::STREAM,
            Some(Protocol::TCP),
        )
        .map_err(|e| Error::io(ctx("socket"), e))?;
        sock.set_reuse_address(true)
            .map_err(|e| Error::io(ctx("SO_REUSEADDR"), e))?;
        sock.set_cloexec(true)
            .map_err(|e| Error::io(ctx("FD_CLOEXEC"), e))?;
        sock.bind(&SockAddr::from(SocketAddr::new(ip, 0)))
            .map_err(|e| Error::io(ctx("bind"), e))?;
        sock.listen(1024).map_err(|e| Error::io(ctx("listen"), e))?;
        let addr = sock
            .local_addr()
            .map_err(|e| Error::io(ctx("getsockname"), e))?
            .as_socket()
            .ok_or_else(|| {
                Error::io(
                    ctx("getsockname"),
                    std::io::Error::other("not an IP address"),
                )
            })?;
        Ok(Listener { sock, addr })
    }

    /// The address peers connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Who this rank is and how to reach everyone else.
#[derive(Debug, Clone)]
pub struct MeshPlan {
    /// Communicator name, for messages.
    pub comm: String,
    /// This rank.
    pub rank: usize,
    /// Listening address of every rank (index = rank).
    pub addrs: Vec<SocketAddr>,
    /// The communicator's key: both ends of every connection prove they hold it.
    pub key: [u8; 32],
    /// How long one handshake may take before it is dropped (an incoming one) or retried (an
    /// outgoing one): `TORCHCOMMS_HANDSHAKE_TIMEOUT_SECONDS`.
    pub handshake_timeout: Duration,
    /// What protects the data of every connection (`TORCHCOMMS_DATA_PROTECTION`); the
    /// handshake fails when two ranks differ.
    pub protection: Protection,
    /// The process id of each rank that runs on this host in this pid namespace (else `None`;
    /// may be empty): set-up fails in moments when one of them exits before it connected,
    /// instead of at the deadline.
    pub local_pids: Vec<Option<u32>>,
}

/// How often set-up looks whether local peers that have not connected yet still run.
const LIVENESS_EVERY: Duration = Duration::from_millis(200);

/// Whether process `pid` (of this pid namespace) has exited: gone, or a zombie not yet reaped.
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

/// Connects this rank to every other rank of `plan`, within `deadline`.
pub fn connect_mesh(
    listener: Listener,
    plan: &MeshPlan,
    cfg: &SocketConfig,
    deadline: Instant,
) -> Result<SocketTransport> {
    let size = plan.addrs.len();
    let rank = plan.rank;
    let socks = Handshakes::new(plan, deadline).run(&listener)?;

    let waker = Arc::new(Waker::new().map_err(|e| Error::io("eventfd", e))?);
    let mut conns = Vec::with_capacity(size);
    for (peer, sock) in socks.into_iter().enumerate() {
        match sock {
            Some((s, session)) => {
                let tuning = |e| Error::io(format!("tuning socket to rank {peer}"), e);
                s.set_tcp_nodelay(true).map_err(tuning)?;
                let conn = Conn::new(peer, s, session).map_err(|e| Error::io("O_NONBLOCK", e))?;
                if let Some(bytes) = cfg.buf_bytes.filter(|&b| b > 0) {
                    conn.set_buffers(bytes).map_err(tuning)?;
                }
                conns.push(Some(conn));
            }
            None => conns.push(None),
        }
    }
    Ok(SocketTransport::from_conns(
        rank,
        conns,
        waker,
        cfg.spin.unwrap_or(DEFAULT_SPIN),
    ))
}

/// A connection whose handshake is done, with the keys of its data path (if protected).
type Authenticated = (Socket, Option<Session>);

/// The handshakes of one rank's mesh set-up.
struct Handshakes<'a> {
    plan: &'a MeshPlan,
    deadline: Instant,
    /// Authenticated connection per peer.
    socks: Vec<Option<Authenticated>>,
    connected: Vec<bool>,
    /// Incoming handshakes, oldest first (`None`: finished this round, swept at the next).
    incoming: Vec<Option<Shake>>,
    /// Outgoing handshake per higher peer, and when to try again after a failed attempt.
    outgoing: Vec<Option<Shake>>,
    retry_at: Vec<Option<Instant>>,
    backoff: Vec<Duration>,
    /// Why the last attempt to each higher peer failed.
    last_failure: Vec<Option<String>>,
    /// Refused incoming connections, and the last reason.
    refused: usize,
    last_refusal: Option<String>,
}

impl<'a> Handshakes<'a> {
    fn new(plan: &'a MeshPlan, deadline: Instant) -> Handshakes<'a> {
        let size = plan.addrs.len();
        let now = Instant::now();
        Handshakes {
            plan,
            deadline,
            socks: (0..size).map(|_| None).collect(),
            connected: vec![false; size],
            incoming: Vec::new(),
            outgoing: (0..size).map(|_| None).collect(),
            retry_at: (0..size).map(|p| (p > plan.rank).then_some(now)).collect(),
            backoff: vec![Duration::from_millis(5); size],
            last_failure: vec![None; size],
            refused: 0,
            last_refusal: None,
        }
    }

    fn fail(&self, reason: String) -> Error {
        Error::Bootstrap {
            comm: self.plan.comm.clone(),
            reason,
        }
    }

    fn done(&self) -> bool {
        (0..self.connected.len()).all(|p| p == self.plan.rank || self.connected[p])
    }

    /// Runs every handshake to the end; returns the authenticated socket of every peer.
    fn run(mut self, listener: &Listener) -> Result<Vec<Option<Authenticated>>> {
        listener
            .sock
            .set_nonblocking(true)
            .map_err(|e| Error::io("listener O_NONBLOCK", e))?;
        let mut next_look = Instant::now() + LIVENESS_EVERY;
        while !self.done() {
            let now = Instant::now();
            if now >= self.deadline {
                return Err(self.timed_out());
            }
            if now >= next_look {
                next_look = now + LIVENESS_EVERY;
                self.check_local_peers()?;
            }
            self.incoming.retain(Option::is_some);
            self.start_due(now)?;
            self.expire(now);
            let accepting = (0..self.plan.rank).any(|p| !self.connected[p]);
            let (listener_ready, events) = self.poll(listener, accepting)?;
            if listener_ready {
                self.accept(listener)?;
            }
            for (id, revents) in events {
                self.on_event(id, revents)?;
            }
        }
        // Whoever is still handshaking is not a peer: say so, so an intruder is always logged.
        for i in 0..self.incoming.len() {
            if self.incoming[i].is_some() {
                let s = self.take_incoming(i);
                self.refuse(&s, "still handshaking when every peer had connected".into());
            }
        }
        Ok(self.socks)
    }

    /// Fails when a local peer that has not connected yet has exited.
    fn check_local_peers(&self) -> Result<()> {
        for (peer, pid) in self.plan.local_pids.iter().enumerate() {
            let Some(pid) = *pid else { continue };
            if peer != self.plan.rank && !self.connected[peer] && exited(pid) {
                let mut reason = format!(
                    "rank {peer} (pid {pid} on this host) exited during set-up and did not connect"
                );
                if let Some(last) = &self.last_refusal {
                    reason += &format!("; refused {} connections, the last {last}", self.refused);
                }
                return Err(self.fail(reason));
            }
        }
        Ok(())
    }

    /// Starts the outgoing handshakes whose time has come.
    fn start_due(&mut self, now: Instant) -> Result<()> {
        for peer in self.plan.rank + 1..self.plan.addrs.len() {
            if self.connected[peer] || self.retry_at[peer].is_none_or(|t| t > now) {
                continue;
            }
            self.retry_at[peer] = None;
            let addr = self.plan.addrs[peer];
            let attempt = (now + self.plan.handshake_timeout).min(self.deadline);
            match Shake::connect(self.plan, peer, addr, attempt) {
                Ok(s) => self.outgoing[peer] = Some(s),
                Err(e) => self.retry(peer, format!("connect to {addr}: {e}")),
            }
        }
        Ok(())
    }

    /// Schedules another attempt to reach `peer`, backing off.
    fn retry(&mut self, peer: usize, why: String) {
        tracing::debug!(comm = %self.plan.comm, rank = self.plan.rank, peer, "retrying: {why}");
        self.outgoing[peer] = None;
        self.retry_at[peer] = Some(Instant::now() + self.backoff[peer]);
        self.backoff[peer] = (self.backoff[peer] * 2).min(Duration::from_millis(200));
        self.last_failure[peer] = Some(why);
    }

    /// Removes an incoming handshake, leaving a hole so the ids of this round stay valid.
    fn take_incoming(&mut self, i: usize) -> Shake {
        self.incoming[i].take().expect("a live handshake")
    }

    /// Reports why a rank waiting for its lower peers gave up.
    fn timed_out(&self) -> Error {
        let rank = self.plan.rank;
        let absent: Vec<usize> = (0..rank).filter(|&r| !self.connected[r]).collect();
        let unreached: Vec<String> = (rank + 1..self.connected.len())
            .filter(|&r| !self.connected[r])
            .map(|r| match &self.last_failure[r] {
                Some(why) => format!("rank {r} ({why})"),
                None => format!("rank {r}"),
            })
            .collect();
        let mut reason = format!("rank {rank} timed out setting up its connections");
        if !absent.is_empty() {
            reason += &format!("; ranks {absent:?} did not connect");
        }
        if !unreached.is_empty() {
            reason += &format!("; could not reach {}", unreached.join(", "));
        }
        if let Some(last) = &self.last_refusal {
            reason += &format!("; refused {} connections, the last {last}", self.refused);
        }
        self.fail(reason)
    }

    fn refuse(&mut self, shake: &Shake, why: String) {
        tracing::warn!(comm = %self.plan.comm, rank = self.plan.rank,
            "refused connection from {}: {why}", shake.addr);
        self.refused += 1;
        self.last_refusal = Some(format!("from {}: {why}", shake.addr));
    }

    /// Drops the handshakes past their deadline.
    fn expire(&mut self, now: Instant) {
        let timeout = self.plan.handshake_timeout;
        for i in 0..self.incoming.len() {
            if self.incoming[i].as_ref().is_some_and(|s| s.deadline <= now) {
                let s = self.take_incoming(i);
                self.refuse(
                    &s,
                    format!(
                        "no handshake within {timeout:?} (TORCHCOMMS_HANDSHAKE_TIMEOUT_SECONDS)"
                    ),
                );
            }
        }
        for peer in 0..self.outgoing.len() {
            if self.outgoing[peer]
                .as_ref()
                .is_some_and(|s| s.deadline <= now)
            {
                self.retry(peer, "no answer within the handshake timeout".into());
            }
        }
    }

    /// Waits for activity: (listener readable, (handshake id, events)). Ids below
    /// `incoming.len()` are incoming handshakes, the rest `incoming.len() + peer`.
    fn poll(
        &self,
        listener: &Listener,
        accepting: bool,
    ) -> Result<(bool, Vec<(usize, PollFlags)>)> {
        let mut ids = Vec::new();
        let mut fds = Vec::new();
        fds.push(PollFd::new(
            listener.sock.as_fd(),
            if accepting {
                PollFlags::POLLIN
            } else {
                PollFlags::empty()
            },
        ));
        for (i, s) in self.incoming.iter().enumerate() {
            let Some(s) = s else { continue };
            ids.push(i);
            fds.push(PollFd::new(s.sock.as_fd(), s.interest()));
        }
        for (peer, s) in self.outgoing.iter().enumerate() {
            if let Some(s) = s {
                ids.push(self.incoming.len() + peer);
                fds.push(PollFd::new(s.sock.as_fd(), s.interest()));
            }
        }
        // Sleep until the next deadline or retry, and never long: deadlines are checked here.
        let now = Instant::now();
        let next = self
            .incoming
            .iter()
            .flatten()
            .chain(self.outgoing.iter().flatten())
            .map(|s| s.deadline)
            .chain(self.retry_at.iter().flatten().copied())
            .chain([self.deadline])
            .min()
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now));
        let timeout = next.clamp(Duration::from_millis(1), Duration::from_millis(100));
        let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        loop {
            match poll(&mut fds, timeout) {
                Ok(_) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(Error::io("poll during mesh set-up", e.into())),
            }
        }
        let listener_ready = fds[0].any().unwrap_or(false);
        let events = ids
            .into_iter()
            .zip(&fds[1..])
            .filter_map(|(id, fd)| fd.revents().filter(|r| !r.is_empty()).map(|r| (id, r)))
            .collect();
        Ok((listener_ready, events))
    }

    fn accept(&mut self, listener: &Listener) -> Result<()> {
        loop {
            let (sock, from) = match listener.sock.accept() {
                Ok(pair) => pair,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // Out of descriptors and the like: keep going with the handshakes we have.
                Err(e) => {
                    tracing::warn!(comm = %self.plan.comm, error = %e, "accept failed");
                    return Ok(());
                }
            };
            let addr = from.as_socket().map(|a| a.to_string()).unwrap_or_default();
            if self.incoming.iter().flatten().count() >= MAX_PENDING {
                let oldest = self
                    .incoming
                    .iter()
                    .position(Option::is_some)
                    .expect("MAX_PENDING > 0");
                let oldest = self.take_incoming(oldest);
                self.refuse(
                    &oldest,
                    format!("dropped for a newer connection ({MAX_PENDING} handshakes pending)"),
                );
            }
            let deadline = (Instant::now() + self.plan.handshake_timeout).min(self.deadline);
            match Shake::accept(sock, addr, deadline) {
                Ok(s) => self.incoming.push(Some(s)),
                Err(e) => return Err(Error::io("accepted socket O_NONBLOCK", e)),
            }
        }
    }

    fn on_event(&mut self, id: usize, revents: PollFlags) -> Result<()> {
        let n_in = self.incoming.len();
        let outcome = if id < n_in {
            match self.incoming[id].as_mut() {
                Some(s) => s.on_event(revents, self.plan, &self.connected),
                None => return Ok(()),
            }
        } else {
            match self.outgoing[id - n_in].as_mut() {
                Some(s) => s.on_event(revents, self.plan, &self.connected),
                None => return Ok(()),
            }
        };
        match outcome {
            Outcome::Pending => {}
            Outcome::Done(peer) => {
                let shake = if id < n_in {
                    self.take_incoming(id)
                } else {
                    self.outgoing[id - n_in].take().expect("checked above")
                };
                self.connected[peer] = true;
                let session = shake.session(self.plan);
                self.socks[peer] = Some((shake.sock, session));
            }
            Outcome::Refused(why) => {
                let shake = self.take_incoming(id);
                self.refuse(&shake, why);
            }
            Outcome::Retry(why) => {
                let peer = id - n_in;
                let addr = self.plan.addrs[peer];
                self.retry(peer, format!("rank {peer} at {addr}: {why}"));
            }
            Outcome::Fatal(why) => {
                return Err(self.fail(format!("rank {}: {why}", self.plan.rank)));
            }
        }
        Ok(())
    }
}
/// The address to listen on when none is configured: the one this host uses to reach
/// `toward` (found by connecting a UDP socket, which sends nothing), else loopback.
pub fn default_listen_ip(toward: Option<IpAddr>) -> IpAddr {
    if let Some(ip) = toward {
        if ip.is_loopback() || ip.is_unspecified() {
            return ip;
        }
        let probe = std::net::UdpSocket::bind(SocketAddr::new(
            if ip.is_ipv4() {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            } else {
                IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
            },
            0,
        ))
        .and_then(|s| s.connect(SocketAddr::new(ip, 9)).map(|()| s))
        .and_then(|s| s.local_addr());
        if let Ok(local) = probe {
            return local.ip();
        }
    }
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

#[cfg(test)]
mod tests {
    use std::net::TcpStream;

    use super::*;

    /// Runs `keys.len()` ranks as threads on loopback; returns each rank's result and time.
    fn mesh(
        keys: &[[u8; 32]],
        intruders: usize,
        timeout: Duration,
    ) -> Vec<(Result<SocketTransport>, Duration)> {
        let listeners: Vec<Listener> = keys
            .iter()
            .map(|_| Listener::bind(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap())
            .collect();
        let addrs: Vec<SocketAddr> = listeners.iter().map(Listener::addr).collect();
        // Silent connections, made before any rank starts: they sit first in every backlog.
        let silent: Vec<TcpStream> = addrs
            .iter()
            .flat_map(|a| (0..intruders).map(move |_| TcpStream::connect(a).unwrap()))
            .collect();
        let start = Instant::now();
        let ranks: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(rank, l)| {
                let plan = MeshPlan {
                    comm: "t".into(),
                    rank,
                    addrs: addrs.clone(),
                    key: keys[rank],
                    handshake_timeout: Duration::from_secs(10),
                    protection: Protection::None,
                    local_pids: Vec::new(),
                };
                std::thread::spawn(move || {
                    let r = connect_mesh(l, &plan, &SocketConfig::default(), start + timeout);
                    (r, start.elapsed())
                })
            })
            .collect();
        let out = ranks.into_iter().map(|t| t.join().unwrap()).collect();
        drop(silent);
        out
    }

    #[test]
    fn silent_connections_do_not_delay_the_mesh() {
        let outs = mesh(&[[3; 32]; 4], 100, Duration::from_secs(30));
        for (rank, (r, took)) in outs.iter().enumerate() {
            assert!(r.is_ok(), "rank {rank}: {:?}", r.as_ref().err());
            // Each silent socket cost 2 s before; 100 of them now cost nothing measurable.
            assert!(*took < Duration::from_secs(5), "rank {rank} took {took:?}");
        }
    }

    #[test]
    fn a_rank_with_another_key_fails_every_rank() {
        let outs = mesh(&[[3; 32], [4; 32]], 0, Duration::from_secs(3));
        let e0 = outs[0].0.as_ref().unwrap_err().to_string();
        assert!(
            e0.contains("did not prove it holds this job's key"),
            "rank 0: {e0}"
        );
        assert!(outs[0].1 < Duration::from_secs(2), "rank 0 fails at once");
        let e1 = outs[1].0.as_ref().unwrap_err().to_string();
        assert!(
            e1.contains("did not connect") && e1.contains("proving the job key"),
            "rank 1: {e1}"
        );
    }
}
