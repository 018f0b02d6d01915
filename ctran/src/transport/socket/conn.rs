//! One TCP connection to one peer: FIFO queues of posted sends and receives, moved forward with
//! non-blocking vectored I/O. Every message on the wire is a 16-byte header (magic, length)
//! followed by the payload, so a receiver can check that the sender agrees about the size.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut, Read};
use std::os::fd::{AsRawFd, RawFd};

use bytemuck::{Pod, Zeroable};
use socket2::Socket;

use crate::span::Span;
use crate::transport::TransportError;

const MAGIC: u32 = 0x7C7C_0D47;
pub(crate) const HEADER_LEN: usize = 16;
/// Header flag: the payload is a failing peer's last words (UTF-8), not data.
const FLAG_ABORT: u32 = 1;
/// Header flag: the peer finalized and closes; it sends nothing more.
const FLAG_BYE: u32 = 2;
/// Longest abort reason sent.
const MAX_REASON: usize = 1024;

/// Most payload bytes one system call sends or receives. Calls that copy many megabytes at once
/// are slower on TCP loopback, likely because the socket stays locked for the whole copy, so the
/// segments that the other end moves meanwhile wait in a backlog; 1 MiB calls keep both ends
/// moving (a 64 MiB broadcast between 2 ranks takes about two thirds of its time in single
/// calls).
const MAX_IO_BYTES: usize = 1 << 20;

/// The header that precedes every message, as it is on the wire: every field little-endian.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct Header {
    magic: u32,
    flags: u32,
    /// Payload bytes.
    len: u64,
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER_LEN);

impl Header {
    /// The header as it is read from the wire.
    fn read(b: &[u8; HEADER_LEN]) -> Header {
        let h: Header = bytemuck::cast(*b);
        Header {
            magic: u32::from_le(h.magic),
            flags: u32::from_le(h.flags),
            len: u64::from_le(h.len),
        }
    }
}

fn encode_header(len: usize, flags: u32) -> [u8; HEADER_LEN] {
    bytemuck::cast(Header {
        magic: MAGIC.to_le(),
        flags: flags.to_le(),
        len: (len as u64).to_le(),
    })
}

#[derive(Debug)]
struct PendingSend {
    id: u64,
    header: [u8; HEADER_LEN],
    data: Span,
    /// Bytes written so far, header included.
    written: usize,
}

#[derive(Debug)]
struct PendingRecv {
    id: u64,
    data: Span,
    /// Bytes read so far, header included.
    read: usize,
}

/// What one call to [`Conn::advance`] achieved.
#[derive(Debug, Default)]
pub(super) struct Advance {
    /// Some bytes moved.
    pub(super) moved: bool,
}

/// A connection to one peer with its request queues.
#[derive(Debug)]
pub(super) struct Conn {
    peer: usize,
    sock: Socket,
    sends: VecDeque<PendingSend>,
    recvs: VecDeque<PendingRecv>,
    recv_header: [u8; HEADER_LEN],
    broken: Option<TransportError>,
    /// The peer said goodbye (finalized): its closing the connection is not a failure.
    peer_finished: bool,
}

impl Conn {
    pub(super) fn new(peer: usize, sock: Socket) -> io::Result<Conn> {
        sock.set_nonblocking(true)?;
        Ok(Conn {
            peer,
            sock,
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            recv_header: [0; HEADER_LEN],
            broken: None,
            peer_finished: false,
        })
    }

    pub(super) fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Sets the socket's send and receive buffers to `bytes` (the kernel caps them at
    /// `wmem_max`/`rmem_max`), which ends its auto-tuning.
    pub(super) fn set_buffers(&self, bytes: usize) -> io::Result<()> {
        self.sock.set_send_buffer_size(bytes)?;
        self.sock.set_recv_buffer_size(bytes)
    }

