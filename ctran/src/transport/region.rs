//! Memory regions registered for one-sided access (windows): the table a target keeps of its
//! regions, and the key that tells a peer where to write.
//!
//! A [`RemoteKey`] travels between ranks as [`RemoteKey::LEN`] bytes (through an all_gather).
//! It names the communicator, the owner's rank, the region's id and generation, its base address
//! and length, the owner's pid (for cross-memory attach), over RDMA the rkey of the memory
//! registration peers write through, and whether the region is staged (its home is device
//! memory, and a [`RegionSink`] learns of every put and signal, so puts must reach the owner as
//! frames, never by a direct write into the staging). A target never trusts a key it
//! receives back in a frame: it looks the region up by id, compares the generation, and checks
//! that the write fits before touching memory ([`RegionTable::check_put`]).

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use crate::span::Span;

/// Identifies a registered region of this rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionId(pub u32);

/// Where a peer's region is and how to reach it. Plain data; [`RemoteKey::to_bytes`] and
/// [`RemoteKey::from_bytes`] move it between ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteKey {
    /// Identity of the communicator the region belongs to ([`comm_id`] of its name).
    pub comm: u64,
    /// The owner's rank.
    pub rank: u32,
    /// The region's id on its owner.
    pub id: u32,
    /// Its generation: a region id reused after deregistration has a new one.
    pub generation: u32,
    /// The owner's pid (cross-memory attach writes into it).
    pub pid: u32,
    /// Base address in the owner's address space.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// The RDMA remote key of the registration at `base` (the ib transport; 0 elsewhere).
    pub rkey: u32,
    /// `base` is host staging of memory elsewhere (a device): peers send puts as frames that
    /// the owner lands through its [`RegionSink`], never write or read it directly.
    pub staged: bool,
    /// The region's registration with the owner's ib transport, when a communicator routes
    /// peers through ib: puts and signals from those peers go there.
    pub ib: Option<IbRegion>,
}

/// Where the ib transport of a region's owner takes puts into it (its own id, generation and
/// RDMA registration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbRegion {
    /// The region's id in the owner's ib transport.
    pub id: u32,
    /// Its generation there.
    pub generation: u32,
    /// Address of the registration peers RDMA-write into.
    pub base: u64,
    /// Its RDMA remote key.
    pub rkey: u32,
}

impl RemoteKey {
    /// Bytes of a serialised key.
    pub const LEN: usize = 68;
    /// Bytes of a key written before the ib registration was added (read as none).
    pub const LEN_WITHOUT_IB: usize = 48;
    /// Bytes of a key written before the staged flag was added (read as not staged).
    pub const LEN_WITHOUT_FLAGS: usize = 44;
    /// Bytes of a key written before the rkey was added (read as rkey 0).
    pub const LEN_WITHOUT_RKEY: usize = 40;

