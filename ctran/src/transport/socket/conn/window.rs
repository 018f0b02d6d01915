//! One-sided frames from the peer (a window's puts, signals and fences): each is checked
//! against the region table before it touches memory; a refused one writes nothing, tells the
//! peer why and fails the connection.

use std::io::{self, Read};
use std::time::Duration;

use super::{Conn, HEADER_LEN, MAX_IO_BYTES};
use crate::span::Span;
use crate::transport::region::{Landing, PutTarget, RegionTable, SignalKind};
use crate::transport::socket::frame::Frame;
use crate::transport::socket::protect;
use crate::transport::TransportError;

/// The payload of an incoming put, still to be read into its (checked) place in a region.
#[derive(Debug)]
pub(super) struct PutIn {
    /// Where it lands: inside a registered region, checked when its header arrived.
    dst: Span,
    /// Bytes read off the wire so far (sealed bytes on a protected connection).
    off: usize,
    /// A staged region's report to its sink, made once every byte is in.
    landing: Option<Landing>,
}

impl Conn {
    /// A put's header arrived while no receive is posted: its payload is read straight into
    /// the region.
    pub(super) fn take_idle_put(
        &mut self,
        regions: &mut RegionTable,
        len: u64,
        region: u64,
        offset: u64,
    ) -> Result<(), TransportError> {
        let PutTarget { dst, landing } = self.start_put(regions, len, region, offset)?;
        self.put_in = Some(PutIn {
            dst,
            off: 0,
            landing,
        });
        Ok(())
    }

    /// A put's header arrived in the front receive's place. Its first payload bytes may have
    /// landed in the receive buffer: they move to the region (checked first), the rest is read
    /// there directly.
    pub(super) fn take_recv_put(
        &mut self,
        regions: &mut RegionTable,
        len: u64,
        region: u64,
        offset: u64,
    ) -> Result<(), TransportError> {
        let PutTarget { dst, landing } = self.start_put(regions, len, region, offset)?;
        let r = &self.recvs[0];
        let extra = r.read - HEADER_LEN;
        let landed = extra.min(dst.len());
        dst.sub(0, landed).copy_from(&r.data.sub(0, landed));
        if landed < dst.len() {
            self.recvs[0].read = 0;
            self.put_in = Some(PutIn {
                dst,
                off: landed,
                landing,
            });
        } else {
            self.reframe(landed);
            if let Some(l) = landing {
                l.land(self.peer);
            }
        }
        Ok(())
    }

    /// Checks an incoming put against the registered regions before any byte of it is
    /// written: the region exists, has the generation named, and the write fits. A refused put
    /// writes nothing: the peer is told why (an abort notice) and the connection fails.
    fn start_put(
        &mut self,
        regions: &mut RegionTable,
        len: u64,
        region: u64,
        offset: u64,
    ) -> Result<PutTarget, TransportError> {
        regions
            .check_put(region, offset, len)
            .map_err(|why| self.refuse(format!("refused a put from peer {}: {why}", self.peer)))
    }

    /// Applies a signal or fence frame.
    pub(super) fn take_signal(
        &mut self,
        regions: &mut RegionTable,
        frame: Frame,
    ) -> Result<(), TransportError> {
        let res = match frame {
            Frame::Signal { region, add } => {
                regions.apply_signal(region, self.peer, SignalKind::Signal, add)
            }
            Frame::Fence { region } => {
                regions.apply_signal(region, self.peer, SignalKind::Fence, 1)
            }
            _ => Ok(()),
        };
        res.map_err(|why| self.refuse(format!("refused a signal from peer {}: {why}", self.peer)))
    }

    /// Tells the peer why its one-sided frame was refused and returns the error that fails
    /// this connection.
    fn refuse(&mut self, reason: String) -> TransportError {
        tracing::warn!(peer = self.peer, "{reason}");
        self.send_abort_notice(&reason, Duration::from_millis(100));
        TransportError::PeerLost {
            peer: self.peer,
            reason,
        }
    }

    /// Ends an incoming put: a staged region's sink learns of it.
    fn put_done(&mut self) {
        if let Some(l) = self.put_in.take().and_then(|p| p.landing) {
            l.land(self.peer);
        }
    }

    /// Reads what has arrived of an incoming put's payload into its region. Returns whether
    /// the put is complete.
    pub(super) fn fill_put(&mut self) -> Result<bool, TransportError> {
        let Some(p) = self.put_in.as_mut() else {
            return Ok(true);
        };
        if let Some(g) = self.guard.as_deref_mut() {
            let res = g.open.read_payload(&self.sock, p.dst, &mut p.off);
            let done = protect::payload_done(p.dst.len(), p.off);
            res.map_err(|e| self.open_failed(e))?;
            if done {
                self.put_done();
            }
            return Ok(done);
        }
        while p.off < p.dst.len() {
            let chunk = p.dst.sub(p.off, (p.dst.len() - p.off).min(MAX_IO_BYTES));
            // SAFETY: `dst` lies inside a registered region (checked by `start_put`), which its
            // owner keeps valid until it is deregistered; the window's owners write it only
            // through puts, read in stream order. The slice lives only for this call.
            let res = unsafe { chunk.with_mut_slice(|b| (&self.sock).read(b)) };
            match res {
                Ok(0) => {
                    return Err(TransportError::PeerLost {
                        peer: self.peer,
                        reason: "connection closed by peer (it exited or failed)".into(),
                    })
                }
                Ok(n) => p.off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.lost("recv", &e)),
            }
        }
        self.put_done();
        Ok(true)
    }
}
