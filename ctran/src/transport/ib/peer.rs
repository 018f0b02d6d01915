//! The state this rank keeps per peer: the virtual QP, the two control rings with their
//! credits, and the queues of the rendezvous protocol and of one-sided operations.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use ibverbx::{Put, RemoteKey as IbKey, VirtualQp};

use super::backend::{IbBackend, IbMemory};
use super::in_place::Slice;
use super::wire::{Ctl, RING_SLOTS, SLOT};
use crate::span::Span;
use crate::transport::{Delivery, OpTag, TransportError};

/// A posted send waiting for its receiver's clear-to-send.
#[derive(Debug)]
pub(crate) struct SendReq {
    pub(crate) id: u64,
    pub(crate) data: Span,
    pub(crate) tag: OpTag,
    pub(crate) delivery: Delivery,
}

/// A clear-to-send waiting for its send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cts {
    pub(crate) rid: u64,
    pub(crate) tag: OpTag,
    pub(crate) len: u64,
    pub(crate) key: IbKey,
}

/// Registered memory a transfer's bytes go through: the transport's staging (copied) or the
/// caller's registered buffer itself.
#[derive(Debug)]
pub(crate) enum Through<M, U> {
    Staging(M),
    InPlace(Slice<U>),
}

/// A posted receive whose clear-to-send went (or waits) to the peer.
#[derive(Debug)]
pub(crate) struct RecvReq<M, U> {
    pub(crate) data: Span,
    pub(crate) tag: OpTag,
    /// Where the sender writes (none for an empty message).
    pub(crate) landing: Option<Through<M, U>>,
}

/// What a write posted on the virtual QP was for.
#[derive(Debug)]
pub(crate) enum InFlight<M, U> {
    /// A control message; `req` finishes once it is written (a signal).
    Control { req: Option<u64> },
    /// The data of send `req` into receive `rid`.
    SendData {
        req: u64,
        rid: u64,
        delivery: Delivery,
        source: Through<M, U>,
    },
    /// One-sided put `req` (its entry in [`Peer::onesided`] says what follows).
    OneSided { req: u64, staging: M },
}

/// One-sided operations to a peer, in posting order: a signal's control message goes out only
/// once every put before it completed (its data is in place at the target).
#[derive(Debug)]
pub(crate) enum OneSided {
    Put { wr: u64, ctl: Ctl, done: bool },
    Signal { req: u64, ctl: Ctl },
}

/// Everything about one connected peer.
pub(crate) struct Peer<B: IbBackend> {
    pub(crate) vqp: VirtualQp<B::P>,
    send_ring: B::Mem,
    recv_ring: B::Mem,
    peer_ring: IbKey,
    /// Control messages written to the peer, and how many of them it consumed.
    sent: u64,
    peer_consumed: u64,
    /// Control messages of the peer consumed here, and the count last told to the peer.
    consumed: u64,
    acked_sent: u64,
    out: VecDeque<(Ctl, Option<u64>)>,
    pub(crate) writes: HashMap<u64, InFlight<B::Mem, B::UserMem>>,
    pub(crate) sends: VecDeque<SendReq>,
    pub(crate) ctss: VecDeque<Cts>,
    pub(crate) recvs: HashMap<u64, RecvReq<B::Mem, B::UserMem>>,
    /// Sends whose receiver's acknowledgement is awaited: receive id -> (send id, delivery).
    pub(crate) acks: HashMap<u64, (u64, Delivery)>,
    pub(crate) onesided: VecDeque<OneSided>,
    /// The error that broke the way to this peer.
    pub(crate) broken: Option<TransportError>,
    pub(crate) last_heard: Instant,
    pub(crate) last_ping: Instant,
}

