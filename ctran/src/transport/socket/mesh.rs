//! Setting up the full mesh of TCP connections of one communicator.
//!
//! Every rank listens on one port and publishes its address. Rank `i` connects to every rank
//! above it and accepts from every rank below. A connection proves it belongs to this
//! communicator by sending the communicator's secret (drawn by its rank 0 and shared through the
//! store or the parent communicator); anything else that connects is refused and logged.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytemuck::{Pod, Zeroable};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::conn::Conn;
use super::{SocketTransport, Waker};
use crate::error::{Error, Result};

const HELLO_MAGIC: &[u8; 8] = b"TCRSHELO";
pub(crate) const HELLO_LEN: usize = 48;
const HELLO_VERSION: u32 = 1;
/// How long an accepted connection may take to say hello before it is dropped as stray.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

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
    /// Shared secret proving a connection belongs to this communicator.
    pub secret: [u8; 16],
}

/// What a connecting rank sends first, as it is on the wire: integers little-endian.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct Hello {
    magic: [u8; 8],
    version: u32,
    /// The connecting rank.
    from: u32,
    /// The rank it means to reach.
    to: u32,
    /// Zero.
    reserved: [u8; 12],
    secret: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<Hello>() == HELLO_LEN);

impl Hello {
    /// The hello as it is read from the wire.
    fn read(b: &[u8; HELLO_LEN]) -> Hello {
        let h: Hello = bytemuck::cast(*b);
        Hello {
            version: u32::from_le(h.version),
            from: u32::from_le(h.from),
            to: u32::from_le(h.to),
            ..h
        }
    }
}

fn hello(plan: &MeshPlan, to: usize) -> [u8; HELLO_LEN] {
    bytemuck::cast(Hello {
        magic: *HELLO_MAGIC,
        version: HELLO_VERSION.to_le(),
        from: (plan.rank as u32).to_le(),
        to: (to as u32).to_le(),
        reserved: [0; 12],
        secret: plan.secret,
    })
}

