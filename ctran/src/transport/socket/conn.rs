//! One TCP connection to one peer: FIFO queues of posted sends and receives, moved forward with
//! non-blocking vectored I/O. Every message on the wire is a 16-byte header (magic, length)
//! followed by the payload, so a receiver can check that the sender agrees about the size.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut, Read};
use std::os::fd::{AsRawFd, RawFd};

use socket2::Socket;

use crate::span::Span;
use crate::transport::TransportError;

const MAGIC: u32 = 0x7C7C_0D47;
const HEADER_LEN: usize = 16;

fn encode_header(len: usize) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    h
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
        })
    }

    pub(super) fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
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
            header: encode_header(data.len()),
            data,
            written: 0,
        });
    }

    pub(super) fn push_recv(&mut self, id: u64, data: Span) {
        self.recvs.push_back(PendingRecv { id, data, read: 0 });
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
                let payload = s.data.sub(payload_from, s.data.len() - payload_from);
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
                    Err(e) => return Err(self.lost("send", &e)),
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
                let payload = r.data.sub(payload_from, r.data.len() - payload_from);
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
                            let magic = u32::from_le_bytes(
                                self.recv_header[0..4].try_into().expect("4 bytes"),
                            );
                            let len = u64::from_le_bytes(
                                self.recv_header[8..16].try_into().expect("8 bytes"),
                            ) as usize;
                            if magic != MAGIC {
                                return Err(TransportError::PeerLost {
                                    peer: self.peer,
                                    reason: format!("corrupt stream (bad magic {magic:#x})"),
                                });
                            }
                            if len != r.data.len() {
                                return Err(TransportError::SizeMismatch {
                                    peer: self.peer,
                                    expected: r.data.len(),
                                    got: len,
                                });
                            }
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
