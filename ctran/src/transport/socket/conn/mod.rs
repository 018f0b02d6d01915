//! One TCP connection to one peer: FIFO queues of posted sends and receives, moved forward with
//! non-blocking vectored I/O. Every message on the wire is a 32-byte header (magic, flags,
//! length, the sender's [`OpTag`]) followed by the payload, so a receiver can check that the
//! sender runs the same operation and agrees about the size before it takes the data as valid.
//! A protected connection (`TORCHCOMMS_DATA_PROTECTION`) seals the same frames into records
//! ([`protect`]); a plain one never looks at that path.
//!
//! Receiving is split out: [`recv`] (plain) and [`sealed`] (protected) read the front receive's
//! message, [`idle`] reads while none is posted, [`window`] applies one-sided frames.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use socket2::Socket;

mod idle;
mod recv;
mod sealed;
mod window;

use super::early::EarlyMessages;
use super::frame::{self, Frame, HEADER_LEN, MAX_REASON};
use super::protect::{self, OpenError, Session};
use crate::span::Span;
use crate::transport::region::RegionTable;
use crate::transport::{Delivery, OpTag, TransportError};
use window::PutIn;

/// Most payload bytes one system call sends or receives. Calls that copy many megabytes at once
/// are slower on TCP loopback, likely because the socket stays locked for the whole copy, so the
/// segments that the other end moves meanwhile wait in a backlog; 1 MiB calls keep both ends
/// moving (a 64 MiB broadcast between 2 ranks takes about two thirds of its time in single
/// calls).
const MAX_IO_BYTES: usize = 1 << 20;

/// The id of frames this connection sends on its own (probes): no request waits for them.
const CONTROL_ID: u64 = 0;

#[derive(Debug)]
struct PendingSend {
    id: u64,
    header: [u8; HEADER_LEN],
    data: Span,
    /// Bytes written so far, header included.
    written: usize,
    /// It finishes only once the peer acknowledged it ([`Delivery::Accepted`]), which it has
    /// not yet.
    awaits_ack: bool,
}

#[derive(Debug)]
struct PendingRecv {
    id: u64,
    data: Span,
    /// The operation it belongs to: the message's tag must be the same.
    tag: OpTag,
    /// Bytes of its message read so far, header included.
    read: usize,
    /// Its header was read and checked.
    checked: bool,
    /// A probe was sent for it.
    probed: bool,
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
    /// The header of the incoming message, as the front receive reads it.
    recv_header: [u8; HEADER_LEN],
    /// A data message waits in the socket for a receive to be posted (seen, not read).
    data_waiting: bool,
    broken: Option<TransportError>,
    /// The peer said goodbye (finalized): its closing the connection is not a failure.
    peer_finished: bool,
    /// Messages sent (or queued) with an acknowledgement asked that the peer has not given
    /// yet, oldest first: the request that finishes with it ([`Delivery::Accepted`]), or none
    /// ([`Delivery::Confirmed`]).
    awaiting_ack: VecDeque<Option<u64>>,
    /// How many of those are [`Delivery::Confirmed`].
    confirmed_unacked: u64,
    /// Requests whose acknowledgement arrived after they were written: finished at the next
    /// [`Conn::advance`].
    accepted: Vec<u64>,
    /// Data read before its receive was posted, while acknowledgements are awaited.
    early: EarlyMessages,
    /// The keys and record state of a protected connection; `None` on a plain one.
    guard: Option<Box<Session>>,
    /// An incoming put whose payload is being read into its region.
    put_in: Option<PutIn>,
}

