//! Staging buffers: the fixed amount of scratch memory a communicator reduces through, however
//! large the message.

use crate::span::Span;

/// A few chunk-sized scratch buffers, allocated on first use and kept for the communicator's
/// lifetime (8-byte aligned, so typed reduction kernels take their fast path).
#[derive(Debug)]
pub struct Staging {
    chunk_bytes: usize,
    slots: Vec<Vec<u64>>,
}

impl Staging {
    /// Staging with chunks of `chunk_bytes` (rounded up to 8).
    pub fn new(chunk_bytes: usize) -> Staging {
        Staging {
            chunk_bytes: chunk_bytes.div_ceil(8) * 8,
            slots: Vec::new(),
        }
    }

    /// The largest multiple of `elem_bytes` that fits in one chunk.
    pub fn chunk_for(&self, elem_bytes: usize) -> usize {
        (self.chunk_bytes / elem_bytes).max(1) * elem_bytes
    }

    /// Slot `i` (one chunk), allocated on first use.
    pub fn slot(&mut self, i: usize) -> Span {
        while self.slots.len() <= i {
            self.slots.push(vec![0u64; self.chunk_bytes / 8]);
        }
        let s = &mut self.slots[i];
        // SAFETY: the slot's memory lives as long as `self`, and the progress thread that owns
        // `self` uses it for one operation at a time.
        unsafe { Span::from_raw(s.as_mut_ptr().cast::<u8>(), s.len() * 8) }
    }

    /// Bytes of scratch memory held.
    pub fn bytes_held(&self) -> usize {
        self.slots.len() * self.chunk_bytes
    }
}
