//! Messages read before their receive was posted. A peer that waits for this rank to accept
//! its message ([`crate::transport::Delivery::Accepted`]) needs the acknowledgement that
//! travels behind whatever this rank was sent meanwhile. Data left in the socket would hold it
//! back until its own receive is posted, which a program may do only after that wait (rank A
//! sends to B and waits; B sends to A, then receives from A). So while acknowledgements are
//! awaited on a connection, data that arrives early is read into memory, up to a bound, and
//! handed to its receive when that is posted; it is checked then, like any message.

use std::collections::VecDeque;
use std::io::{self, Read};

use socket2::Socket;

use crate::transport::OpTag;

/// Most bytes of early messages one connection holds; a larger message stays in the socket
/// until its receive is posted (and holds back what follows it).
pub(super) const EARLY_BYTES_MAX: usize = 4 << 20;

/// A data message taken off the socket before its receive was posted.
#[derive(Debug)]
pub(super) struct Early {
    /// The sender's operation.
    pub(super) tag: OpTag,
    /// The sender waits for an acknowledgement once it is accepted.
    pub(super) confirm: bool,
    /// The payload, as long as the header announced.
    pub(super) data: Vec<u8>,
    /// Bytes read so far off the wire (payload bytes; on a protected connection, sealed bytes
    /// with their tags).
    read: usize,
    /// The whole payload arrived (and was checked, on a protected connection).
    complete: bool,
}

/// The early messages of one connection, oldest first; only the newest may be incomplete.
#[derive(Debug, Default)]
pub(super) struct EarlyMessages {
    queue: VecDeque<Early>,
    bytes: usize,
}

impl EarlyMessages {
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether a message of `len` payload bytes fits in what is left of the bound.
    pub(super) fn has_room_for(&self, len: u64) -> bool {
        len <= (EARLY_BYTES_MAX - self.bytes) as u64
    }

    /// Starts a message whose header was taken (`len` was checked with `has_room_for`).
    pub(super) fn start(&mut self, len: u64, tag: OpTag, confirm: bool) {
        let len = len as usize;
        self.bytes += len;
        self.queue.push_back(Early {
            tag,
            confirm,
            data: vec![0; len],
            read: 0,
            complete: len == 0,
        });
    }

    /// Whether the newest message still waits for payload bytes.
    pub(super) fn filling(&self) -> bool {
        self.queue.back().is_some_and(|e| !e.complete)
    }

    /// Reads what has arrived of the newest message's payload from a plain connection without
    /// blocking. `Ok(true)` once it is complete; `Ok(false)` when the socket has nothing more.
    pub(super) fn fill(&mut self, mut sock: &Socket) -> io::Result<bool> {
        let Some(e) = self.queue.back_mut() else {
            return Ok(true);
        };
        while e.read < e.data.len() {
            match sock.read(&mut e.data[e.read..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => e.read += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        e.complete = true;
        Ok(true)
    }

    /// The newest message's buffer and its count of bytes read off the wire, for a reader that
    /// knows the wire format (a protected connection); it calls `mark_complete` when done.
    pub(super) fn newest_mut(&mut self) -> Option<(&mut [u8], &mut usize)> {
        self.queue
            .back_mut()
            .map(|e| (e.data.as_mut_slice(), &mut e.read))
    }

    /// The newest message's payload arrived whole.
    pub(super) fn mark_complete(&mut self) {
        if let Some(e) = self.queue.back_mut() {
            e.complete = true;
        }
    }

    /// The oldest message, once complete.
    pub(super) fn take_complete(&mut self) -> Option<Early> {
        if !self.queue.front()?.complete {
            return None;
        }
        let e = self.queue.pop_front()?;
        self.bytes -= e.data.len();
        Some(e)
    }

    pub(super) fn clear(&mut self) {
        self.queue.clear();
        self.bytes = 0;
    }
}