impl Conn {
    pub(super) fn new(peer: usize, sock: Socket, guard: Option<Session>) -> io::Result<Conn> {
        sock.set_nonblocking(true)?;
        Ok(Conn {
            peer,
            sock,
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            recv_header: [0; HEADER_LEN],
            data_waiting: false,
            broken: None,
            peer_finished: false,
            awaiting_ack: VecDeque::new(),
            confirmed_unacked: 0,
            accepted: Vec::new(),
            early: EarlyMessages::default(),
            guard: guard.map(Box::new),
            put_in: None,
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
        self.broken.is_none()
            && (!self.recvs.is_empty()
                || self.put_in.is_some()
                || !self.awaiting_ack.is_empty()
                || !self.accepted.is_empty())
    }

    /// Whether confirmed messages wait for the peer's acknowledgement; the error that broke the
    /// connection if they never will get it.
    pub(super) fn awaits_acks(&self) -> Result<bool, TransportError> {
        match &self.broken {
            Some(e) if self.confirmed_unacked > 0 => Err(e.clone()),
            _ => Ok(self.confirmed_unacked > 0),
        }
    }

    /// Whether a sleeping rank should watch this connection although no receive is posted on
    /// it: for probes, abort notices and goodbyes (a data header is kept for its receive).
    pub(super) fn wants_idle_read(&self) -> bool {
        // (Also while acknowledgements are awaited: they arrive on the same stream.)
        self.broken.is_none() && self.recvs.is_empty() && !self.data_waiting && !self.peer_finished
    }

    /// Queues a message. Unless `delivery` is eager the peer acknowledges it once it accepted
    /// the header: a [`Delivery::Confirmed`] send finishes when written and its acknowledgement
    /// is awaited through [`Conn::awaits_acks`]; a [`Delivery::Accepted`] one finishes with
    /// its acknowledgement.
    pub(super) fn push_send(&mut self, id: u64, data: Span, tag: OpTag, delivery: Delivery) {
        let len = data.len() as u64;
        let confirm = delivery != Delivery::Eager;
        match delivery {
            Delivery::Eager => {}
            Delivery::Confirmed => {
                self.confirmed_unacked += 1;
                self.awaiting_ack.push_back(None);
            }
            Delivery::Accepted => {
                self.awaiting_ack.push_back(Some(id));
                // Data seen while no acknowledgement was awaited stayed in the socket; the
                // acknowledgement may come behind it now, so idle reads take it early.
                self.data_waiting = false;
            }
        }
        self.sends.push_back(PendingSend {
            id,
            header: frame::encode(Frame::Data { len, tag, confirm }),
            data,
            written: 0,
            awaits_ack: delivery == Delivery::Accepted,
        });
    }

    /// Queues a one-sided frame (a put with its payload, a signal or a fence) behind every
    /// message queued before it: the peer applies them in this order (a signal after the puts
    /// it covers). It finishes once written.
    pub(super) fn push_one_sided(&mut self, id: u64, frame: Frame, data: Span) {
        self.sends.push_back(PendingSend {
            id,
            header: frame::encode(frame),
            data,
            written: 0,
            awaits_ack: false,
        });
    }

    /// Queues a control frame before every message not yet started (a frame never interrupts
    /// a half-sent message).
    fn push_control(&mut self, control: Frame) {
        let frame = PendingSend {
            id: CONTROL_ID,
            header: frame::encode(control),
            data: Span::EMPTY,
            written: 0,
            awaits_ack: false,
        };
        let at = usize::from(self.front_started());
        self.sends.insert(at, frame);
    }

    /// Whether the front send began (bytes of it went out, or its header was sealed): no frame
    /// may go before it.
    fn front_started(&self) -> bool {
        self.sends.front().is_some_and(|s| s.written > 0)
            || self.guard.as_ref().is_some_and(|g| g.seal.mid_frame())
    }

    pub(super) fn push_recv(&mut self, id: u64, data: Span, tag: OpTag) {
        self.data_waiting = false;
        self.recvs.push_back(PendingRecv {
            id,
            data,
            tag,
            read: 0,
            checked: false,
            probed: false,
        });
    }

    /// Tells the peer which operation this rank waits for it in, once per receive that has
    /// waited: a peer that runs another operation with the same sequence number fails it.
    /// Returns whether a probe was queued. Point-to-point receives are never probed (their
    /// pairing is the user's and has no sequence).
    pub(super) fn probe_waiting_recv(&mut self) -> bool {
        let Some(r) = self.recvs.front_mut() else {
            return false;
        };
        if self.broken.is_some() || r.probed || r.read > 0 || r.tag.seq == 0 {
            return false;
        }
        r.probed = true;
        let tag = r.tag;
        self.push_control(Frame::Probe { tag });
        true
    }

    /// Tells the peer why this rank is failing. A frame cannot interrupt a half-sent message, so
    /// that message is first finished (its buffer is still valid: the failing operation has not
    /// been released yet), for at most `flush_for`. Best effort: gives up on any error. A
    /// connection broken by a disagreement this rank found still carries the notice: the peer
    /// is alive and learns why.
    pub(super) fn send_abort_notice(&mut self, reason: &str, flush_for: Duration) {
        if self.broken.as_ref().is_some_and(|e| !peer_is_alive(e)) {
            return;
        }
        let deadline = Instant::now() + flush_for;
        let started = self.front_started();
        if let Some(s) = self.sends.front_mut() {
            let total = wire_len(self.guard.is_some(), s);
            while started && s.written < total {
                match write_front(&self.sock, self.guard.as_deref_mut(), s) {
                    Ok(n) if n > 0 => s.written += n,
                    Err(e)
                        if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                    _ => return,
                }
            }
        }
        let reason = &reason.as_bytes()[..reason.len().min(MAX_REASON)];
        let header = frame::encode(Frame::Abort {
            len: reason.len() as u64,
        });
        if let Some(g) = self.guard.as_deref_mut() {
            let sealed = g.seal.seal_frame(&header, reason);
            let _ = self.sock.send_with_flags(&sealed, libc::MSG_NOSIGNAL);
            return;
        }
        let bufs = [IoSlice::new(&header), IoSlice::new(reason)];
        let _ = self
            .sock
            .send_vectored_with_flags(&bufs, libc::MSG_NOSIGNAL);
    }

    /// Says goodbye (this rank finalized) and half-closes, so the peer can tell a finished rank
    /// from a dead one.
    pub(super) fn send_bye(&mut self) {
        if self.broken.is_some() || self.front_started() {
            return;
        }
        let header = frame::encode(Frame::Bye);
        let _ = match self.guard.as_deref_mut() {
            Some(g) => self
                .sock
                .send_with_flags(&g.seal.seal_frame(&header, &[]), libc::MSG_NOSIGNAL),
            None => self.sock.send_with_flags(&header, libc::MSG_NOSIGNAL),
        };
        let _ = self.sock.shutdown(std::net::Shutdown::Write);
    }

    /// Marks the connection broken and returns the ids of every request it held. When the
    /// failure is a disagreement this rank found, the peer is alive: the connection stays open
    /// (with a half-sent message kept to finish) so the abort that follows can tell the peer
    /// why; otherwise it is shut down at once.
    pub(super) fn fail(&mut self, err: TransportError) -> Vec<u64> {
        let keep_open = peer_is_alive(&err) && self.broken.as_ref().is_none_or(peer_is_alive);
        if self.broken.is_none() || !keep_open {
            if !keep_open {
                let _ = self.sock.shutdown(std::net::Shutdown::Both);
            }
            self.broken = Some(err);
        }
        let half_sent = keep_open && self.front_started();
        let mut ids: Vec<u64> = self.sends.iter().map(|s| s.id).collect();
        self.sends.truncate(usize::from(half_sent));
        ids.extend(self.recvs.drain(..).map(|r| r.id));
        // Written sends that wait for their acknowledgement never get it now.
        ids.extend(self.awaiting_ack.iter().flatten());
        self.awaiting_ack.retain(Option::is_none);
        ids.append(&mut self.accepted);
        self.early.clear();
        self.put_in = None;
        ids.retain(|&id| id != CONTROL_ID);
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Moves as many bytes as the socket takes without blocking; pushes finished request ids.
    /// `current` is what this rank runs (a probe from the peer is compared with it).
    pub(super) fn advance(
        &mut self,
        finished: &mut Vec<u64>,
        current: OpTag,
        regions: &mut RegionTable,
    ) -> Result<Advance, TransportError> {
        let mut out = Advance::default();
        if self.broken.is_some() {
            return Ok(out);
        }
        self.advance_sends(finished, &mut out)?;
        self.advance_recvs(finished, &mut out, current, regions)?;
        if self.recvs.is_empty() && (!self.awaiting_ack.is_empty() || self.put_in.is_some()) {
            out.moved |= self.read_idle(current, regions)?;
        }
        // Acknowledged sends, including those acknowledged while this rank slept.
        if !self.accepted.is_empty() {
            finished.append(&mut self.accepted);
            out.moved = true;
        }
        // Acknowledgements queued while reading go out now, not on the next pass.
        if self.sends.front().is_some_and(|s| s.id == CONTROL_ID) {
            self.advance_sends(finished, &mut out)?;
        }
        Ok(out)
    }

    /// A failed send usually means the peer failed and closed; it may have told us why on the
    /// other direction of the connection, so look for its abort notice before blaming the pipe.
    fn lost_while_sending(&mut self, e: &io::Error) -> TransportError {
        let mid_message = self.recvs.front().is_some_and(|r| r.read > 0);
        if !mid_message {
            let header = match self.guard.as_deref_mut() {
                Some(g) => g.open.read_header(&self.sock).ok().flatten(),
                None => {
                    let mut header = [0u8; HEADER_LEN];
                    matches!((&self.sock).read(&mut header), Ok(HEADER_LEN)).then_some(header)
                }
            };
            if let Some(Ok(Frame::Abort { len })) = header.map(|h| frame::decode(&h)) {
                return self.abort_notice(len, Span::EMPTY);
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

    fn corrupt(&self, reason: String) -> TransportError {
        TransportError::PeerLost {
            peer: self.peer,
            reason,
        }
    }

    /// The error of a protected read that stopped.
    fn open_failed(&self, e: OpenError) -> TransportError {
        match e {
            OpenError::Io(e) => self.lost("recv", &e),
            OpenError::Closed => {
                self.corrupt("connection closed by peer (it exited or failed)".into())
            }
            OpenError::Forged => self.corrupt(format!(
                "integrity check failed: a frame from this peer was altered, replayed or \
                 reordered on the way ({} is on)",
                protect::Protection::CVAR
            )),
        }
    }

    /// The error an abort notice of `len` reason bytes carries. The reason's first bytes may
    /// already sit in `landed` (a receive buffer); the rest is read from the socket.
    fn abort_notice(&mut self, len: u64, landed: Span) -> TransportError {
        let len = usize::try_from(len).unwrap_or(usize::MAX).min(MAX_REASON);
        let have = landed.len().min(len);
        let mut reason = vec![0u8; have];
        landed.sub(0, have).copy_to_slice(&mut reason);
        if let Some(g) = self.guard.as_deref_mut() {
            // A protected notice never lands in a receive buffer: it is read whole and checked.
            reason = g.open.read_reason(&self.sock, len).unwrap_or_else(|_| {
                b"(its reason was cut short or failed the integrity check)".to_vec()
            });
        } else {
            let mut rest = vec![0u8; len - have];
            if let Ok(n) = (&self.sock).read(&mut rest) {
                reason.extend_from_slice(&rest[..n]);
            }
        }
        let peer = self.peer;
        TransportError::PeerLost {
            peer,
            reason: format!("peer {peer} failed: {}", String::from_utf8_lossy(&reason)),
        }
    }

    fn advance_sends(
        &mut self,
        finished: &mut Vec<u64>,
        out: &mut Advance,
    ) -> Result<(), TransportError> {
        while let Some(s) = self.sends.front_mut() {
            let total = wire_len(self.guard.is_some(), s);
            while s.written < total {
                match write_front(&self.sock, self.guard.as_deref_mut(), s) {
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
            if s.id != CONTROL_ID && !s.awaits_ack {
                finished.push(s.id);
            }
            self.sends.pop_front();
        }
        Ok(())
    }
}

/// Bytes of the message `s` on the wire: plain, or sealed when `guarded`.
fn wire_len(guarded: bool, s: &PendingSend) -> usize {
    if guarded {
        protect::frame_len(s.data.len())
    } else {
        HEADER_LEN + s.data.len()
    }
}

/// Writes more of the front message `s` (at most [`MAX_IO_BYTES`] of its payload), as it is or
/// sealed by `guard`; returns the bytes written.
fn write_front(sock: &Socket, guard: Option<&mut Session>, s: &PendingSend) -> io::Result<usize> {
    if let Some(g) = guard {
        return g.seal.send_some(sock, &s.header, s.data, s.written);
    }
    let header_left = &s.header[s.written.min(HEADER_LEN)..];
    let payload_from = s.written.saturating_sub(HEADER_LEN);
    let payload = s.data.sub(
        payload_from,
        (s.data.len() - payload_from).min(MAX_IO_BYTES),
    );
    // SAFETY: the span's owner keeps it valid and unmodified while the send is pending
    // (Transport::post_send contract); the slice lives only for this call.
    unsafe {
        payload.with_slice(|p| {
            let bufs = [IoSlice::new(header_left), IoSlice::new(p)];
            sock.send_vectored_with_flags(&bufs, libc::MSG_NOSIGNAL)
        })
    }
}

/// A probe (or a message that arrived early) says the peer runs the operation `got`: a rank
/// that runs another operation with the same sequence number (one of `mine`) disagrees with it.
/// Different sequence numbers only mean that one rank is ahead.
fn check_same_op<const N: usize>(
    peer: usize,
    got: OpTag,
    mine: [OpTag; N],
) -> Result<(), TransportError> {
    match mine
        .into_iter()
        .find(|m| got.seq != 0 && m.seq == got.seq && m.word != got.word)
    {
        Some(expected) => Err(TransportError::Disagree {
            peer,
            expected,
            got,
        }),
        None => Ok(()),
    }
}

/// Whether a connection broken by `e` still reaches a live peer (this rank found the
/// disagreement; the peer did nothing wrong at the transport level).
fn peer_is_alive(e: &TransportError) -> bool {
    matches!(
        e,
        TransportError::Disagree { .. }
            | TransportError::SizeMismatch { .. }
            | TransportError::PostedMismatch { .. }
    )
}
