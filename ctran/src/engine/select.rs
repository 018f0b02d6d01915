//! Which code runs an operation: the one selector every operation goes through.
//!
//! An operation on CUDA buffers is tried on the device paths of its communicator in order
//! ([`device_paths`]): NVLink where every rank's GPU reaches every other's, the mixed
//! NVLink+TCP plan where the ranks sit on several hosts with NVLink inside each, and the GPU
//! progress engine, which takes anything. A path may decline an operation it has no form for
//! (the same on every rank), and the next one runs it. Host operations, and the host steps the
//! GPU progress engine submits, run on the communicator's progress thread, which asks
//! [`host_path`]: the transfers of point-to-point, a shared-memory collective when every rank is
//! on this host, or an algorithm over the transport contract (explicit or the cost model's).
//! `docs/ARCHITECTURE.md` has the table of which path runs which operation.

use crate::algos::select::{Choice, Pick, Selector};
use crate::algos::Algo;
use crate::comm::Op;

/// A way the engine runs an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Kernels on peer GPU memory over NVLink ([`crate::nvl`]).
    Nvl,
    /// NVLink inside each host, TCP between hosts ([`crate::mixed`]).
    Mixed,
    /// Device buffers staged through pinned host memory, run on the host transports in stream
    /// order ([`crate::gpe`]).
    Gpe,
    /// Sends and receives posted to the transport and kept in flight across later operations
    /// ([`crate::algos::post_p2p`]).
    P2p,
    /// A collective over the shared-memory segment of one host ([`crate::shm_collectives`]).
    ShmCollective,
    /// An algorithm over the transport contract ([`crate::algos`]); `None` for the collective's
    /// default.
    Algorithm(Option<Algo>),
}

impl Path {
    /// The path's name in traces and logs.
    pub fn name(self) -> &'static str {
        match self {
            Path::Nvl => "nvl",
            Path::Mixed => "mixed",
            Path::Gpe => "gpe",
            Path::P2p => "p2p",
            Path::ShmCollective => "shm",
            Path::Algorithm(_) => "algorithm",
        }
    }
}

/// The device paths an operation on CUDA buffers tries, in order, given which the
/// communicator started (every rank started the same ones). The last always takes it.
pub fn device_paths(has_nvl: bool, has_mixed: bool) -> &'static [Path] {
    match (has_nvl, has_mixed) {
        (true, _) => &[Path::Nvl, Path::Gpe],
        (false, true) => &[Path::Mixed, Path::Gpe],
        (false, false) => &[Path::Gpe],
    }
}

/// Whether the NVLink and mixed paths have a form for `op`. The dynamic all_to_all reads its
/// counts when it runs, which those paths (planned on the host at issue) cannot do yet.
pub fn has_link_form(op: &Op) -> bool {
    !matches!(op, Op::AllToAllDynamic(_))
}

/// What the progress thread knows of shared memory when it picks a host path: whether every
/// rank of the communicator is on this host with a shared segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShmReach {
    /// Some rank is on another host (or shared memory is off).
    Partial,
    /// Every rank shares this host's segment.
    WholeComm,
}

/// The host path of `op` with the algorithm choice `pick`. An explicit algorithm runs as
/// chosen, also where a shared-memory collective could; auto prefers the shared-memory
/// collective where one exists.
pub fn host_path(op: &Op, pick: Pick, shm: ShmReach, algos: &Selector) -> Path {
    if op.is_p2p() {
        return Path::P2p;
    }
    if let (Choice::Auto, ShmReach::WholeComm) = (pick.choice, shm) {
        if crate::shm_collectives::runs(op) {
            return Path::ShmCollective;
        }
    }
    Path::Algorithm(algos.resolve(op, pick))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::span::Span;
    use crate::types::{DataType, ReduceOp};

    #[test]
    fn device_paths_end_with_the_gpe() {
        for (nvl, mixed) in [(true, false), (false, true), (false, false)] {
            let paths = device_paths(nvl, mixed);
            assert_eq!(paths.last(), Some(&Path::Gpe));
            assert_eq!(paths.contains(&Path::Nvl), nvl);
            assert_eq!(paths.contains(&Path::Mixed), mixed);
        }
    }

    #[test]
    fn host_paths() {
        let algos = Selector::new(
            4,
            1 << 20,
            Default::default(),
            std::time::Duration::from_secs(1),
        );
        let all_reduce = Op::AllReduce {
            buf: Span::EMPTY,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
        };
        let whole = ShmReach::WholeComm;
        let auto = Pick::default();
        assert_eq!(
            host_path(&all_reduce, auto, whole, &algos),
            Path::ShmCollective
        );
        assert!(matches!(
            host_path(&all_reduce, auto, ShmReach::Partial, &algos),
            Path::Algorithm(Some(_))
        ));
        let ring = Pick {
            choice: Choice::Fixed(Algo::AllReduceRing),
            uniform: false,
        };
        assert_eq!(
            host_path(&all_reduce, ring, whole, &algos),
            Path::Algorithm(Some(Algo::AllReduceRing))
        );
        let send = Op::Send {
            buf: Span::EMPTY,
            peer: 1,
        };
        assert_eq!(host_path(&send, auto, whole, &algos), Path::P2p);
        // all_to_all has a shared-memory form, with or without cross-memory attach.
        let a2a = Op::AllToAll {
            inputs: vec![Span::EMPTY; 4],
            outputs: vec![Span::EMPTY; 4],
        };
        assert_eq!(host_path(&a2a, auto, whole, &algos), Path::ShmCollective);
    }
}
