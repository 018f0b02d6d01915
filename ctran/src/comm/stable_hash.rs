//! Hashes that processes compare with each other (host identity, shared-memory names, the
//! arguments ranks must agree on). `std`'s `DefaultHasher` is not specified and may change
//! between Rust versions or builds, so two ranks built apart could disagree on the same input;
//! this one is SHA-256 over an explicit encoding of the values, the same on every build.

use sha2::{Digest, Sha256};

/// Builds a stable 64-bit hash from values fed in order. Each value is written with an explicit,
/// fixed encoding: byte strings prefixed by their length, integers as 8 little-endian bytes, so
/// that `("ab", "c")` and `("a", "bc")` differ.
#[derive(Debug, Clone, Default)]
#[must_use = "finish() gives the hash"]
pub(crate) struct StableHasher(Sha256);

impl StableHasher {
    /// An empty hasher.
    pub(crate) fn new() -> StableHasher {
        StableHasher::default()
    }

    /// Feeds a byte string (its length first).
    pub(crate) fn bytes(mut self, b: &[u8]) -> StableHasher {
        self = self.u64(b.len() as u64);
        self.0.update(b);
        self
    }

    /// Feeds a string, as its UTF-8 bytes.
    pub(crate) fn str(self, s: &str) -> StableHasher {
        self.bytes(s.as_bytes())
    }

    /// Feeds an integer.
    pub(crate) fn u64(mut self, x: u64) -> StableHasher {
        self.0.update(x.to_le_bytes());
        self
    }

    /// Feeds a list of integers (its length first).
    pub(crate) fn usizes(mut self, v: &[usize]) -> StableHasher {
        self = self.u64(v.len() as u64);
        for &x in v {
            self = self.u64(x as u64);
        }
        self
    }

    /// The first 8 bytes of the digest, little-endian.
    pub(crate) fn finish(self) -> u64 {
        let d = self.0.finalize();
        u64::from_le_bytes(d[..8].try_into().expect("a SHA-256 digest has 32 bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::StableHasher;

    #[test]
    fn the_encoding_is_fixed_and_separates_values() {
        let h = |a: &str, b: &str| StableHasher::new().str(a).str(b).finish();
        assert_ne!(h("ab", "c"), h("a", "bc"));
        assert_eq!(h("ab", "c"), h("ab", "c"));
        // Pinned (SHA-256 of the encoding, computed independently): a change of encoding would
        // make ranks of different builds disagree.
        assert_eq!(
            StableHasher::new().usizes(&[0, 1]).str("world").finish(),
            0x4b79_76b8_c9da_36bf
        );
    }
}
