//! Raw views of caller memory. Collectives work on buffers owned by the caller (a tensor, a C
//! pointer); the layer above keeps them alive until the operation completes. All pointer
//! arithmetic and reinterpretation of that memory lives here, behind bounds checks.

use std::fmt;

/// A region of `len` bytes at `ptr`, owned by someone else. Copyable so algorithms can pass
/// sub-ranges around; regions of different spans may overlap (in-place collectives), so spans
/// never hand out long-lived references.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Span {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a Span is an address range; whoever created it (through the unsafe `from_raw`)
// promised the memory stays valid and is not accessed by others while an operation uses it,
// which is what moving it to the progress thread requires.
unsafe impl Send for Span {}
// SAFETY: as above; shared access only reads the address and length.
unsafe impl Sync for Span {}

impl fmt::Debug for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Span({:p}, {} B)", self.ptr, self.len)
    }
}

impl Span {
    /// An empty span.
    pub const EMPTY: Span = Span {
        ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
        len: 0,
    };

    /// Wraps `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes from this call until every
    /// operation given this span (or a sub-span) has completed, and nothing else may write it
    /// meanwhile. `ptr` may be null only when `len` is 0.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Span {
        if len == 0 {
            return Span::EMPTY;
        }
        Span { ptr, len }
    }

    /// A span over a mutable slice. The borrow ends when this call returns, so the caller must
    /// itself keep the slice untouched until the operation using the span has completed.
    ///
    /// # Safety
    /// As for [`Span::from_raw`].
    pub unsafe fn from_slice(slice: &mut [u8]) -> Span {
        // SAFETY: forwarded to the caller.
        unsafe { Span::from_raw(slice.as_mut_ptr(), slice.len()) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the span has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start address (for overlap checks and logs).
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    /// The sub-range `[offset, offset + len)`. Panics when out of bounds: algorithms compute
    /// ranges from validated sizes, so a violation is a bug in the engine, not bad input.
    #[track_caller]
    pub fn sub(&self, offset: usize, len: usize) -> Span {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "sub-span [{offset}, +{len}) out of a span of {} bytes",
            self.len
        );
        if len == 0 {
            return Span::EMPTY;
        }
        // SAFETY: offset + len <= self.len, so the result stays inside the original region.
        let ptr = unsafe { self.ptr.add(offset) };
        Span { ptr, len }
    }

    /// True when the two spans share at least one byte.
    pub fn overlaps(&self, other: &Span) -> bool {
        !self.is_empty()
            && !other.is_empty()
            && self.addr() < other.addr() + other.len
            && other.addr() < self.addr() + self.len
    }

    /// Copies all of `src` into the start of `self` (memmove semantics: overlap is fine).
    #[track_caller]
    pub fn copy_from(&self, src: &Span) {
        assert!(
            src.len <= self.len,
            "copy of {} B into a span of {} B",
            src.len,
            self.len
        );
        if src.len == 0 || src.ptr == self.ptr {
            return;
        }
        // SAFETY: both regions are valid for src.len bytes (constructor contract and the
        // assert above); `copy` allows overlap.
        unsafe { std::ptr::copy(src.ptr, self.ptr, src.len) }
    }

    /// Copies the span's bytes into `dst` (same length).
    #[track_caller]
    pub fn copy_to_slice(&self, dst: &mut [u8]) {
        assert_eq!(dst.len(), self.len);
        if self.len == 0 {
            return;
        }
        // SAFETY: the span is valid for len bytes; dst is a distinct Rust slice of len bytes.
        unsafe { std::ptr::copy(self.ptr, dst.as_mut_ptr(), self.len) }
    }

    /// Copies `src` into the start of the span.
    #[track_caller]
    pub fn copy_from_slice(&self, src: &[u8]) {
        assert!(src.len() <= self.len);
        if src.is_empty() {
            return;
        }
        // SAFETY: the span is valid for len >= src.len() bytes; copy allows overlap.
        unsafe { std::ptr::copy(src.as_ptr(), self.ptr, src.len()) }
    }

    /// Raw pointer for transports that hand the region to the OS (send/recv, memcpy).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Borrows the bytes for reading for the duration of `f`.
    ///
    /// # Safety
    /// No one may write the region while `f` runs (other spans included).
    pub unsafe fn with_slice<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        if self.len == 0 {
            return f(&[]);
        }
        // SAFETY: valid for len bytes (constructor contract); no writer during `f` (caller).
        f(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }

    /// Borrows the bytes of every span of `spans` for reading for the duration of `f`.
    ///
    /// # Safety
    /// No one may write any of the regions while `f` runs (other spans included).
    pub unsafe fn with_slices<R>(spans: &[Span], f: impl FnOnce(&[&[u8]]) -> R) -> R {
        let slices: Vec<&[u8]> = spans
            .iter()
            .map(|s| match s.len {
                0 => &[][..],
                // SAFETY: valid for len bytes (constructor contract); no writer during `f`
                // (caller).
                len => unsafe { std::slice::from_raw_parts(s.ptr, len) },
            })
            .collect();
        f(&slices)
    }

    /// Borrows the bytes for writing for the duration of `f`.
    ///
    /// # Safety
    /// No one else may read or write the region while `f` runs (other spans included).
    pub unsafe fn with_mut_slice<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        if self.len == 0 {
            return f(&mut []);
        }
        // SAFETY: valid for len bytes (constructor contract); exclusive during `f` (caller).
        f(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_and_overlap() {
        let mut v = vec![0u8; 16];
        // SAFETY: v outlives the spans and is only touched through them.
        let s = unsafe { Span::from_slice(&mut v) };
        let a = s.sub(0, 8);
        let b = s.sub(8, 8);
        assert!(!a.overlaps(&b));
        assert!(s.overlaps(&b));
        b.copy_from_slice(&[7; 8]);
        a.copy_from(&b);
        assert_eq!(v, vec![7u8; 16]);
        assert!(Span::EMPTY.sub(0, 0).is_empty());
    }

    #[test]
    #[should_panic(expected = "out of a span")]
    fn sub_out_of_bounds_panics() {
        let mut v = vec![0u8; 4];
        // SAFETY: v outlives the span.
        let s = unsafe { Span::from_slice(&mut v) };
        let _ = s.sub(2, 3);
    }
}
