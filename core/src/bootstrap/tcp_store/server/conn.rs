//! One client connection as the server thread sees it: its socket, the bytes it sent that are
//! not decoded yet, and the replies it has not read yet.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use super::super::decode::Decoder;

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
    /// When the connection was accepted: it must send VALIDATE within the handshake timeout.
    pub(super) accepted: Instant,
    /// The request being received, decoded field by field as its bytes arrive.
    pub(super) decoder: Decoder,
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

/// Undecoded bytes a connection may buffer beyond the field being received: enough for many
/// small pipelined requests, small enough that thousands of connections stay cheap.
const READ_AHEAD: usize = 64 << 10;

/// Bytes of VALIDATE, all a connection may send before it has identified itself.
const VALIDATE_LEN: usize = 5;

impl Conn {
    pub(super) fn new(stream: TcpStream, peer: SocketAddr, max_value: usize) -> Conn {
        Conn {
            stream,
            peer: Some(peer),
            inbuf: Vec::new(),
            in_pos: 0,
            outbuf: Vec::new(),
            out_pos: 0,
            validated: false,
            accepted: Instant::now(),
            decoder: Decoder::new(max_value as u64),
            held: false,
            eof: false,
            dead: false,
        }
    }

    /// Most undecoded bytes this connection may hold: VALIDATE before it identified itself,
    /// else the field being received plus some read-ahead. What it sends beyond stays in the
    /// kernel's buffers (TCP flow control slows the sender), not in ours.
    pub(super) fn read_cap(&self) -> usize {
        if self.validated {
            self.decoder.want().saturating_add(READ_AHEAD)
        } else {
            VALIDATE_LEN
        }
    }

    fn pending_in(&self) -> usize {
        self.inbuf.len() - self.in_pos
    }

    /// True while the connection may read more.
    pub(super) fn wants_input(&self) -> bool {
        !self.eof && self.pending_in() < self.read_cap()
    }

    /// Bytes this connection holds: the request in progress (what arrived and what was
    /// announced), the read-ahead and the unread replies.
    pub(super) fn footprint(&self) -> usize {
        self.decoder
            .held()
            .saturating_add(self.decoder.announced().max(self.pending_in()))
            .saturating_add(self.outbuf.len() - self.out_pos)
    }

    /// Reads what is available (up to the budget and the connection's cap); false on a read
    /// error.
    pub(super) fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 64 * 1024];
        let mut budget = READ_BUDGET;
        loop {
            let room = self.read_cap().saturating_sub(self.pending_in());
            if room == 0 {
                return true;
            }
            if self.in_pos > 0 && self.in_pos >= self.inbuf.len() / 2 {
                self.inbuf.drain(..self.in_pos);
                self.in_pos = 0;
            }
            let want = room.min(chunk.len());
            match self.stream.read(&mut chunk[..want]) {
                Ok(0) => {
                    self.eof = true;
                    return true;
                }
                Ok(n) => {
                    if self.inbuf.is_empty() {
                        // A long value: allocate it once, at its announced size.
                        let announced = self.decoder.announced();
                        if announced > n {
                            self.inbuf.reserve_exact(announced);
                        }
                    }
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
                Ok(n) => {
                    self.out_pos += n;
                    // Drop what was written, so a slow reader's buffer never holds more than
                    // its unread replies (it grew to 1.8 GB behind a 64 MiB mark without this).
                    if self.out_pos >= (1 << 20) && self.out_pos >= self.outbuf.len() / 2 {
                        self.outbuf.drain(..self.out_pos);
                        self.out_pos = 0;
                    }
                }
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

    /// Drops decoded bytes from the input buffer.
    pub(super) fn compact_input(&mut self) {
        self.inbuf.drain(..self.in_pos);
        self.in_pos = 0;
        if self.inbuf.is_empty() && self.inbuf.capacity() > READ_AHEAD {
            // Give back the memory of a long value once it is decoded.
            self.inbuf = Vec::new();
        }
    }
}
