//! Pinned staging for the GPE: one ring of `capacity` bytes per communicator, allocated at the
//! first operation, from which operations take their staging in issue order and give it back
//! when their device copies have run.
//!
//! Why a ring: `cuMemHostAlloc` costs hundreds of microseconds (too slow for a host thread that
//! must issue 100 async ops in milliseconds), and `cuMemFreeHost` waits for the device, which
//! could wait for the GPE thread itself. Operations larger than the ring get a buffer of their
//! own, kept for reuse and freed only when the engine stops (after its stream is idle).
//!
//! Where the communicator uses ib, every staging buffer is registered with it when allocated
//! (and deregistered before it is freed): the NIC then reads and writes the staging itself,
//! without the ib transport's own copies.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use crate::comm::Comm;
use crate::cuda::error::Result;
use crate::cuda::{Context, PinnedBuffer};
use crate::span::Span;
use crate::transport::ib::UserDevice;

/// Ring allocations are rounded to this (keeps DMA transfers aligned).
const ALIGN: usize = 4096;

/// Staging of one operation.
#[derive(Debug)]
pub(crate) enum Staging {
    /// `len` bytes at `offset` of the ring.
    Ring { ptr: *mut u8, offset: usize },
    /// A buffer of its own (larger than the ring).
    Own(PinnedBuffer),
}

// SAFETY: a ring slice is plain pinned memory owned by the pool, which outlives every Staging
// (the GPE holds both); only the operation that took it uses it.
unsafe impl Send for Staging {}

impl Staging {
    /// Host address of the staging.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        match self {
            Staging::Ring { ptr, .. } => *ptr,
            Staging::Own(b) => b.as_ptr(),
        }
    }
}

#[derive(Debug, Default)]
struct Ring {
    /// End of the newest allocation.
    head: usize,
    /// Allocations in issue order: (offset, rounded length, released).
    live: VecDeque<(usize, usize, bool)>,
    /// Buffers of operations larger than the ring, idle.
    spare: Vec<PinnedBuffer>,
}

#[derive(Debug)]
pub(crate) struct StagingPool {
    ctx: Arc<Context>,
    capacity: usize,
    ring: Mutex<Option<PinnedBuffer>>,
    state: Mutex<Ring>,
    freed: Condvar,
    /// The communicator whose transports the buffers are registered with (a no-op unless it
    /// uses ib).
    comm: Arc<Comm>,
    /// The buffers registered with it.
    registered: Mutex<Vec<Span>>,
}

impl StagingPool {
    pub(crate) fn new(ctx: &Arc<Context>, capacity: usize, comm: &Arc<Comm>) -> StagingPool {
        StagingPool {
            ctx: Arc::clone(ctx),
            capacity: capacity.div_ceil(ALIGN) * ALIGN,
            ring: Mutex::new(None),
            state: Mutex::new(Ring::default()),
            freed: Condvar::new(),
            comm: Arc::clone(comm),
            registered: Mutex::new(Vec::new()),
        }
    }

    fn ring_base(&self) -> Result<*mut u8> {
        let mut r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_none() {
            let ring = PinnedBuffer::alloc(&self.ctx, self.capacity)?;
            self.register(&ring);
            *r = Some(ring);
        }
        Ok(r.as_ref()
            .map_or(std::ptr::null_mut(), PinnedBuffer::as_ptr))
    }

    /// A buffer of its own for an operation larger than the ring.
    fn alloc_own(&self, bytes: usize) -> Result<PinnedBuffer> {
        let b = PinnedBuffer::alloc(&self.ctx, bytes)?;
        self.register(&b);
        Ok(b)
    }

    /// Registers `b` with the communicator's ib transport, if it has one. Failing leaves the
    /// transfers staged by the transport, as before.
    fn register(&self, b: &PinnedBuffer) {
        let comm = &self.comm;
        // SAFETY: the buffer is pinned host memory that lives until this pool deregisters it
        // (Drop), or longer: an operation that could not finish leaks its buffer.
        let span = unsafe { Span::from_raw(b.as_ptr(), b.len()) };
        // SAFETY: as above: deregistered before it is freed.
        match unsafe { comm.register_buffer(span, UserDevice::Host) } {
            Ok(true) => self
                .registered
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(span),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                rank = comm.rank(),
                "GPE staging of {} B stays copied by the ib transport: {e}",
                b.len()
            ),
        }
    }

    /// Staging of `bytes`, waiting until `deadline` for earlier operations to give theirs
    /// back; `Ok(None)` when the deadline passed.
    pub(crate) fn take(&self, bytes: usize, deadline: Instant) -> Result<Option<Staging>> {
        let n = bytes.max(1).div_ceil(ALIGN) * ALIGN;
        if n > self.capacity {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = st.spare.iter().position(|b| b.len() >= bytes) {
                return Ok(Some(Staging::Own(st.spare.swap_remove(i))));
            }
            drop(st);
            return self.alloc_own(bytes).map(|b| Some(Staging::Own(b)));
        }
        let base = self.ring_base()?;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(offset) = Self::fit(&mut st, n, self.capacity) {
                st.live.push_back((offset, n, false));
                st.head = offset + n;
                // SAFETY: offset + n <= capacity, within the ring buffer.
                let ptr = unsafe { base.add(offset) };
                return Ok(Some(Staging::Ring { ptr, offset }));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            st = self
                .freed
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Where `n` bytes fit after the newest allocation, wrapping to the start if needed.
    fn fit(st: &mut Ring, n: usize, cap: usize) -> Option<usize> {
        let Some(&(tail, _, _)) = st.live.front() else {
            st.head = 0;
            return (n <= cap).then_some(0);
        };
        if st.head > tail {
            if cap - st.head >= n {
                return Some(st.head);
            }
            return (tail >= n).then_some(0);
        }
        (tail - st.head >= n).then_some(st.head)
    }

    /// Gives staging back (its device copies have run).
    pub(crate) fn give(&self, s: Staging) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match s {
            Staging::Own(b) => st.spare.push(b),
            Staging::Ring { offset, .. } => {
                if let Some(e) = st.live.iter_mut().find(|e| e.0 == offset && !e.2) {
                    e.2 = true;
                }
                while st.live.front().is_some_and(|e| e.2) {
                    st.live.pop_front();
                }
            }
        }
        self.freed.notify_all();
    }
}

impl Drop for StagingPool {
    fn drop(&mut self) {
        // Before the buffers are freed (the fields drop after this).
        for span in self
            .registered
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            self.comm.deregister_buffer(span);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_fits_wrap_and_fill() {
        let cap = 10 * ALIGN;
        let mut r = Ring::default();
        let take = |r: &mut Ring, n: usize| {
            let o = StagingPool::fit(r, n * ALIGN, cap)?;
            r.live.push_back((o, n * ALIGN, false));
            r.head = o + n * ALIGN;
            Some(o / ALIGN)
        };
        assert_eq!(take(&mut r, 4), Some(0));
        assert_eq!(take(&mut r, 4), Some(4));
        assert_eq!(
            take(&mut r, 3),
            None,
            "only 2 left at the end, nothing before the tail"
        );
        r.live.pop_front(); // the first is given back
        assert_eq!(take(&mut r, 3), Some(0), "wraps to the start");
        assert_eq!(take(&mut r, 2), None, "1 left before the tail at 4");
        assert_eq!(take(&mut r, 1), Some(3));
        r.live.clear();
        assert_eq!(
            take(&mut r, 10),
            Some(0),
            "empty: everything from the start"
        );
        assert_eq!(take(&mut r, 1), None, "full");
    }
}
