//! The receiving side of a plain connection: the front receive's message read off the socket,
//! and the header of whatever frame arrived in its place acted on (shared with [`super::sealed`]).

use std::io::{self, IoSliceMut, Read};

use super::{check_same_op, Advance, Conn, HEADER_LEN, MAX_IO_BYTES};
use crate::transport::region::RegionTable;
use crate::transport::socket::frame::{self, Frame};
use crate::transport::{OpTag, TransportError};

impl Conn {
    pub(super) fn advance_recvs(
        &mut self,
        finished: &mut Vec<u64>,
        out: &mut Advance,
        current: OpTag,
        regions: &mut RegionTable,
    ) -> Result<(), TransportError> {
        // Early messages came before anything still in the socket; none arrive while a receive
        // is posted.
        while !self.recvs.is_empty() && self.put_in.is_some() {
            if !self.fill_put()? {
                return Ok(());
            }
            out.moved = true;
        }
        while !self.recvs.is_empty() && !self.early.is_empty() {
            if !self.take_early(finished)? {
                return Ok(());
            }
            out.moved = true;
        }
        if self.guard.is_some() {
            return self.advance_sealed_recvs(finished, out, current, regions);
        }
        while !self.recvs.is_empty() {
            loop {
                if self.put_in.is_some() {
                    if !self.fill_put()? {
                        return Ok(());
                    }
                    out.moved = true;
                }
                let r = &mut self.recvs[0];
                if r.read >= HEADER_LEN && !r.checked {
                    self.take_header(current, regions)?;
                    continue;
                }
                let total = HEADER_LEN + r.data.len();
                if r.read == total {
                    break;
                }
                let header_done = r.read >= HEADER_LEN;
                let payload_from = r.read.saturating_sub(HEADER_LEN);
                let payload = r.data.sub(
                    payload_from,
                    (r.data.len() - payload_from).min(MAX_IO_BYTES),
                );
                let header_buf = &mut self.recv_header[r.read.min(HEADER_LEN)..];
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
                        r.read += n;
                        out.moved = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(self.lost("recv", &e)),
                }
            }
            finished.push(self.recvs[0].id);
            self.recvs.pop_front();
        }
        Ok(())
    }

    /// The peer acknowledged the oldest message that asked for it. A send that finishes with
    /// its acknowledgement finishes now, or when written if it is still being written (the peer
    /// accepts a message at its header).
    pub(super) fn take_ack(&mut self) -> Result<(), TransportError> {
        match self.awaiting_ack.pop_front() {
            None => Err(self.corrupt("an acknowledgement of nothing".into())),
            Some(None) => {
                self.confirmed_unacked -= 1;
                Ok(())
            }
            Some(Some(id)) => {
                match self.sends.iter_mut().find(|s| s.id == id) {
                    Some(s) => s.awaits_ack = false,
                    None => self.accepted.push(id),
                }
                Ok(())
            }
        }
    }

    /// Hands the oldest early message to the front receive, once it is complete: checked as
    /// a message read from the socket is, copied, acknowledged when asked. Returns whether it
    /// was complete.
    fn take_early(&mut self, finished: &mut Vec<u64>) -> Result<bool, TransportError> {
        if self.early.filling() && !self.fill_early()? {
            return Ok(false);
        }
        let Some(e) = self.early.take_complete() else {
            return Ok(false);
        };
        self.accept_data(e.data.len() as u64, e.tag, e.confirm)?;
        let r = self.recvs.pop_front().expect("a receive is posted");
        r.data.copy_from_slice(&e.data);
        finished.push(r.id);
        Ok(true)
    }

    /// Checks a data header against the front receive: the peer's operation and size must be
    /// the receive's. Acknowledges it when the sender asked.
    fn accept_data(&mut self, len: u64, tag: OpTag, confirm: bool) -> Result<(), TransportError> {
        let r = &mut self.recvs[0];
        if tag != r.tag {
            return Err(TransportError::Disagree {
                peer: self.peer,
                expected: r.tag,
                got: tag,
            });
        }
        if len != r.data.len() as u64 {
            return Err(TransportError::SizeMismatch {
                peer: self.peer,
                expected: r.data.len(),
                got: usize::try_from(len).unwrap_or(usize::MAX),
            });
        }
        r.checked = true;
        if confirm {
            self.push_control(Frame::Ack { tag });
        }
        Ok(())
    }

    /// Acts on the just-completed header of the front receive's message. A data header must
    /// carry the receive's tag and size (and is acknowledged when the sender asked). A probe or
    /// an acknowledgement is taken and dropped: the bytes read past it (they landed at the start
    /// of the receive buffer) are the next frame's, and move to where that frame's header and
    /// payload belong.
    pub(super) fn take_header(
        &mut self,
        current: OpTag,
        regions: &mut RegionTable,
    ) -> Result<(), TransportError> {
        let r = &self.recvs[0];
        match frame::decode(&self.recv_header).map_err(|reason| self.corrupt(reason))? {
            Frame::Data { len, tag, confirm } => self.accept_data(len, tag, confirm),
            frame @ (Frame::Probe { .. }
            | Frame::Ack { .. }
            | Frame::Signal { .. }
            | Frame::Fence { .. }) => {
                match frame {
                    Frame::Probe { tag } => check_same_op(self.peer, tag, [r.tag, current])?,
                    Frame::Ack { .. } => self.take_ack()?,
                    _ => self.take_signal(regions, frame)?,
                }
                self.reframe(0);
                Ok(())
            }
            Frame::Put {
                len,
                region,
                offset,
            } => self.take_recv_put(regions, len, region, offset),
            Frame::Abort { len } => {
                let landed = r.data.sub(0, r.read - HEADER_LEN);
                Err(self.abort_notice(len, landed))
            }
            Frame::Bye => Err(TransportError::PeerLost {
                peer: self.peer,
                reason: format!(
                    "peer {} finalized the communicator while this rank still expected data from it",
                    self.peer
                ),
            }),
        }
    }

    /// After a frame that is not the front receive's (and `consumed` bytes of its payload)
    /// were taken out of what landed in the receive buffer, moves the bytes read past them to
    /// where the next frame's header and payload belong.
    pub(super) fn reframe(&mut self, consumed: usize) {
        let r = &self.recvs[0];
        let rest = r.read - HEADER_LEN - consumed;
        let into_header = rest.min(HEADER_LEN);
        r.data
            .sub(consumed, into_header)
            .copy_to_slice(&mut self.recv_header[..into_header]);
        if rest > into_header {
            r.data
                .copy_from(&r.data.sub(consumed + into_header, rest - into_header));
        }
        self.recvs[0].read = rest;
    }
}
