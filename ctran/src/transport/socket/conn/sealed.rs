//! The receiving side of a protected connection: records read and checked through the guard
//! before anything counts (see [`super::super::protect`]).

use super::{Advance, Conn, HEADER_LEN};
use crate::span::Span;
use crate::transport::region::RegionTable;
use crate::transport::socket::protect;
use crate::transport::{OpTag, TransportError};

impl Conn {
    /// [`Conn::advance_recvs`] on a protected connection. A header record is read whole into
    /// the guard and checked before it counts (the front receive's `read` then jumps to
    /// `HEADER_LEN`); the payload lands in the receive buffer chunk by chunk, each checked in
    /// place when its tag arrived, and `read - HEADER_LEN` counts its sealed bytes.
    pub(super) fn advance_sealed_recvs(
        &mut self,
        finished: &mut Vec<u64>,
        out: &mut Advance,
        current: OpTag,
        regions: &mut RegionTable,
    ) -> Result<(), TransportError> {
        while !self.recvs.is_empty() {
            if self.put_in.is_some() {
                if !self.fill_put()? {
                    return Ok(());
                }
                out.moved = true;
                continue;
            }
            let r = &mut self.recvs[0];
            let g = self.guard.as_deref_mut().expect("a protected connection");
            if !r.checked {
                match g.open.read_header(&self.sock) {
                    Ok(Some(header)) => {
                        self.recv_header = header;
                        r.read = HEADER_LEN;
                        out.moved = true;
                    }
                    Ok(None) => return Ok(()),
                    Err(e) => return Err(self.open_failed(e)),
                }
                self.take_header(current, regions)?;
                continue;
            }
            let (before, len) = (r.read - HEADER_LEN, r.data.len());
            let mut off = before;
            let res = g.open.read_payload(&self.sock, r.data, &mut off);
            r.read = HEADER_LEN + off;
            out.moved |= off > before;
            res.map_err(|e| self.open_failed(e))?;
            if !protect::payload_done(len, off) {
                return Ok(());
            }
            finished.push(self.recvs[0].id);
            self.recvs.pop_front();
        }
        Ok(())
    }

    /// Reads what has arrived of the newest early message's payload, through the guard on a
    /// protected connection. Returns whether it is complete.
    pub(super) fn fill_early(&mut self) -> Result<bool, TransportError> {
        let Some(guard) = self.guard.as_deref_mut() else {
            return self
                .early
                .fill(&self.sock)
                .map_err(|e| self.lost("recv", &e));
        };
        let Some((data, sealed_read)) = self.early.newest_mut() else {
            return Ok(true);
        };
        let len = data.len();
        // SAFETY: the buffer is the early message's own, which nothing else touches while it
        // is filled; the span does not outlive this call.
        let span = unsafe { Span::from_slice(data) };
        let res = guard.open.read_payload(&self.sock, span, sealed_read);
        let done = protect::payload_done(len, *sealed_read);
        res.map_err(|e| self.open_failed(e))?;
        if done {
            self.early.mark_complete();
        }
        Ok(done)
    }
}
