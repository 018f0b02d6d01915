//! DQPLB sequence numbers in the 32-bit immediate data: the low `bits` bits carry a sequence
//! number assigned in posting order across all QPs of a connection, bit 31 says "this chunk
//! ends a message the sender wants notified". The receiver marks each arrival in a window
//! starting at the next expected number and delivers the notifications of the prefix that is
//! complete, so notifications come out in order however the QPs interleave.
//!
//! Wraparound: numbers are compared as distances from the next expected one modulo
//! `2^bits`; a distance of half the space or more is refused as stale (a duplicate or a
//! sender ahead by more than half the space, which the per-QP outstanding limit prevents).

use std::collections::VecDeque;

/// Bit of the immediate data that marks the last chunk of a notified message.
pub const NOTIFY_BIT: u32 = 1 << 31;
/// Sequence bits in the immediate data (upstream's 24).
pub const SEQ_BITS: u32 = 24;

/// Assigns sequence numbers on the sending side.
#[derive(Debug, Clone)]
pub struct SeqSender {
    mask: u32,
    next: u32,
}

impl SeqSender {
    /// Numbers of `bits` bits (1..=24).
    pub fn new(bits: u32) -> SeqSender {
        SeqSender {
            mask: mask(bits),
            next: 0,
        }
    }

    /// The immediate data of the next chunk.
    pub fn next_imm(&mut self, notify: bool) -> u32 {
        let imm = self.next | if notify { NOTIFY_BIT } else { 0 };
        self.next = (self.next + 1) & self.mask;
        imm
    }
}

fn mask(bits: u32) -> u32 {
    let bits = bits.clamp(1, SEQ_BITS);
    (1u32 << bits) - 1
}

/// An immediate the tracker refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("sequence number {seq} refused while expecting {expected}: {why}")]
pub struct SeqError {
    /// The number received.
    pub seq: u32,
    /// The next number expected.
    pub expected: u32,
    /// Duplicate or out of the window.
    pub why: &'static str,
}

const ARRIVED: u8 = 1;
const NOTIFY: u8 = 2;

/// Receiving side: turns out-of-order arrivals into in-order notifications.
#[derive(Debug, Clone)]
pub struct SeqTracker {
    mask: u32,
    next: u32,
    // window[i] describes sequence number next + i.
    window: VecDeque<u8>,
}

impl SeqTracker {
    /// Numbers of `bits` bits (1..=24).
    pub fn new(bits: u32) -> SeqTracker {
        SeqTracker {
            mask: mask(bits),
            next: 0,
            window: VecDeque::new(),
        }
    }

    /// Records the arrival of `imm`; returns how many notifications are now deliverable, in
    /// order.
    pub fn receive(&mut self, imm: u32) -> Result<u32, SeqError> {
        let seq = imm & self.mask;
        let dist = seq.wrapping_sub(self.next) & self.mask;
        if dist > self.mask / 2 {
            return Err(SeqError {
                seq,
                expected: self.next,
                why: "behind the window (a duplicate)",
            });
        }
        let dist = dist as usize;
        if self.window.len() <= dist {
            self.window.resize(dist + 1, 0);
        }
        if self.window[dist] & ARRIVED != 0 {
            return Err(SeqError {
                seq,
                expected: self.next,
                why: "received twice",
            });
        }
        self.window[dist] = ARRIVED | if imm & NOTIFY_BIT != 0 { NOTIFY } else { 0 };
        let mut notes = 0;
        while let Some(&slot) = self.window.front() {
            if slot & ARRIVED == 0 {
                break;
            }
            self.window.pop_front();
            notes += u32::from(slot & NOTIFY != 0);
            self.next = (self.next + 1) & self.mask;
        }
        Ok(notes)
    }

    /// Numbers received beyond a gap, waiting for it to fill.
    pub fn pending(&self) -> usize {
        self.window.iter().filter(|&&s| s & ARRIVED != 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_and_reordered() {
        let mut s = SeqSender::new(SEQ_BITS);
        let imms: Vec<u32> = (0..6).map(|i| s.next_imm(i % 3 == 2)).collect();
        let mut t = SeqTracker::new(SEQ_BITS);
        assert_eq!(t.receive(imms[1]).unwrap(), 0);
        assert_eq!(t.receive(imms[2]).unwrap(), 0);
        assert_eq!(t.pending(), 2);
        assert_eq!(t.receive(imms[0]).unwrap(), 1);
        assert_eq!(t.receive(imms[5]).unwrap(), 0);
        assert_eq!(t.receive(imms[3]).unwrap(), 0);
        assert_eq!(t.receive(imms[4]).unwrap(), 1);
        assert_eq!(t.pending(), 0);
    }

    #[test]
    fn wraps_and_refuses_duplicates() {
        let mut s = SeqSender::new(3);
        let mut t = SeqTracker::new(3);
        for round in 0..5 {
            let a = s.next_imm(false);
            let b = s.next_imm(true);
            assert_eq!(t.receive(b).unwrap(), 0, "round {round}");
            assert!(t.receive(b).is_err());
            assert_eq!(t.receive(a).unwrap(), 1, "round {round}");
            assert!(t.receive(a).is_err(), "stale after delivery");
        }
    }
}
