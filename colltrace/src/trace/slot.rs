//! The seqlock slot the rings are made of.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::Duration;

/// A slot of `N` words guarded by a sequence number (odd while being written).
#[derive(Debug)]
pub(super) struct Slot<const N: usize> {
    pub(super) seq: AtomicU64,
    pub(super) words: [AtomicU64; N],
}

impl<const N: usize> Default for Slot<N> {
    fn default() -> Self {
        Slot {
            seq: AtomicU64::new(0),
            words: [const { AtomicU64::new(0) }; N],
        }
    }
}

impl<const N: usize> Slot<N> {
    /// Writes `w`. Only one thread may write a slot at a time: the single writer of the
    /// execution side, or a thread that won [`Slot::claim`].
    #[inline]
    pub(super) fn write_claimed(&self, seq: u64, w: [u64; N]) {
        // `seq` is odd (claimed); the data stores may not move before it.
        fence(Ordering::Release);
        for (a, x) in self.words.iter().zip(w) {
            a.store(x, Ordering::Relaxed);
        }
        self.seq.store(seq.wrapping_add(1), Ordering::Release);
    }

    /// Writes `w` as the only writer of this slot.
    #[inline]
    pub(super) fn write(&self, w: [u64; N]) {
        let s = self.seq.load(Ordering::Relaxed) | 1;
        self.seq.store(s, Ordering::Relaxed);
        self.write_claimed(s, w);
    }

    /// Changes words `i` and `j` to `a` and `b` as the only writer of this slot (the other
    /// words keep what this thread wrote last): two stores instead of `N`.
    #[inline]
    pub(super) fn write_two(&self, (i, a): (usize, u64), (j, b): (usize, u64)) {
        let s = self.seq.load(Ordering::Relaxed) | 1;
        self.seq.store(s, Ordering::Relaxed);
        fence(Ordering::Release);
        self.words[i].store(a, Ordering::Relaxed);
        self.words[j].store(b, Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Release);
    }

    /// Word `i` as last written by the calling thread (the slot's only writer).
    #[inline]
    pub(super) fn own_word(&self, i: usize) -> u64 {
        self.words[i].load(Ordering::Relaxed)
    }

    /// Claims the slot for writing (several threads may try); returns the odd sequence to pass
    /// to [`Slot::write_claimed`], or `None` while another thread writes it.
    #[inline]
    pub(super) fn claim(&self) -> Option<u64> {
        let s = self.seq.load(Ordering::Relaxed);
        if s & 1 == 1 {
            return None;
        }
        self.seq
            .compare_exchange(s, s + 1, Ordering::Relaxed, Ordering::Relaxed)
            .ok()
            .map(|_| s + 1)
    }

    /// The words as last written by the calling thread (the slot's only writer).
    #[inline]
    pub(super) fn own(&self) -> [u64; N] {
        std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed))
    }

    /// A consistent copy; `None` if writers kept it busy for 50 ms (a writer holds it for a
    /// few nanoseconds per operation; a preempted one for a time slice).
    pub(super) fn read(&self) -> Option<[u64; N]> {
        let mut since: Option<std::time::Instant> = None;
        for i in 0u32.. {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let w = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    return Some(w);
                }
            }
            if i % 64 == 63 {
                let t0 = *since.get_or_insert_with(std::time::Instant::now);
                if t0.elapsed() > Duration::from_millis(50) {
                    return None;
                }
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        None
    }
}
