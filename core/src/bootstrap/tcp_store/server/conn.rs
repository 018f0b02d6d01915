//! One client connection as the server thread sees it: its socket, the bytes it sent that are
//! not decoded yet, and the replies it has not read yet.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};

/// One client connection as seen by the server thread.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) stream: TcpStream,
    pub(super) peer: Option<SocketAddr>,
    /// Received bytes; `in_pos..` is not decoded yet.
    pub(super) inbuf: Vec<u8>,
    pub(super) in_pos: usize,
    /// Reply bytes; `out_pos..` is not written yet.
    pub(super) outbuf: Vec<u8>,
    out_pos: usize,
    pub(super) validated: bool,
    /// Decoding stopped at the output high-water mark with requests still buffered. Nothing on
    /// the socket announces them once the replies drain (the client sent them long ago), so the
    /// server must not sleep in `poll` while the backlog is gone and they wait, nor close a
    /// half-closed connection before answering them.
    pub(super) held: bool,
    /// The peer closed its sending side: finish what it sent, then close.
    pub(super) eof: bool,
    pub(super) dead: bool,
}

/// Most bytes read from one connection per poll round, so one chatty client cannot starve the
/// others.
const READ_BUDGET: usize = 4 << 20;

/// Stop decoding requests from a connection while this many reply bytes wait for it to read
/// them: a client that sends without reading cannot grow the server's memory without bound.
/// Far above anything a synchronous client (torch's, ours) leaves unread.
pub(super) const OUTPUT_HIGH_WATER: usize = 64 << 20;

impl Conn {
    pub(super) fn new(stream: TcpStream, peer: SocketAddr) -> Conn {
        Conn {
            stream,
            peer: Some(peer),
            inbuf: Vec::new(),
            in_pos: 0,
            outbuf: Vec::new(),
            out_pos: 0,
            validated: false,
            held: false,
            eof: false,
            dead: false,
        }
    }

    /// Reads what is available (up to the budget); false on a read error.
    pub(super) fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 64 * 1024];
        let mut budget = READ_BUDGET;
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    self.eof = true;
                    return true;
                }
                Ok(n) => {
                    self.inbuf.extend_from_slice(&chunk[..n]);
                    budget = budget.saturating_sub(n);
                    if budget == 0 {
                        return true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!(peer = ?self.peer, error = %e, "TCP store server: read failed");
                    return false;
                }
            }
        }
    }

    /// Writes queued bytes until the socket would block; false on error.
    pub(super) fn flush(&mut self) -> bool {
        while self.out_pos < self.outbuf.len() {
            match self.stream.write(&self.outbuf[self.out_pos..]) {
                Ok(0) => return false,
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!(peer = ?self.peer, error = %e, "TCP store server: write failed");
                    return false;
                }
            }
        }
        self.outbuf.clear();
        self.out_pos = 0;
        true
    }

    pub(super) fn pending_output(&self) -> bool {
        self.out_pos < self.outbuf.len()
    }

    /// More than `high_water` reply bytes wait for the peer to read them.
    pub(super) fn backlogged(&self, high_water: usize) -> bool {
        self.outbuf.len() - self.out_pos > high_water
    }

    /// Held requests that can be decoded again: the backlog drained below the mark.
    pub(super) fn resumable(&self, high_water: usize) -> bool {
        self.held && !self.dead && !self.backlogged(high_water)
    }

    pub(super) fn pending_input(&self) -> bool {
        self.in_pos < self.inbuf.len()
    }
}
