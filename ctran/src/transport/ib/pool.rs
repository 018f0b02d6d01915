//! Registered staging buffers, kept for reuse: registering memory costs a system call and page
//! pinning on real hardware, far more than the copy it serves, so buffers are taken from and
//! given back to size classes (powers of two from 4 KiB) instead of registered per message.
//! A buffer is given back only once nothing can touch it any more: a send's after its write
//! completed, a receive's after its data was copied out.

use std::collections::HashMap;

use super::backend::IbMemory;

/// Smallest class.
const MIN_BYTES: usize = 4096;

/// Free staging buffers by size class.
#[derive(Debug)]
pub(crate) struct Pool<M> {
    free: HashMap<u32, Vec<M>>,
    cached: usize,
    limit: usize,
}

/// The class of `len` bytes: its size exponent and size.
fn class(len: usize) -> (u32, usize) {
    let size = len.max(MIN_BYTES).next_power_of_two();
    (size.trailing_zeros(), size)
}

impl<M: IbMemory> Pool<M> {
    /// A pool that keeps at most `limit` bytes of free buffers.
    pub(crate) fn new(limit: usize) -> Pool<M> {
        Pool {
            free: HashMap::new(),
            cached: 0,
            limit,
        }
    }

    /// A buffer of at least `len` bytes: a free one of its class, else one `register` makes
    /// (asked for the class's size).
    pub(crate) fn take<E>(
        &mut self,
        len: usize,
        register: impl FnOnce(usize) -> Result<M, E>,
    ) -> Result<M, E> {
        let (c, size) = class(len);
        if let Some(m) = self.free.get_mut(&c).and_then(Vec::pop) {
            self.cached -= size;
            return Ok(m);
        }
        register(size)
    }

    /// Gives a buffer back; it is dropped (deregistered) when the pool is full.
    pub(crate) fn give(&mut self, m: M) {
        let len = usize::try_from(m.local_key().len).unwrap_or(usize::MAX);
        let (c, size) = class(len);
        if size != len || self.cached + size > self.limit {
            return;
        }
        self.cached += size;
        self.free.entry(c).or_default().push(m);
    }

    /// Bytes of free buffers kept.
    #[cfg(test)]
    pub(crate) fn cached(&self) -> usize {
        self.cached
    }
}

#[cfg(test)]
mod tests {
    use ibverbx::soft::{SoftConfig, SoftFabric};

    use super::*;

    #[test]
    fn buffers_are_reused_by_class_and_bounded() {
        let fabric = SoftFabric::new(SoftConfig::default());
        let dev = fabric.device("d");
        let mut pool = Pool::new(16 << 10);
        let mut made = 0;
        let mut reg = |n: usize| {
            made += 1;
            Ok::<_, ()>(dev.register(n))
        };
        let a = pool.take(1, &mut reg).unwrap();
        assert_eq!(a.local_key().len, 4096);
        let key = a.local_key();
        pool.give(a);
        let b = pool.take(4000, &mut reg).unwrap();
        assert_eq!(b.local_key(), key, "the same registration came back");
        let c = pool.take(5000, &mut reg).unwrap();
        assert_eq!(c.local_key().len, 8192);
        let d = pool.take(20 << 10, &mut reg).unwrap();
        pool.give(b);
        pool.give(c);
        pool.give(d); // 32 KiB: over the limit, dropped
        assert_eq!(pool.cached(), 12 << 10);
        assert_eq!(made, 3);
    }
}
