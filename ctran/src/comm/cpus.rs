//! The CPUs a rank may run on, exchanged at creation so that a host's cores are counted as the
//! union of its ranks' CPU sets.
//!
//! Each rank alone sees only its own affinity mask: ranks that `mpirun --bind-to core`,
//! `srun --cpu-bind` or `torchcomms-perf --bind` placed on one core each would each count a
//! single core, turn spinning off and tell the cost model that all local ranks share one core:
//! on 2 ranks of 2 cores, bound that way, an 8-byte all_reduce takes about three times as long
//! as with the cores counted right.
//!
//! A CPU quota (a container's `cpu.max`) can allow fewer cores than the masks name: a rank whose
//! `available_parallelism()` is below the size of its mask reports that as a limit, and the
//! host's cores are never more than the smallest limit.

use nix::sched::{sched_getaffinity, CpuSet as NixCpuSet};
use nix::unistd::Pid;

/// CPUs the encoding covers (`CPU_SETSIZE`, the kernel's default limit).
const MAX_CPUS: usize = 1024;
const WORDS: usize = MAX_CPUS / 64;
/// Bytes of [`CpuSet::to_bytes`].
const CPU_SET_BYTES: usize = WORDS * 8;
/// Bytes of [`RankCpus::to_bytes`].
pub(crate) const RANK_CPUS_BYTES: usize = CPU_SET_BYTES + 8;

/// A set of CPU numbers below [`MAX_CPUS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CpuSet {
    words: [u64; WORDS],
}

impl CpuSet {
    /// The empty set.
    pub(crate) const EMPTY: CpuSet = CpuSet { words: [0; WORDS] };

    /// The CPUs the calling thread may run on (the threads it starts inherit them). Where the
    /// mask cannot be read, CPUs `0..available_parallelism()`.
    pub(crate) fn of_this_thread() -> CpuSet {
        let mut set = CpuSet::EMPTY;
        match sched_getaffinity(Pid::from_raw(0)) {
            Ok(mask) => {
                for cpu in 0..NixCpuSet::count().min(MAX_CPUS) {
                    if mask.is_set(cpu).unwrap_or(false) {
                        set.insert(cpu);
                    }
                }
            }
            Err(e) => tracing::debug!("sched_getaffinity failed ({e}); counting available cores"),
        }
        if set == CpuSet::EMPTY {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..n.min(MAX_CPUS)).for_each(|cpu| set.insert(cpu));
        }
        set
    }

    /// Adds `cpu` (ignored at or above [`MAX_CPUS`]).
    pub(crate) fn insert(&mut self, cpu: usize) {
        if cpu < MAX_CPUS {
            self.words[cpu / 64] |= 1 << (cpu % 64);
        }
    }

    /// The CPUs in either set.
    pub(crate) fn union(mut self, other: &CpuSet) -> CpuSet {
        for (w, o) in self.words.iter_mut().zip(other.words) {
            *w |= o;
        }
        self
    }

    /// How many CPUs the set holds.
    pub(crate) fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Little-endian bitmap of [`CPU_SET_BYTES`] bytes.
    fn to_bytes(self) -> [u8; CPU_SET_BYTES] {
        let mut b = [0u8; CPU_SET_BYTES];
        for (chunk, w) in b.chunks_exact_mut(8).zip(self.words) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// The set [`to_bytes`](Self::to_bytes) encoded; `None` unless `b` has its length.
    fn from_bytes(b: &[u8]) -> Option<CpuSet> {
        if b.len() != CPU_SET_BYTES {
            return None;
        }
        let mut set = CpuSet::EMPTY;
        for (w, chunk) in set.words.iter_mut().zip(b.chunks_exact(8)) {
            *w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        }
        Some(set)
    }
}

/// What a rank tells the others about the cores it may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RankCpus {
    /// Its CPU affinity mask.
    pub(crate) set: CpuSet,
    /// Cores a quota allows it, where fewer than its mask names.
    pub(crate) quota: Option<usize>,
}

impl RankCpus {
    /// This thread's CPUs (the progress thread it starts inherits them).
    pub(crate) fn of_this_thread() -> RankCpus {
        let set = CpuSet::of_this_thread();
        let usable = std::thread::available_parallelism().map_or(1, |n| n.get());
        RankCpus {
            set,
            quota: (usable < set.count()).then_some(usable),
        }
    }

    /// The set's bitmap, then the quota (0: none), little-endian.
    pub(crate) fn to_bytes(self) -> [u8; RANK_CPUS_BYTES] {
        let mut b = [0u8; RANK_CPUS_BYTES];
        b[..CPU_SET_BYTES].copy_from_slice(&self.set.to_bytes());
        b[CPU_SET_BYTES..].copy_from_slice(&(self.quota.unwrap_or(0) as u64).to_le_bytes());
        b
    }

    /// What [`to_bytes`](Self::to_bytes) encoded; `None` unless `b` has its length.
    pub(crate) fn from_bytes(b: &[u8]) -> Option<RankCpus> {
        if b.len() != RANK_CPUS_BYTES {
            return None;
        }
        let quota = u64::from_le_bytes(b[CPU_SET_BYTES..].try_into().expect("8 bytes"));
        Some(RankCpus {
            set: CpuSet::from_bytes(&b[..CPU_SET_BYTES])?,
            quota: (quota > 0).then_some(quota as usize),
        })
    }
}

/// Cores that ranks of one host with `ranks` share: the union of their CPU sets, within every
/// quota, at least 1.
pub(crate) fn host_cores<'a>(ranks: impl IntoIterator<Item = &'a RankCpus>) -> usize {
    let (union, quota) = ranks
        .into_iter()
        .fold((CpuSet::EMPTY, usize::MAX), |(set, quota), r| {
            (set.union(&r.set), quota.min(r.quota.unwrap_or(usize::MAX)))
        });
    union.count().min(quota).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(cpus: &[usize]) -> CpuSet {
        let mut s = CpuSet::EMPTY;
        cpus.iter().for_each(|&c| s.insert(c));
        s
    }

    fn rank(cpus: &[usize], quota: Option<usize>) -> RankCpus {
        RankCpus {
            set: set(cpus),
            quota,
        }
    }

    #[test]
    fn ranks_bound_to_one_core_each_count_the_union() {
        let bound = [0, 1, 0, 1].map(|c| rank(&[c], None));
        assert_eq!(host_cores(&bound), 2);
        assert_eq!(
            host_cores(&[rank(&[0, 1, 2, 3], None), rank(&[2, 3, 4], None)]),
            5
        );
        assert_eq!(host_cores(&[rank(&[5, 70, 1023], None)]), 3);
        assert_eq!(host_cores(&[rank(&[], None)]), 1, "never zero cores");
    }

    #[test]
    fn a_quota_caps_the_union() {
        let wide = [rank(&[0, 1, 2, 3], Some(2)), rank(&[0, 1, 2, 3], Some(2))];
        assert_eq!(host_cores(&wide), 2);
        assert_eq!(
            host_cores(&[rank(&[0], None), rank(&[1, 2, 3], Some(1))]),
            1
        );
    }

    #[test]
    fn bytes_round_trip() {
        for r in [rank(&[0, 63, 64, 511, 1023], None), rank(&[3], Some(7))] {
            assert_eq!(RankCpus::from_bytes(&r.to_bytes()), Some(r));
        }
        assert_eq!(RankCpus::from_bytes(&[0u8; 8]), None);
        assert_eq!(set(&[1024]), CpuSet::EMPTY, "beyond the encoding: ignored");
    }
}