impl<B: IbBackend> std::fmt::Debug for Peer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("vqp", &self.vqp)
            .field("sent", &self.sent)
            .field("consumed", &self.consumed)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl<B: IbBackend> Peer<B> {
    pub(crate) fn new(
        vqp: VirtualQp<B::P>,
        send_ring: B::Mem,
        recv_ring: B::Mem,
        peer_ring: IbKey,
    ) -> Peer<B> {
        let now = Instant::now();
        Peer {
            vqp,
            send_ring,
            recv_ring,
            peer_ring,
            sent: 0,
            peer_consumed: 0,
            consumed: 0,
            acked_sent: 0,
            out: VecDeque::new(),
            writes: HashMap::new(),
            sends: VecDeque::new(),
            ctss: VecDeque::new(),
            recvs: HashMap::new(),
            acks: HashMap::new(),
            onesided: VecDeque::new(),
            broken: None,
            last_heard: now,
            last_ping: now,
        }
    }

    /// Queues a control message; `req` finishes once it is written.
    pub(crate) fn queue(&mut self, ctl: Ctl, req: Option<u64>) {
        self.out.push_back((ctl, req));
    }

    /// Whether requests or protocol state wait on this peer (it is then watched for life).
    pub(crate) fn busy(&self) -> bool {
        !(self.sends.is_empty()
            && self.recvs.is_empty()
            && self.acks.is_empty()
            && self.onesided.is_empty()
            && self.writes.is_empty()
            && self.out.is_empty())
    }

    /// Whether control messages or writes still wait to go out or complete.
    pub(crate) fn owes_output(&self) -> bool {
        !self.out.is_empty() || !self.writes.is_empty()
    }

    /// Writes queued control messages while the peer's ring has room. `next_wr` numbers the
    /// writes. Returns whether one went out.
    pub(crate) fn flush(&mut self, next_wr: &mut u64) -> Result<bool, ibverbx::Error> {
        let mut wrote = false;
        while let Some((ctl, _)) = self.out.front() {
            let room = if *ctl == Ctl::Credit {
                RING_SLOTS
            } else {
                RING_SLOTS - 1
            };
            if self.sent - self.peer_consumed >= room {
                break;
            }
            let (ctl, req) = self.out.pop_front().expect("front exists");
            let n = self.sent;
            let off = (n % RING_SLOTS) as usize * SLOT;
            // Slot n % RING_SLOTS was last used by message n - RING_SLOTS, which the peer
            // consumed (room above), so the NIC finished reading it.
            self.send_ring.write(off, &ctl.encode(n, self.consumed));
            let wr = *next_wr;
            *next_wr += 1;
            self.vqp.put(&Put {
                wr_id: wr,
                local: self.send_ring.local_key(),
                local_offset: off as u64,
                remote: self.peer_ring,
                remote_offset: off as u64,
                len: SLOT as u64,
                notify: true,
            })?;
            self.sent += 1;
            self.acked_sent = self.consumed;
            self.writes.insert(wr, InFlight::Control { req });
            wrote = true;
        }
        Ok(wrote)
    }

    /// Reads the peer's control message number `n` (its notification arrived) and takes its
    /// credits.
    pub(crate) fn take(&mut self, n: u64) -> Result<Ctl, String> {
        if n != self.consumed {
            return Err(format!(
                "control message {n} notified where {} was next",
                self.consumed
            ));
        }
        let mut b = [0u8; SLOT];
        self.recv_ring
            .read((n % RING_SLOTS) as usize * SLOT, &mut b);
        let (ctl, acked) = Ctl::decode(&b, n)?;
        if acked > self.sent {
            return Err(format!(
                "the peer says it consumed {acked} control messages; {} were sent",
                self.sent
            ));
        }
        self.peer_consumed = self.peer_consumed.max(acked);
        self.consumed += 1;
        self.last_heard = Instant::now();
        // Tell the peer what was consumed before its ring looks full to it; a credit may use
        // the slot kept for it, so two ranks whose rings are both full never wait on each other.
        let owed = self.consumed - self.acked_sent;
        if owed >= RING_SLOTS / 2 && self.out.front().is_none_or(|(c, _)| *c != Ctl::Credit) {
            self.out.push_front((Ctl::Credit, None));
            self.acked_sent = self.consumed;
        }
        Ok(ctl)
    }

    /// Queues a keep-alive when the peer was silent for `after` while work waits on it: a write
    /// to a peer that is gone fails (retry exceeded), which is how its loss is noticed.
    pub(crate) fn ping_if_silent(&mut self, now: Instant, after: std::time::Duration) {
        if now.duration_since(self.last_heard) >= after
            && now.duration_since(self.last_ping) >= after
            && self.out.is_empty()
        {
            self.last_ping = now;
            self.out.push_back((Ctl::Credit, None));
        }
    }

    /// Forgets every request this peer holds (the transport fails them): their memory is
    /// never touched again. Awaited acknowledgements stay, so that
    /// [`crate::transport::Transport::unconfirmed`] reports the failure.
    pub(crate) fn clear_requests(&mut self) {
        self.sends.clear();
        self.recvs.clear();
        self.onesided.clear();
        self.out.clear();
        self.ctss.clear();
    }
}
