//! The server thread: one `poll(2)` loop over the listener, the wake-up socket and every
//! connection, which accepts clients, moves their bytes and runs their requests in order.

use std::collections::HashMap;
use std::io;
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::super::protocol::{Query, Request, VALIDATION_MAGIC};
use super::conn::Conn;
use super::db::{ConnId, Db, Fatal, Outbox};
use super::StoreLimits;

/// The server thread's state.
pub(super) struct Daemon {
    listener: TcpListener,
    wake_rx: UnixStream,
    stop: Arc<AtomicBool>,
    conns: HashMap<ConnId, Conn>,
    next_id: ConnId,
    db: Db,
    limits: StoreLimits,
    /// Bytes held against `limits.max_bytes`: stored data plus every connection's
    /// [`footprint`](Conn::footprint). Recounted every round, kept current within it.
    used: usize,
    /// Connections closed at `max_connections` since the last warning (the warning is not
    /// repeated for each one).
    turned_away: u64,
}

impl Daemon {
    /// The state of a thread that serves `listener` until `stop` is set and `wake_rx` is
    /// written to.
    pub(super) fn new(
        listener: TcpListener,
        wake_rx: UnixStream,
        stop: Arc<AtomicBool>,
        limits: StoreLimits,
    ) -> Daemon {
        Daemon {
            listener,
            wake_rx,
            stop,
            conns: HashMap::new(),
            next_id: 0,
            db: Db::new(limits),
            limits,
            used: 0,
            turned_away: 0,
        }
    }

    pub(super) fn run(mut self) {
        loop {
            let (listener_ready, conn_events) = match self.poll_once() {
                Ok(ev) => ev,
                Err(e) => {
                    tracing::error!(error = %e, "TCP store server: poll failed; stopping");
                    return;
                }
            };
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if listener_ready {
                self.accept_all();
            }
            for (id, flags) in conn_events {
                self.service(id, flags);
            }
            self.close_unidentified();
            self.used = self
                .conns
                .values()
                .fold(self.db.bytes(), |n, c| n.saturating_add(c.footprint()));
            // Decode everything buffered, including input left over while a connection was
            // backlogged (no new POLLIN will announce it).
            let ready: Vec<ConnId> = self
                .conns
                .iter()
                .filter(|(_, c)| c.pending_input() || c.eof)
                .map(|(id, _)| *id)
                .collect();
            for id in ready {
                self.process(id);
            }
            for c in self.conns.values_mut() {
                if !c.dead && c.pending_output() && !c.flush() {
                    c.dead = true;
                }
            }
            self.reap();
        }
    }