    /// The key as bytes (little-endian fields).
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.comm.to_le_bytes());
        b[8..12].copy_from_slice(&self.rank.to_le_bytes());
        b[12..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..20].copy_from_slice(&self.generation.to_le_bytes());
        b[20..24].copy_from_slice(&self.pid.to_le_bytes());
        b[24..32].copy_from_slice(&self.base.to_le_bytes());
        b[32..40].copy_from_slice(&self.len.to_le_bytes());
        b[40..44].copy_from_slice(&self.rkey.to_le_bytes());
        let flags = u32::from(self.staged) | u32::from(self.ib.is_some()) << 1;
        b[44..48].copy_from_slice(&flags.to_le_bytes());
        if let Some(ib) = self.ib {
            b[48..52].copy_from_slice(&ib.id.to_le_bytes());
            b[52..56].copy_from_slice(&ib.generation.to_le_bytes());
            b[56..64].copy_from_slice(&ib.base.to_le_bytes());
            b[64..68].copy_from_slice(&ib.rkey.to_le_bytes());
        }
        b
    }

    /// A key from the bytes [`RemoteKey::to_bytes`] wrote (or the 48, 44 or 40 bytes of a key
    /// written before the ib registration, the flags or the rkey); `None` when the length is
    /// wrong.
    pub fn from_bytes(b: &[u8]) -> Option<RemoteKey> {
        let lens = [
            Self::LEN,
            Self::LEN_WITHOUT_IB,
            Self::LEN_WITHOUT_FLAGS,
            Self::LEN_WITHOUT_RKEY,
        ];
        if !lens.contains(&b.len()) {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Some(RemoteKey {
            comm: u64_at(0),
            rank: u32_at(8),
            id: u32_at(12),
            generation: u32_at(16),
            pid: u32_at(20),
            base: u64_at(24),
            len: u64_at(32),
            rkey: if b.len() >= Self::LEN_WITHOUT_FLAGS {
                u32_at(40)
            } else {
                0
            },
            staged: b.len() >= Self::LEN_WITHOUT_IB && u32_at(44) & 1 == 1,
            ib: (b.len() == Self::LEN && u32_at(44) & 2 == 2).then(|| IbRegion {
                id: u32_at(48),
                generation: u32_at(52),
                base: u64_at(56),
                rkey: u32_at(64),
            }),
        })
    }

    /// The part of `ib_key` (a key the owner's ib transport gave) that the region's key
    /// carries: the inverse of [`RemoteKey::ib_key`].
    pub fn ib_region_of(ib_key: &RemoteKey) -> IbRegion {
        IbRegion {
            id: ib_key.id,
            generation: ib_key.generation,
            base: ib_key.base,
            rkey: ib_key.rkey,
        }
    }

    /// The key the owner's ib transport gave the region, when it has one.
    pub fn ib_key(&self) -> Option<RemoteKey> {
        self.ib.map(|ib| RemoteKey {
            id: ib.id,
            generation: ib.generation,
            base: ib.base,
            rkey: ib.rkey,
            ib: None,
            ..*self
        })
    }

    /// The id and generation as one word (what put and signal frames carry).
    pub fn region_word(&self) -> u64 {
        (u64::from(self.id) << 32) | u64::from(self.generation)
    }

    /// Checks that `len` bytes at `offset` fit in the region; the error names both.
    pub fn check_fits(&self, offset: u64, len: u64) -> Result<(), String> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(format!(
                "a write of {len} bytes at offset {offset} exceeds the region of {} bytes on \
                 rank {}",
                self.len, self.rank
            )),
        }
    }
}

/// The identity of a communicator in keys: a stable hash of its name.
pub fn comm_id(name: &str) -> u64 {
    crate::comm::stable_hash::StableHasher::new()
        .str("window")
        .str(name)
        .finish()
}

/// What a signal frame asks of its target region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalKind {
    /// Adds to the counter the target keeps for the sender.
    Signal,
    /// Adds to the sender's fence counter (deregistration: the sender's earlier puts and
    /// signals to this region arrived).
    Fence,
}

/// What a staged region tells its owner: puts land in the region's host span, and the sink
/// learns which bytes each peer put and which of its signals cover them, in the order the
/// peer's frames arrived (the owner later moves the covered bytes home, device memory).
/// Called on the progress thread; implementations only record.
pub trait RegionSink: Send + Sync + Debug {
    /// `peer` put `len` bytes at byte `offset` of the span (every byte is in).
    fn landed(&self, peer: usize, offset: usize, len: usize);
    /// A signal of `add` from `peer` was applied: it covers every put of that peer before it.
    fn signalled(&self, peer: usize, add: u64);
}

/// A put into a staged region, to report to the sink once its last byte is in.
#[derive(Debug, Clone)]
pub struct Landing {
    sink: Arc<dyn RegionSink>,
    offset: usize,
    len: usize,
}

impl Landing {
    /// Reports the put (from `peer`) to the sink.
    pub fn land(&self, peer: usize) {
        self.sink.landed(peer, self.offset, self.len);
    }
}

/// Where a checked put's bytes go: `dst`, then through `landing` when the region is staged.
#[derive(Debug)]
pub struct PutTarget {
    /// Inside the registered span.
    pub dst: Span,
    /// Present for a staged region.
    pub landing: Option<Landing>,
}