    /// The socket's (send, receive) buffer sizes as the kernel reports them.
    #[cfg(test)]
    pub(super) fn buffer_sizes(&self) -> io::Result<(usize, usize)> {
        Ok((self.sock.send_buffer_size()?, self.sock.recv_buffer_size()?))
    }

    pub(super) fn broken(&self) -> Option<&TransportError> {
        self.broken.as_ref()
    }

    pub(super) fn wants_write(&self) -> bool {
        self.broken.is_none() && !self.sends.is_empty()
    }

    pub(super) fn wants_read(&self) -> bool {
        self.broken.is_none() && !self.recvs.is_empty()
    }

    pub(super) fn push_send(&mut self, id: u64, data: Span) {
        self.sends.push_back(PendingSend {
            id,
            header: encode_header(data.len(), 0),
            data,
            written: 0,
        });
    }

    pub(super) fn push_recv(&mut self, id: u64, data: Span) {
        self.recvs.push_back(PendingRecv { id, data, read: 0 });
    }

    /// Tells the peer why this rank is failing. A frame cannot interrupt a half-sent message, so
    /// that message is first finished (its buffer is still valid: the failing operation has not
    /// been released yet), for at most `flush_for`. Best effort: gives up on any error.
    pub(super) fn send_abort_notice(&mut self, reason: &str, flush_for: std::time::Duration) {
        if self.broken.is_some() {
            return;
        }
        let deadline = std::time::Instant::now() + flush_for;
        if let Some(s) = self.sends.front_mut() {
            let total = HEADER_LEN + s.data.len();
            while s.written > 0 && s.written < total {
                let payload_from = s.written.saturating_sub(HEADER_LEN);
                let payload = s.data.sub(payload_from, s.data.len() - payload_from);
                let header_left = &s.header[s.written.min(HEADER_LEN)..];
                // SAFETY: as in `advance_sends`: the span is valid while its send is queued.
                let r = unsafe {
                    payload.with_slice(|p| {
                        let bufs = [IoSlice::new(header_left), IoSlice::new(p)];
                        self.sock
                            .send_vectored_with_flags(&bufs, libc::MSG_NOSIGNAL)
                    })
                };
                match r {
                    Ok(n) if n > 0 => s.written += n,
                    Err(e)
                        if e.kind() == io::ErrorKind::WouldBlock
                            && std::time::Instant::now() < deadline =>
                    {
                        std::thread::sleep(std::time::Duration::from_micros(100));
                    }
                    _ => return,
                }
            }
        }
        let reason = &reason.as_bytes()[..reason.len().min(MAX_REASON)];
        let header = encode_header(reason.len(), FLAG_ABORT);
        let bufs = [IoSlice::new(&header), IoSlice::new(reason)];
        let _ = self
            .sock
            .send_vectored_with_flags(&bufs, libc::MSG_NOSIGNAL);
    }

    /// Says goodbye (this rank finalized) and half-closes, so the peer can tell a finished rank
    /// from a dead one.
    pub(super) fn send_bye(&mut self) {
        if self.broken.is_some() || self.sends.front().is_some_and(|s| s.written > 0) {
            return;
        }
        let header = encode_header(0, FLAG_BYE);
        let _ = self.sock.send_with_flags(&header, libc::MSG_NOSIGNAL);
        let _ = self.sock.shutdown(std::net::Shutdown::Write);
    }

