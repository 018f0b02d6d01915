//! Checks of what a local peer wrote into the shared FIFOs (slot headers and FIFO indices)
//! before this rank acts on it.
//!
//! The segment is written by other processes: a peer that crashed mid-write, a stray process
//! that opened the segment, or a bug on the other side must fail the peer's transfers with an
//! error, never make this rank index out of its buffers (a panic on the progress thread) or
//! wait forever on an index that can never move.

use crate::transport::TransportError;

/// The header of one filled FIFO slot, as the sender wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Bytes of the whole message the slot is part of.
    pub(crate) msg_len: u64,
    /// Payload bytes in this slot.
    pub(crate) chunk_len: u64,
}

impl Slot {
    /// Checks the slot against the receive it feeds (`expected` bytes in all, `got` so far,
    /// `started` once a slot of it was consumed) and a slot payload of `slot_bytes`; returns the
    /// payload bytes to copy.
    pub(crate) fn check(
        &self,
        started: bool,
        expected: usize,
        got: usize,
        slot_bytes: usize,
        peer: usize,
    ) -> Result<usize, TransportError> {
        if !started && self.msg_len != expected as u64 {
            return Err(TransportError::SizeMismatch {
                peer,
                expected,
                got: usize::try_from(self.msg_len).unwrap_or(usize::MAX),
            });
        }
        let left = expected.saturating_sub(got);
        match usize::try_from(self.chunk_len) {
            Ok(n) if n <= slot_bytes && n <= left => Ok(n),
            _ => Err(TransportError::PeerLost {
                peer,
                reason: format!(
                    "corrupt shared-memory slot: a chunk of {} bytes (slot holds {slot_bytes}, \
                     {left} bytes of the message left)",
                    self.chunk_len
                ),
            }),
        }
    }
}

/// Slots in use in a FIFO of `k` slots whose producer wrote `head` and consumer `tail` (both
/// count up forever, wrapping). More than `k` means one side wrote garbage.
pub(crate) fn fifo_used(head: u64, tail: u64, k: u64, peer: usize) -> Result<u64, TransportError> {
    let used = head.wrapping_sub(tail);
    if used > k {
        return Err(TransportError::PeerLost {
            peer,
            reason: format!(
                "corrupt shared-memory FIFO index (head {head}, tail {tail}, {k} slots)"
            ),
        });
    }
    Ok(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_that_do_not_fit_are_errors() {
        let s = |msg_len, chunk_len| Slot { msg_len, chunk_len };
        assert_eq!(s(10, 4).check(false, 10, 0, 8, 1).unwrap(), 4);
        assert_eq!(s(0, 999).check(true, 10, 8, 8, 1).ok(), None);
        assert!(matches!(
            s(11, 4).check(false, 10, 0, 8, 1),
            Err(TransportError::SizeMismatch { got: 11, .. })
        ));
        assert!(s(10, 9).check(false, 10, 0, 8, 1).is_err());
        assert!(s(10, u64::MAX).check(false, 10, 0, 8, 1).is_err());
        assert_eq!(s(0, 0).check(false, 0, 0, 8, 1).unwrap(), 0);
    }

    #[test]
    fn fifo_index_past_its_slots_is_an_error() {
        assert_eq!(fifo_used(5, 3, 4, 0).unwrap(), 2);
        assert_eq!(fifo_used(3, u64::MAX, 4, 0).unwrap(), 4);
        assert!(fifo_used(3, 5, 4, 0).is_err());
        assert!(fifo_used(9, 3, 4, 0).is_err());
    }
}