#[derive(Debug)]
struct Region {
    generation: u32,
    span: Span,
    sink: Option<Arc<dyn RegionSink>>,
    /// Per peer: signals received from it.
    signals: Vec<u64>,
    /// Per peer: fences received from it.
    fences: Vec<u64>,
}

/// The regions this rank registered, with their signal counters.
#[derive(Debug)]
pub struct RegionTable {
    ranks: usize,
    next_id: u32,
    next_generation: u32,
    regions: HashMap<u32, Region>,
}

impl RegionTable {
    /// An empty table for a communicator of `ranks` ranks.
    pub fn new(ranks: usize) -> RegionTable {
        RegionTable {
            ranks,
            next_id: 1,
            next_generation: 1,
            regions: HashMap::new(),
        }
    }

    /// Registers `span` (staged through `sink` when given); returns its id and generation. The
    /// memory must stay valid until it is removed.
    pub fn register(&mut self, span: Span, sink: Option<Arc<dyn RegionSink>>) -> (RegionId, u32) {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        self.regions.insert(
            id,
            Region {
                generation,
                span,
                sink,
                signals: vec![0; self.ranks],
                fences: vec![0; self.ranks],
            },
        );
        (RegionId(id), generation)
    }

    /// Forgets a region; later frames naming it are refused.
    pub fn remove(&mut self, id: RegionId) -> bool {
        self.regions.remove(&id.0).is_some()
    }

    /// Whether any region is registered (the progress thread then keeps reading while idle).
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// The signal and fence counts region `id` keeps for `peer`.
    pub fn counters(&self, id: RegionId, peer: usize) -> Option<(u64, u64)> {
        let r = self.regions.get(&id.0)?;
        Some((*r.signals.get(peer)?, *r.fences.get(peer)?))
    }

    fn lookup(&mut self, word: u64) -> Result<&mut Region, String> {
        let (id, generation) = ((word >> 32) as u32, word as u32);
        match self.regions.get_mut(&id) {
            None => Err(format!(
                "region {id} (generation {generation}) is not registered here (never, or \
                 deregistered)"
            )),
            Some(r) if r.generation != generation => Err(format!(
                "region {id} has generation {} here, the frame names the stale generation \
                 {generation}",
                r.generation
            )),
            Some(r) => Ok(r),
        }
    }