/// Constant-time comparison, so the secret cannot be guessed byte by byte from timing.
fn secret_matches(a: &[u8], b: &[u8; 16]) -> bool {
    a.len() == 16 && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks a hello from an accepted connection; returns the peer's rank or why it was refused.
pub(crate) fn check_hello(
    h: &[u8; HELLO_LEN],
    plan: &MeshPlan,
    connected: &[bool],
) -> std::result::Result<usize, String> {
    let h = Hello::read(h);
    if &h.magic != HELLO_MAGIC {
        return Err("not a torchcomms-rs peer (bad magic)".into());
    }
    let version = h.version;
    if version != HELLO_VERSION {
        return Err(format!(
            "protocol version {version}, expected {HELLO_VERSION}"
        ));
    }
    if !secret_matches(&h.secret, &plan.secret) {
        return Err("wrong communicator secret".into());
    }
    let (from, to) = (h.from as usize, h.to as usize);
    if to != plan.rank {
        return Err(format!(
            "addressed to rank {to}, this is rank {}",
            plan.rank
        ));
    }
    if from >= plan.rank {
        return Err(format!(
            "rank {from} must not connect to lower rank {}",
            plan.rank
        ));
    }
    if connected[from] {
        return Err(format!("rank {from} is already connected"));
    }
    Ok(from)
}

fn connect_with_retry(addr: SocketAddr, deadline: Instant) -> std::io::Result<TcpStream> {
    let mut backoff = Duration::from_millis(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "deadline passed",
            ));
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                std::thread::sleep(backoff.min(left));
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
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
    let fail = |reason: String| Error::Bootstrap {
        comm: plan.comm.clone(),
        reason,
    };
    let mut socks: Vec<Option<Socket>> = (0..size).map(|_| None).collect();

    // 1. Connect to every higher rank and say hello (small writes: they never block).
    for (peer, addr) in plan.addrs.iter().enumerate().skip(rank + 1) {
        let mut stream = connect_with_retry(*addr, deadline).map_err(|e| {
            fail(format!(
                "rank {rank} could not connect to rank {peer} at {addr}: {e}"
            ))
        })?;
        stream.write_all(&hello(plan, peer)).map_err(|e| {
            fail(format!(
                "rank {rank} could not greet rank {peer} at {addr}: {e}"
            ))
        })?;
        socks[peer] = Some(Socket::from(stream));
    }

    // 2. Accept every lower rank, refusing anything that does not prove it belongs here.
    let mut connected = vec![false; size];
    let mut missing = rank;
    listener
        .sock
        .set_nonblocking(true)
        .map_err(|e| Error::io("listener O_NONBLOCK", e))?;
    while missing > 0 {
        if Instant::now() >= deadline {
            let absent: Vec<usize> = (0..rank).filter(|&r| !connected[r]).collect();
            return Err(fail(format!(
                "rank {rank} timed out waiting for ranks {absent:?} to connect"
            )));
        }
        let (sock, from_addr) = match listener.sock.accept() {
            Ok(pair) => pair,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => return Err(Error::io("accept", e)),
        };
        let from_addr = from_addr
            .as_socket()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let mut stream = TcpStream::from(sock);
        let mut h = [0u8; HELLO_LEN];
        // The magic first, so a stray client is turned away without waiting for 48 bytes.
        let greeted = stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_read_timeout(Some(HELLO_TIMEOUT)))
            .and_then(|()| stream.read_exact(&mut h[..HELLO_MAGIC.len()]));
        let verdict = match greeted {
            Ok(()) if &h[..HELLO_MAGIC.len()] != HELLO_MAGIC => {
                Err("not a torchcomms-rs peer (bad magic)".to_string())
            }
            Ok(()) => match stream.read_exact(&mut h[HELLO_MAGIC.len()..]) {
                Ok(()) => check_hello(&h, plan, &connected),
                Err(e) => Err(format!("incomplete hello ({e})")),
            },
            Err(e) => Err(format!("no valid hello ({e})")),
        };
        match verdict {
            Ok(peer) => {
                stream
                    .write_all(&[1])
                    .map_err(|e| fail(format!("ack to rank {peer}: {e}")))?;
                connected[peer] = true;
                missing -= 1;
                socks[peer] = Some(Socket::from(stream));
            }
            Err(reason) => {
                tracing::warn!(
                    comm = %plan.comm,
                    rank,
                    "refused connection from {from_addr}: {reason}"
                );
            }
        }
    }

    // 3. Wait for every higher rank to accept us.
    for (peer, sock) in socks.iter().enumerate().skip(rank + 1) {
        let sock = sock.as_ref().expect("connected in step 1");
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        sock.set_read_timeout(Some(left))
            .map_err(|e| Error::io("SO_RCVTIMEO", e))?;
        let mut ack = [0u8; 1];
        (&*sock).read_exact(&mut ack).map_err(|e| {
            fail(format!(
                "rank {peer} did not accept rank {rank}'s connection: {e}"
            ))
        })?;
        sock.set_read_timeout(None)
            .map_err(|e| Error::io("SO_RCVTIMEO", e))?;
    }

    let waker = Arc::new(Waker::new().map_err(|e| Error::io("eventfd", e))?);
    let mut conns = Vec::with_capacity(size);
    for (peer, sock) in socks.into_iter().enumerate() {
        match sock {
            Some(s) => {
                let tuning = |e| Error::io(format!("tuning socket to rank {peer}"), e);
                s.set_tcp_nodelay(true).map_err(tuning)?;
                let conn = Conn::new(peer, s).map_err(|e| Error::io("O_NONBLOCK", e))?;
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
    use super::*;

    #[test]
    fn the_hello_keeps_its_wire_layout_and_is_checked() {
        let plan = |rank| MeshPlan {
            comm: "t".into(),
            rank,
            addrs: Vec::new(),
            secret: [7; 16],
        };
        let h = hello(&plan(1), 3);
        let mut want = [0u8; HELLO_LEN];
        want[0..8].copy_from_slice(HELLO_MAGIC);
        want[8..12].copy_from_slice(&HELLO_VERSION.to_le_bytes());
        want[12..16].copy_from_slice(&1u32.to_le_bytes());
        want[16..20].copy_from_slice(&3u32.to_le_bytes());
        want[32..48].copy_from_slice(&[7; 16]);
        assert_eq!(h, want);
        assert_eq!(check_hello(&h, &plan(3), &[false; 4]), Ok(1));
        let mut other = plan(3);
        other.secret = [8; 16];
        assert!(check_hello(&h, &other, &[false; 4]).is_err());
    }
}
