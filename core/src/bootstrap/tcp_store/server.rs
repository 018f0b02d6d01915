//! A TCPStore server that torch clients (and ours) can use.
//!
//! One background thread runs a `poll(2)` loop over the listening socket, a wake-up socket and
//! every client connection, like torch's libuv daemon. Being single-threaded makes every
//! operation atomic without locks, and lets a `WAIT` be parked server-side: the reply is queued
//! on the waiting connection when another connection sets the last missing key.
//!
//! [`db`] holds the keys and the parked waiters and answers requests; [`conn`] buffers one
//! client's bytes; [`daemon`] is the thread's loop that moves bytes between them.

mod conn;
mod daemon;
mod db;
#[cfg(feature = "fuzzing")]
pub(super) mod fuzz;

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use crate::error::{Error, Result};
use daemon::Daemon;

/// What the server lets its clients use (`TORCHCOMMS_STORE_*`, `docs/cvars.md`). Every client
/// is unauthenticated (torch's protocol has no authentication), so each of these bounds what
/// anyone who reaches the port can make the server hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// Largest value (`TORCHCOMMS_STORE_MAX_VALUE_BYTES`).
    pub max_value: usize,
    /// Memory quota: stored data, requests in progress, unread replies
    /// (`TORCHCOMMS_STORE_MAX_BYTES`).
    pub max_bytes: usize,
    /// Unread reply bytes per client at which its requests stop being read
    /// (`TORCHCOMMS_STORE_CLIENT_BUFFER_BYTES`).
    pub client_buffer: usize,
    /// Most open connections (`TORCHCOMMS_STORE_MAX_CONNECTIONS`).
    pub max_connections: usize,
    /// Time a connection has to send VALIDATE (`TORCHCOMMS_HANDSHAKE_TIMEOUT_SECONDS`).
    pub handshake_timeout: Duration,
}

impl StoreLimits {
    /// The limits of a configuration.
    pub fn from(cv: &torchcomms_cvars::Cvars) -> StoreLimits {
        StoreLimits {
            max_value: cv
                .torchcomms_store_max_value_bytes()
                .min(super::protocol::MAX_VALUE_LEN as usize),
            max_bytes: cv.torchcomms_store_max_bytes(),
            client_buffer: cv.torchcomms_store_client_buffer_bytes(),
            max_connections: usize::try_from(cv.torchcomms_store_max_connections())
                .unwrap_or(1)
                .max(1),
            handshake_timeout: cv.torchcomms_handshake_timeout_seconds(),
        }
    }

    /// The configured limits (defaults, `TORCHCOMMS_CONFIG`, environment).
    pub fn from_env() -> Result<StoreLimits> {
        let cv = torchcomms_cvars::reload()
            .map_err(|e| Error::invalid("TORCHCOMMS_STORE_*", "a valid configuration", e))?;
        Ok(StoreLimits::from(&cv))
    }
}

impl Default for StoreLimits {
    /// The declared defaults, whatever the environment says.
    fn default() -> StoreLimits {
        let cv =
            torchcomms_cvars::Cvars::load_from(|_| None).expect("the declared defaults are valid");
        StoreLimits::from(&cv)
    }
}

/// A TCPStore server compatible with `torch.distributed.TCPStore` clients (torch ≥ 2.4, which
/// send the VALIDATE/PING handshake) and with [`TcpStoreClient`](super::TcpStoreClient).
///
/// Serves on a background thread until dropped or [`shutdown`](Self::shutdown); then every
/// connection is closed and the port is free to bind again at once (the listener uses
/// `SO_REUSEADDR`, so connections lingering in `TIME_WAIT` do not block the next server).
#[derive(Debug)]
pub struct TcpStoreServer {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    wake_tx: Option<UnixStream>,
    thread: Option<JoinHandle<()>>,
}

impl TcpStoreServer {
    /// Binds `host:port` and starts serving. `port` 0 picks an ephemeral port (see
    /// [`port`](Self::port)). An empty `host`, `0.0.0.0` or `::` listens on every interface
    /// (IPv6 dual-stack when the host has IPv6, else IPv4), as torch's server does.
    ///
    /// The limits come from the configuration ([`StoreLimits::from_env`]).
    pub fn bind(host: &str, port: u16) -> Result<Self> {
        Self::bind_with(host, port, StoreLimits::from_env()?)
    }

    /// [`bind`](Self::bind) with explicit limits.
    pub fn bind_with(host: &str, port: u16, limits: StoreLimits) -> Result<Self> {
        let listener = bind_listener(host, port)?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| Error::io("TCP store server: local address of listener", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("TCP store server: set listener non-blocking", e))?;
        let (wake_tx, wake_rx) =
            UnixStream::pair().map_err(|e| Error::io("TCP store server: wake-up socket", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let daemon = Daemon::new(listener, wake_rx, stop.clone(), limits);
        let thread = std::thread::Builder::new()
            .name(format!("tcpstore-{}", local_addr.port()))
            .spawn(move || daemon.run())
            .map_err(|e| Error::io("TCP store server: spawn thread", e))?;
        tracing::debug!(%local_addr, "TCP store server listening");
        Ok(TcpStoreServer {
            local_addr,
            stop,
            wake_tx: Some(wake_tx),
            thread: Some(thread),
        })
    }

    /// The port the server listens on (the ephemeral one when bound with port 0).
    pub fn port(&self) -> u16 {
        self.local_addr.port()
    }

    /// The address the listener is bound to (a wildcard address when bound to all interfaces).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops serving, closes all connections and frees the port; reports a server thread that
    /// died abnormally.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<()> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        self.stop.store(true, Ordering::Release);
        if let Some(mut tx) = self.wake_tx.take() {
            // A failed write means the thread is gone already; join tells us how.
            let _ = tx.write_all(&[1]);
        }
        thread.join().map_err(|_| Error::Bootstrap {
            comm: String::new(),
            reason: format!("TCP store server on {} panicked", self.local_addr),
        })
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        if let Err(e) = self.stop_and_join() {
            tracing::error!(error = %e, "TCP store server shutdown");
        }
    }
}

fn bind_listener(host: &str, port: u16) -> Result<TcpListener> {
    let wildcard = matches!(host, "" | "0.0.0.0" | "::" | "[::]" | "*");
    if wildcard {
        let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
        match listen_on(v6, true) {
            Ok(l) => return Ok(l),
            // Hosts without IPv6 fail with EAFNOSUPPORT/EADDRNOTAVAIL; a port conflict is real.
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                return Err(Error::io(format!("TCP store server: bind {v6}"), e));
            }
            Err(e) => tracing::debug!(error = %e, "TCP store server: no IPv6, using IPv4"),
        }
        let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
        return listen_on(v4, false)
            .map_err(|e| Error::io(format!("TCP store server: bind {v4}"), e));
    }
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::io(format!("TCP store server: resolve {host}:{port}"), e))?
        .collect();
    let mut last = None;
    for addr in addrs {
        match listen_on(addr, false) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some((addr, e)),
        }
    }
    Err(match last {
        Some((addr, e)) => Error::io(format!("TCP store server: bind {addr}"), e),
        None => Error::invalid("host", "a resolvable host name or address", host),
    })
}

fn listen_on(addr: SocketAddr, dual_stack: bool) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if dual_stack {
        socket.set_only_v6(false)?;
    }
    socket.set_cloexec(true)?;
    socket.bind(&addr.into())?;
    // Every rank connects at once during bootstrap: a deep backlog avoids refused/dropped SYNs
    // (the kernel caps it at somaxconn).
    socket.listen(65535)?;
    Ok(socket.into())
}