    /// Where a put of `len` bytes at `offset` into the region `word` names lands: checked
    /// against the registered region (exists, same generation, fits) before any byte is
    /// written. The error says why it was refused.
    pub fn check_put(&mut self, word: u64, offset: u64, len: u64) -> Result<PutTarget, String> {
        let r = self.lookup(word)?;
        let size = r.span.len() as u64;
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(PutTarget {
                dst: r.span.sub(offset as usize, len as usize),
                landing: r.sink.as_ref().map(|sink| Landing {
                    sink: Arc::clone(sink),
                    offset: offset as usize,
                    len: len as usize,
                }),
            }),
            _ => Err(format!(
                "a put of {len} bytes at offset {offset} exceeds region {} of {size} bytes",
                word >> 32
            )),
        }
    }

    /// Applies a signal or fence from `peer` to the region `word` names.
    pub fn apply_signal(
        &mut self,
        word: u64,
        peer: usize,
        kind: SignalKind,
        add: u64,
    ) -> Result<(), String> {
        let r = self.lookup(word)?;
        let counters = match kind {
            SignalKind::Signal => &mut r.signals,
            SignalKind::Fence => &mut r.fences,
        };
        let c = counters
            .get_mut(peer)
            .ok_or_else(|| format!("no counter for rank {peer}"))?;
        *c = c.wrapping_add(add);
        if let (SignalKind::Signal, Some(sink)) = (kind, &r.sink) {
            sink.signalled(peer, add);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_survives_its_bytes() {
        let k = RemoteKey {
            comm: 1 << 40,
            rank: 3,
            id: 7,
            generation: 9,
            pid: 1234,
            base: 0xdead_beef_0000,
            len: 4096,
            rkey: 0x1234,
            staged: true,
            ib: Some(IbRegion {
                id: 2,
                generation: 4,
                base: 0x10_0000_0000,
                rkey: 0x77,
            }),
        };
        assert_eq!(RemoteKey::from_bytes(&k.to_bytes()), Some(k));
        let ib = k.ib_key().unwrap();
        assert_eq!(
            (ib.id, ib.generation, ib.base, ib.rkey),
            (2, 4, 0x10_0000_0000, 0x77)
        );
        assert_eq!(
            (ib.comm, ib.rank, ib.len, ib.ib),
            (k.comm, k.rank, k.len, None)
        );
        let k = RemoteKey { ib: None, ..k };
        assert_eq!(RemoteKey::from_bytes(&k.to_bytes()), Some(k));
        let no_ib = RemoteKey::from_bytes(&k.to_bytes()[..RemoteKey::LEN_WITHOUT_IB]).unwrap();
        assert_eq!(no_ib, k);
        let no_flags =
            RemoteKey::from_bytes(&k.to_bytes()[..RemoteKey::LEN_WITHOUT_FLAGS]).unwrap();
        assert_eq!(no_flags, RemoteKey { staged: false, ..k });
        let old = RemoteKey::from_bytes(&k.to_bytes()[..RemoteKey::LEN_WITHOUT_RKEY]).unwrap();
        assert_eq!(
            old,
            RemoteKey {
                rkey: 0,
                staged: false,
                ..k
            }
        );
        assert_eq!(RemoteKey::from_bytes(&[0; 3]), None);
    }

    #[test]
    fn puts_are_checked_before_they_land() {
        let mut buf = vec![0u8; 64];
        // SAFETY: `buf` outlives the table's use of the span in this test.
        let span = unsafe { Span::from_slice(&mut buf) };
        let mut t = RegionTable::new(2);
        let (id, generation) = t.register(span, None);
        let word = (u64::from(id.0) << 32) | u64::from(generation);
        assert!(t.check_put(word, 60, 4).is_ok_and(|p| p.landing.is_none()));
        assert!(t.check_put(word, 61, 4).unwrap_err().contains("exceeds"));
        assert!(t
            .check_put(word, u64::MAX, 2)
            .unwrap_err()
            .contains("exceeds"));
        assert!(t.check_put(word + 1, 0, 1).unwrap_err().contains("stale"));
        t.apply_signal(word, 1, SignalKind::Signal, 2).unwrap();
        assert_eq!(t.counters(id, 1), Some((2, 0)));
        assert!(t.remove(id));
        assert!(t
            .check_put(word, 0, 1)
            .unwrap_err()
            .contains("not registered"));
    }

    #[derive(Debug, Default)]
    struct Recorder(std::sync::Mutex<Vec<(usize, usize, usize)>>);

    impl RegionSink for Recorder {
        fn landed(&self, peer: usize, offset: usize, len: usize) {
            self.0.lock().unwrap().push((peer, offset, len));
        }
        fn signalled(&self, peer: usize, add: u64) {
            self.0
                .lock()
                .unwrap()
                .push((peer, usize::MAX, add as usize));
        }
    }

    #[test]
    fn a_staged_region_reports_puts_and_signals_to_its_sink() {
        let mut buf = vec![0u8; 64];
        // SAFETY: `buf` outlives the table's use of the span in this test.
        let span = unsafe { Span::from_slice(&mut buf) };
        let sink = Arc::new(Recorder::default());
        let mut t = RegionTable::new(2);
        let (id, generation) = t.register(span, Some(sink.clone() as Arc<dyn RegionSink>));
        let word = (u64::from(id.0) << 32) | u64::from(generation);
        let put = t.check_put(word, 8, 16).unwrap();
        assert_eq!((put.dst.addr(), put.dst.len()), (span.addr() + 8, 16));
        put.landing.expect("staged").land(1);
        assert!(t.check_put(word, 60, 8).is_err());
        t.apply_signal(word, 1, SignalKind::Signal, 1).unwrap();
        t.apply_signal(word, 1, SignalKind::Fence, 1).unwrap();
        assert_eq!(
            *sink.0.lock().unwrap(),
            vec![(1, 8, 16), (1, usize::MAX, 1)],
            "a refused put and a fence report nothing"
        );
    }
}