    /// For a connection that carries no data (its peer is reached another way): reports whether
    /// the peer closed it or sent an abort notice. Never blocks.
    pub(super) fn probe_idle(&mut self) -> Option<TransportError> {
        if let Some(e) = &self.broken {
            return Some(e.clone());
        }
        if !self.recvs.is_empty() || self.peer_finished {
            return None;
        }
        let mut header = [0u8; HEADER_LEN];
        match (&self.sock).read(&mut header) {
            Ok(n) if n == HEADER_LEN && is_bye(&header) => {
                self.peer_finished = true;
                None
            }
            Ok(0) => Some(TransportError::PeerLost {
                peer: self.peer,
                reason: "connection closed by peer (it exited or failed)".into(),
            }),
            Ok(n) if n == HEADER_LEN => Some(
                check_header(&self.sock, &header, self.peer, Span::EMPTY, HEADER_LEN)
                    .err()
                    .unwrap_or(TransportError::PeerLost {
                        peer: self.peer,
                        reason: "unexpected data on an idle connection".into(),
                    }),
            ),
            Ok(_) => Some(TransportError::PeerLost {
                peer: self.peer,
                reason: "truncated message on an idle connection".into(),
            }),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                None
            }
            Err(e) => Some(self.lost("recv", &e)),
        }
    }

    /// Marks the connection broken and returns the ids of every request it held.
    pub(super) fn fail(&mut self, err: TransportError) -> Vec<u64> {
        if self.broken.is_none() {
            self.broken = Some(err);
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
        }
        self.sends
            .drain(..)
            .map(|s| s.id)
            .chain(self.recvs.drain(..).map(|r| r.id))
            .collect()
    }

    /// Moves as many bytes as the socket takes without blocking; pushes finished request ids.
    pub(super) fn advance(&mut self, finished: &mut Vec<u64>) -> Result<Advance, TransportError> {
        let mut out = Advance::default();
        if self.broken.is_some() {
            return Ok(out);
        }
        let result = self
            .advance_sends(finished, &mut out)
            .and_then(|()| self.advance_recvs(finished, &mut out));
        result.map(|()| out)
    }

    /// A failed send usually means the peer failed and closed; it may have told us why on the
    /// other direction of the connection, so look for its abort notice before blaming the pipe.
    fn lost_while_sending(&mut self, e: &io::Error) -> TransportError {
        let mid_message = self.recvs.front().is_some_and(|r| r.read > 0);
        if !mid_message {
            let mut header = [0u8; HEADER_LEN];
            if let Ok(HEADER_LEN) = (&self.sock).read(&mut header) {
                if let Err(notice) =
                    check_header(&self.sock, &header, self.peer, Span::EMPTY, HEADER_LEN)
                {
                    return notice;
                }
            }
        }
        self.lost("send", e)
    }

    fn lost(&self, what: &str, e: &io::Error) -> TransportError {
        TransportError::PeerLost {
            peer: self.peer,
            reason: format!("{what} failed: {e}"),
        }
    }

    fn advance_sends(
        &mut self,
        finished: &mut Vec<u64>,
        out: &mut Advance,
    ) -> Result<(), TransportError> {
        while let Some(s) = self.sends.front_mut() {
            let total = HEADER_LEN + s.data.len();
            while s.written < total {
                let header_left = &s.header[s.written.min(HEADER_LEN)..];
                let payload_from = s.written.saturating_sub(HEADER_LEN);
                let payload = s.data.sub(
                    payload_from,
                    (s.data.len() - payload_from).min(MAX_IO_BYTES),
                );
                // SAFETY: the span's owner keeps it valid and unmodified while the send is
                // pending (Transport::post_send contract); the slice lives only for this call.
                let r = unsafe {
                    payload.with_slice(|p| {
                        let bufs = [IoSlice::new(header_left), IoSlice::new(p)];
                        self.sock
                            .send_vectored_with_flags(&bufs, libc::MSG_NOSIGNAL)
                    })
                };
                match r {
                    Ok(0) => {
                        return Err(TransportError::PeerLost {
                            peer: self.peer,
                            reason: "connection closed while sending".into(),
                        })
                    }
                    Ok(n) => {
                        s.written += n;
                        out.moved = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(self.lost_while_sending(&e)),
                }
            }
            finished.push(s.id);
            self.sends.pop_front();
        }
        Ok(())
    }

    fn advance_recvs(
        &mut self,
        finished: &mut Vec<u64>,
        out: &mut Advance,
    ) -> Result<(), TransportError> {
        while let Some(r) = self.recvs.front_mut() {
            let total = HEADER_LEN + r.data.len();
            while r.read < total {
                let header_done = r.read >= HEADER_LEN;
                let payload_from = r.read.saturating_sub(HEADER_LEN);
                let payload = r.data.sub(
                    payload_from,
                    (r.data.len() - payload_from).min(MAX_IO_BYTES),
                );
                let header_from = r.read.min(HEADER_LEN);
                let header_buf = &mut self.recv_header[header_from..];
                // SAFETY: the receive buffer is reserved for this request until it finishes
                // (Transport::post_recv contract); the slice lives only for this call. The read
                // never goes past this message: the iovecs hold exactly what is still expected.
                let res = unsafe {
                    payload.with_mut_slice(|p| {
                        if header_done {
                            (&self.sock).read(p)
                        } else {
                            let mut bufs = [IoSliceMut::new(header_buf), IoSliceMut::new(p)];
                            (&self.sock).read_vectored(&mut bufs)
                        }
                    })
                };
                match res {
                    Ok(0) => {
                        return Err(TransportError::PeerLost {
                            peer: self.peer,
                            reason: "connection closed by peer (it exited or failed)".into(),
                        })
                    }
                    Ok(n) => {
                        let before = r.read;
                        r.read += n;
                        out.moved = true;
                        if before < HEADER_LEN && r.read >= HEADER_LEN {
                            check_header(&self.sock, &self.recv_header, self.peer, r.data, r.read)?;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(self.lost("recv", &e)),
                }
            }
            finished.push(r.id);
            self.recvs.pop_front();
        }
        Ok(())
    }
}

fn is_bye(header: &[u8; HEADER_LEN]) -> bool {
    let h = Header::read(header);
    h.magic == MAGIC && h.flags & FLAG_BYE != 0
}

/// Checks a just-completed header against the receive posted for it (`read` bytes of the
/// message, header included, have arrived; payload bytes landed in `data`).
pub(crate) fn check_header(
    sock: &Socket,
    header: &[u8; HEADER_LEN],
    peer: usize,
    data: Span,
    read: usize,
) -> Result<(), TransportError> {
    let Header { magic, flags, len } = Header::read(header);
    let len = len as usize;
    if magic != MAGIC {
        return Err(TransportError::PeerLost {
            peer,
            reason: format!("corrupt stream (bad magic {magic:#x})"),
        });
    }
    if flags & FLAG_ABORT != 0 {
        // The reason's first bytes may already sit in the receive buffer; read the rest.
        let have = (read - HEADER_LEN).min(len).min(data.len());
        let mut reason = vec![0u8; have];
        data.sub(0, have).copy_to_slice(&mut reason);
        let mut rest = vec![0u8; len.min(MAX_REASON).saturating_sub(have)];
        if let Ok(n) = (&*sock).read(&mut rest) {
            reason.extend_from_slice(&rest[..n]);
        }
        let reason = String::from_utf8_lossy(&reason);
        return Err(TransportError::PeerLost {
            peer,
            reason: format!("peer {peer} failed: {reason}"),
        });
    }
    if flags & FLAG_BYE != 0 {
        return Err(TransportError::PeerLost {
            peer,
            reason: format!("peer {peer} finalized the communicator while this rank still expected data from it"),
        });
    }
    if len != data.len() {
        return Err(TransportError::SizeMismatch {
            peer,
            expected: data.len(),
            got: len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_keeps_its_wire_layout() {
        let h = encode_header(0x0102_0304_0506, FLAG_BYE);
        let mut want = [0u8; HEADER_LEN];
        want[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        want[4..8].copy_from_slice(&FLAG_BYE.to_le_bytes());
        want[8..16].copy_from_slice(&0x0102_0304_0506u64.to_le_bytes());
        assert_eq!(h, want);
        assert!(is_bye(&h));
        assert!(!is_bye(&encode_header(7, FLAG_ABORT)));
    }
}
