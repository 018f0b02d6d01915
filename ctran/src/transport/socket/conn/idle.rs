//! Reading while no receive is posted: control frames and one-sided frames are taken as they
//! come, while a data message is only peeked at and left in the socket for its receive (or read
//! early while acknowledgements are awaited behind it).

use std::io::{self, Read};

use nix::errno::Errno;
use nix::sys::socket::{self, MsgFlags};

use super::{check_same_op, Conn};
use crate::span::Span;
use crate::transport::region::RegionTable;
use crate::transport::socket::frame::{self, Frame, HEADER_LEN};
use crate::transport::socket::protect::{OpenError, SEALED_HEADER};
use crate::transport::{OpTag, TransportError};

impl Conn {
    /// For a connection that carries no data (its peer is reached another way): reports whether
    /// the peer closed it or sent an abort notice. Never blocks.
    pub(in crate::transport::socket) fn probe_idle(
        &mut self,
        regions: &mut RegionTable,
    ) -> Option<TransportError> {
        if let Some(e) = &self.broken {
            return Some(e.clone());
        }
        if !self.recvs.is_empty() || self.peer_finished {
            return None;
        }
        match self.read_idle(OpTag::default(), regions) {
            Err(e) => Some(e),
            Ok(_) if self.data_waiting => Some(TransportError::PeerLost {
                peer: self.peer,
                reason: "unexpected data on an idle connection".into(),
            }),
            Ok(_) => None,
        }
    }

    /// Reads what arrived while no receive is posted: probes are answered (compared with
    /// `current`, what this rank runs), acknowledgements, goodbyes and abort notices taken. A
    /// data message is only looked at (its header peeked, so a peer that runs another
    /// operation in this one's place is found) and left in the socket for its receive.
    /// Never blocks. Returns whether it took or found anything.
    pub(in crate::transport::socket) fn read_idle(
        &mut self,
        current: OpTag,
        regions: &mut RegionTable,
    ) -> Result<bool, TransportError> {
        let mut took = false;
        while self.wants_idle_read() {
            if self.put_in.is_some() {
                if !self.fill_put()? {
                    return Ok(took);
                }
                took = true;
                continue;
            }
            if self.early.filling() {
                if !self.fill_early()? {
                    return Ok(took);
                }
                took = true;
                continue;
            }
            // The rest of the header is on its way.
            let Some(header) = self.peek_header()? else {
                return Ok(took);
            };
            took = true;
            let frame = frame::decode(&header).map_err(|reason| self.corrupt(reason))?;
            if let Frame::Data { tag, len, .. } = frame {
                check_same_op(self.peer, tag, [current])?;
                let read_early =
                    self.awaiting_ack.iter().any(Option::is_some) && self.early.has_room_for(len);
                if !read_early {
                    self.data_waiting = true;
                    return Ok(true);
                }
            }
            // Take the header (peeked whole, so it is there).
            self.take_peeked()?;
            match frame {
                Frame::Data { len, tag, confirm } => self.early.start(len, tag, confirm),
                Frame::Bye => self.peer_finished = true,
                Frame::Probe { tag } => check_same_op(self.peer, tag, [current])?,
                Frame::Ack { .. } => self.take_ack()?,
                Frame::Abort { len } => return Err(self.abort_notice(len, Span::EMPTY)),
                Frame::Put {
                    len,
                    region,
                    offset,
                } => self.take_idle_put(regions, len, region, offset)?,
                Frame::Signal { .. } | Frame::Fence { .. } => self.take_signal(regions, frame)?,
            }
        }
        Ok(took)
    }

    /// The next frame's header, checked but left in the socket; `None` while it is not all
    /// there.
    fn peek_header(&self) -> Result<Option<[u8; HEADER_LEN]>, TransportError> {
        let mut record = [0u8; SEALED_HEADER];
        let want = self.header_bytes();
        let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
        match socket::recv(self.fd(), &mut record[..want], flags) {
            Ok(0) => return Err(self.open_failed(OpenError::Closed)),
            Ok(n) if n < want => return Ok(None),
            Ok(_) => {}
            Err(Errno::EAGAIN | Errno::EINTR) => return Ok(None),
            Err(e) => return Err(self.lost("recv", &io::Error::from(e))),
        }
        match &self.guard {
            Some(g) => g
                .open
                .peek_header(&record)
                .map(Some)
                .map_err(|f| self.open_failed(f.into())),
            None => Ok(Some(record[..HEADER_LEN].try_into().expect("32 bytes"))),
        }
    }

    /// Takes the header [`Conn::peek_header`] returned from the socket.
    fn take_peeked(&mut self) -> Result<(), TransportError> {
        let mut record = [0u8; SEALED_HEADER];
        let want = self.header_bytes();
        if !matches!((&self.sock).read(&mut record[..want]), Ok(n) if n == want) {
            return Err(self.corrupt("a frame header cut short".into()));
        }
        match self.guard.as_deref_mut() {
            Some(g) => match g.open.open_header(&record) {
                Ok(_) => Ok(()),
                Err(f) => Err(self.open_failed(f.into())),
            },
            None => Ok(()),
        }
    }

    /// Bytes of a header on the wire: sealed or plain.
    fn header_bytes(&self) -> usize {
        if self.guard.is_some() {
            SEALED_HEADER
        } else {
            HEADER_LEN
        }
    }
}