    /// Waits for activity; returns whether the listener is readable and the connections with
    /// events.
    fn poll_once(&mut self) -> io::Result<(bool, Vec<(ConnId, PollFlags)>)> {
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        let mut fds = Vec::with_capacity(ids.len() + 2);
        fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
        fds.push(PollFd::new(self.wake_rx.as_fd(), PollFlags::POLLIN));
        for id in &ids {
            let c = &self.conns[id];
            let mut flags = PollFlags::empty();
            // After EOF the socket stays readable forever: stop asking. A connection at its
            // read cap waits for its buffered bytes to be decoded first.
            if !c.backlogged(self.limits.client_buffer) && c.wants_input() {
                flags |= PollFlags::POLLIN;
            }
            if c.pending_output() {
                flags |= PollFlags::POLLOUT;
            }
            fds.push(PollFd::new(c.stream.as_fd(), flags));
        }
        // Requests held at the high-water mark whose replies have all been written since: decode
        // them now rather than wait for an event that will not come.
        let timeout = if self
            .conns
            .values()
            .any(|c| c.resumable(self.limits.client_buffer))
        {
            PollTimeout::ZERO
        } else {
            // Wake up when the first unidentified connection's time is up.
            let now = Instant::now();
            self.conns
                .values()
                .filter(|c| !c.validated)
                .map(|c| {
                    (c.accepted + self.limits.handshake_timeout).saturating_duration_since(now)
                })
                .min()
                .map_or(PollTimeout::NONE, |d| {
                    // Round up: waking a millisecond early would spin.
                    PollTimeout::try_from(d + Duration::from_millis(1)).unwrap_or(PollTimeout::MAX)
                })
        };
        loop {
            match poll(&mut fds, timeout) {
                Ok(_) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(io::Error::from(e)),
            }
        }
        let listener_ready = fds[0].any().unwrap_or(false);
        let events = ids
            .iter()
            .zip(&fds[2..])
            .filter_map(|(id, fd)| fd.revents().filter(|r| !r.is_empty()).map(|r| (*id, r)))
            .collect();
        Ok((listener_ready, events))
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    if self.conns.len() >= self.limits.max_connections {
                        if self.turned_away == 0 {
                            tracing::warn!(%peer, max = self.limits.max_connections,
                                "TCP store server: at its connection limit \
                                 (TORCHCOMMS_STORE_MAX_CONNECTIONS); closing new connections");
                        }
                        self.turned_away += 1;
                        continue;
                    }
                    if let Err(e) = stream.set_nonblocking(true) {
                        tracing::warn!(%peer, error = %e, "TCP store server: cannot use connection");
                        continue;
                    }
                    // Replies are tiny; do not let Nagle hold them back.
                    let _ = stream.set_nodelay(true);
                    let id = self.next_id;
                    self.next_id += 1;
                    tracing::trace!(%peer, id, "TCP store server: accepted");
                    self.conns
                        .insert(id, Conn::new(stream, peer, self.limits.max_value));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE and friends: keep serving the connections we have.
                    tracing::warn!(error = %e, "TCP store server: accept failed");
                    return;
                }
            }
        }
    }

    /// Moves bytes for one connection according to its poll events.
    fn service(&mut self, id: ConnId, flags: PollFlags) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if flags.intersects(PollFlags::POLLOUT) && !conn.flush() {
            conn.dead = true;
            return;
        }
        // An error, or a hang-up while we are not reading (so no EOF would be seen): the peer
        // can take no more replies.
        if flags.intersects(PollFlags::POLLERR)
            || (flags.intersects(PollFlags::POLLHUP)
                && (conn.backlogged(self.limits.client_buffer) || conn.eof))
        {
            conn.dead = true;
            return;
        }
        if flags.intersects(PollFlags::POLLIN | PollFlags::POLLHUP) && !conn.fill() {
            conn.dead = true;
        }
    }

    /// Closes connections that did not send VALIDATE within the handshake timeout: a silent
    /// connection holds a descriptor and nothing else, and not for long.
    fn close_unidentified(&mut self) {
        let timeout = self.limits.handshake_timeout;
        for c in self.conns.values_mut() {
            if !c.validated && !c.dead && c.accepted.elapsed() >= timeout {
                tracing::debug!(peer = ?c.peer, ?timeout,
                    "TCP store server: no VALIDATE within TORCHCOMMS_HANDSHAKE_TIMEOUT_SECONDS; closing");
                c.dead = true;
            }
        }
        if self.turned_away > 0 && self.conns.len() < self.limits.max_connections {
            tracing::warn!(
                count = self.turned_away,
                "TCP store server: closed connections at TORCHCOMMS_STORE_MAX_CONNECTIONS"
            );
            self.turned_away = 0;
        }
    }

    /// Decodes and runs the buffered requests of one connection while it can take replies.
    fn process(&mut self, id: ConnId) {
        loop {
            let Some(conn) = self.conns.get_mut(&id) else {
                return;
            };
            conn.held = false;
            if conn.dead {
                break;
            }
            if conn.backlogged(self.limits.client_buffer) {
                conn.held = conn.pending_input();
                break;
            }
            // Like torch: the first request must be VALIDATE with the magic. Checking the
            // command byte first drops a stray client before we buffer its data.
            let first = conn.inbuf.get(conn.in_pos).copied();
            if !conn.validated && first.is_some_and(|b| b != Query::Validate as u8) {
                tracing::warn!(peer = ?conn.peer, first_byte = ?first,
                    "TCP store server: client did not start with VALIDATE; closing");
                conn.dead = true;
                break;
            }
            let before = conn.footprint();
            let fed = conn.decoder.feed(&conn.inbuf[conn.in_pos..]);
            let req = match fed {
                Ok((used, req)) => {
                    conn.in_pos += used;
                    req
                }
                Err(e) => {
                    tracing::warn!(peer = ?conn.peer, error = %e,
                        "TCP store server: bad request; closing");
                    conn.dead = true;
                    break;
                }
            };
            let after = conn.footprint();
            self.used = (self.used + after).saturating_sub(before);
            if after > before && self.used > self.limits.max_bytes {
                tracing::warn!(peer = ?conn.peer, used = self.used, announced = conn.decoder.announced(),
                    max = self.limits.max_bytes,
                    "TCP store server: request would pass the memory quota \
                     (TORCHCOMMS_STORE_MAX_BYTES); closing");
                self.used -= after;
                conn.dead = true;
                break;
            }
            // Nothing complete left (after EOF, nothing more will come: `reap` closes the
            // connection once its replies are out).
            let Some(req) = req else {
                break;
            };
            if !conn.validated {
                if req
                    == (Request::Validate {
                        magic: VALIDATION_MAGIC,
                    })
                {
                    conn.validated = true;
                    continue;
                }
                tracing::warn!(peer = ?conn.peer, request = ?req,
                    "TCP store server: wrong VALIDATE magic; closing");
                conn.dead = true;
                break;
            }
            let peer = conn.peer;
            let mut out = Outbox::new();
            let stored = self.db.bytes();
            let room = self.limits.max_bytes.saturating_sub(self.used);
            if let Err(Fatal(why)) = self.db.handle(id, req, room, &mut out) {
                tracing::warn!(?peer, "TCP store server: {why}; closing");
                if let Some(c) = self.conns.get_mut(&id) {
                    c.dead = true;
                }
                break;
            }
            self.used = (self.used + self.db.bytes()).saturating_sub(stored);
            for (to, bytes) in out {
                if to == id && self.used.saturating_add(bytes.len()) > self.limits.max_bytes {
                    tracing::warn!(
                        ?peer,
                        reply = bytes.len(),
                        used = self.used,
                        max = self.limits.max_bytes,
                        "TCP store server: reply would pass the memory quota \
                         (TORCHCOMMS_STORE_MAX_BYTES); closing"
                    );
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.dead = true;
                    }
                    continue;
                }
                if let Some(c) = self.conns.get_mut(&to) {
                    if !c.dead {
                        self.used = self.used.saturating_add(bytes.len());
                        c.outbuf.extend_from_slice(&bytes);
                    }
                }
            }
        }
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.compact_input();
        }
    }

    fn reap(&mut self) {
        let dead: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.dead || (c.eof && !c.pending_output() && !c.held))
            .map(|(id, _)| *id)
            .collect();
        for id in dead {
            self.db.forget(id);
            if let Some(c) = self.conns.remove(&id) {
                tracing::trace!(peer = ?c.peer, id, "TCP store server: connection closed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::super::TcpStoreServer;
    use super::*;

    /// A server whose high-water mark of 0 makes every reply hold back the requests after it,
    /// and a client that sent it `n` PINGs (nonces `0..n`) at once, replies unread.
    fn pings_held_one_by_one(n: u32) -> (TcpStoreServer, TcpStream) {
        let limits = StoreLimits {
            client_buffer: 0,
            ..StoreLimits::default()
        };
        let server = TcpStoreServer::bind_with("127.0.0.1", 0, limits).unwrap();
        let mut s = crate::bootstrap::tcp_store::tests::raw_client(server.port());
        let pings: Vec<u8> = (0..n)
            .flat_map(|nonce| Request::Ping { nonce }.encode())
            .collect();
        s.write_all(&pings).unwrap();
        (server, s)
    }

    /// Once the reply ahead of the held requests is written in full, nothing on the socket wakes
    /// the server (the client sent everything at the start): it must go on by itself.
    #[test]
    fn requests_held_at_the_high_water_mark_are_served_once_the_replies_drain() {
        let (_server, mut s) = pings_held_one_by_one(50);
        for nonce in 0..50u32 {
            let mut got = [0u8; 4];
            s.read_exact(&mut got)
                .unwrap_or_else(|e| panic!("reply {nonce}: {e}"));
            assert_eq!(u32::from_le_bytes(got), nonce);
        }
    }

    /// The same with the client's sending side closed behind its requests: the held ones are
    /// still answered before the server closes the connection.
    #[test]
    fn a_half_closed_client_gets_the_replies_to_its_held_requests() {
        let (_server, mut s) = pings_held_one_by_one(50);
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut replies = Vec::new();
        s.read_to_end(&mut replies).unwrap();
        let nonces: Vec<u32> = replies
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(nonces, (0..50).collect::<Vec<u32>>());
    }
}
