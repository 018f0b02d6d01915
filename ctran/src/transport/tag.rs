//! What a rank is doing when it sends or expects a message. Every message carries the sender's
//! [`OpTag`], and the receiver compares it with its own before it uses the data, so ranks that
//! disagree about the operation (a different collective, sequence number, element type, reduce
//! op or root) fail with an error naming both views instead of mixing unrelated bytes.

use std::fmt;

use super::Delivery;
use crate::types::{DataType, ReduceOp};

/// The kind of operation a tag names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TagKind {
    /// No operation (a tag never set).
    None = 0,
    /// Point-to-point transfers (send, recv, batches): numbered per peer pair, not per
    /// communicator, so only the kind is compared.
    P2p = 1,
    /// all_reduce.
    AllReduce = 2,
    /// reduce.
    Reduce = 3,
    /// broadcast.
    Broadcast = 4,
    /// all_gather (and its single and v forms).
    AllGather = 5,
    /// reduce_scatter (and its single and v forms).
    ReduceScatter = 6,
    /// all_to_all (and its single and v forms).
    AllToAll = 7,
    /// scatter.
    Scatter = 8,
    /// gather.
    Gather = 9,
    /// barrier.
    Barrier = 10,
    /// The communicator's own work (calibration of the cost model).
    Internal = 11,
    /// device_alltoallv_single (split sizes read when it runs).
    AllToAllDynamic = 12,
}

impl TagKind {
    const ALL: [TagKind; 13] = [
        TagKind::None,
        TagKind::P2p,
        TagKind::AllReduce,
        TagKind::Reduce,
        TagKind::Broadcast,
        TagKind::AllGather,
        TagKind::ReduceScatter,
        TagKind::AllToAll,
        TagKind::Scatter,
        TagKind::Gather,
        TagKind::Barrier,
        TagKind::Internal,
        TagKind::AllToAllDynamic,
    ];

    fn name(self) -> &'static str {
        match self {
            TagKind::None => "nothing",
            TagKind::P2p => "point-to-point",
            TagKind::AllReduce => "all_reduce",
            TagKind::Reduce => "reduce",
            TagKind::Broadcast => "broadcast",
            TagKind::AllGather => "all_gather",
            TagKind::ReduceScatter => "reduce_scatter",
            TagKind::AllToAll => "all_to_all",
            TagKind::Scatter => "scatter",
            TagKind::Gather => "gather",
            TagKind::Barrier => "barrier",
            TagKind::Internal => "the communicator's own work",
            TagKind::AllToAllDynamic => "device_alltoallv_single",
        }
    }
}

/// A field a tag does not use.
const ABSENT: u64 = 0xFF;
/// A root a tag does not name.
const NO_ROOT: u64 = 0xFFFF_FFFF;

/// An operation as peers compare it: kind, element type, reduce op, root, and the sequence
/// number of a collective. Two 64-bit words on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpTag {
    /// Kind (bits 0-7), dtype (8-15), reduce op (16-23), root (24-55).
    pub word: u64,
    /// The collective's sequence number on the communicator (0 for point-to-point).
    pub seq: u64,
}

impl OpTag {
    /// The tag of point-to-point transfers.
    pub const P2P: OpTag = OpTag {
        word: TagKind::P2p as u64 | ABSENT << 8 | ABSENT << 16 | NO_ROOT << 24,
        seq: 0,
    };

    /// A collective's tag. `dtype` and `op` are those of reductions; `root` that of rooted
    /// collectives.
    pub fn collective(
        kind: TagKind,
        seq: u64,
        dtype: Option<DataType>,
        op: Option<ReduceOp>,
        root: Option<usize>,
    ) -> OpTag {
        let dtype = dtype.map_or(ABSENT, |d| {
            DataType::ALL.iter().position(|&x| x == d).unwrap_or(0xFE) as u64
        });
        // PREMUL_SUM's factor may differ per rank (as in NCCL): only the operator is compared.
        let op = op.map_or(ABSENT, |o| {
            ReduceOp::ALL
                .iter()
                .position(|x| x.name() == o.name())
                .unwrap_or(0xFE) as u64
        });
        let root = root.map_or(NO_ROOT, |r| (r as u64).min(NO_ROOT - 1));
        OpTag {
            word: kind as u64 | dtype << 8 | op << 16 | root << 24,
            seq,
        }
    }

    /// The communicator's own work (no sequence of its own).
    pub fn internal() -> OpTag {
        OpTag::collective(TagKind::Internal, 0, None, None, None)
    }

    /// How the sends of this operation are delivered. Where a rank's part can be sending only
    /// (a root handing out data, a leaf handing it up, the sends of an all_to_all), a receiver
    /// that refuses the data would otherwise fail alone while the sender succeeds: collectives
    /// await their receivers' acceptance at their end, a point-to-point send finishes only once
    /// its receiver accepted it. Collectives where every rank receives from a chain that the
    /// failing rank breaks (all_reduce, all_gather, reduce_scatter, barrier) learn of it anyway.
    pub fn delivery(self) -> Delivery {
        match self.kind() {
            Some(TagKind::P2p) => Delivery::Accepted,
            Some(
                TagKind::Broadcast
                | TagKind::Scatter
                | TagKind::Gather
                | TagKind::Reduce
                | TagKind::AllToAll,
            ) => Delivery::Confirmed,
            _ => Delivery::Eager,
        }
    }

    fn kind(self) -> Option<TagKind> {
        TagKind::ALL.get((self.word & 0xFF) as usize).copied()
    }
}

impl fmt::Display for OpTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(kind) = self.kind() else {
            return write!(f, "an unknown operation (tag {:#x})", self.word);
        };
        f.write_str(kind.name())?;
        if matches!(kind, TagKind::P2p | TagKind::None) {
            return Ok(());
        }
        let mut parts = Vec::new();
        let field = |shift: u32, mask: u64| (self.word >> shift) & mask;
        if let Some(d) = DataType::ALL.get(field(8, 0xFF) as usize) {
            parts.push(d.name().to_string());
        }
        if let Some(o) = ReduceOp::ALL.get(field(16, 0xFF) as usize) {
            parts.push(o.name().to_string());
        }
        let root = field(24, NO_ROOT);
        if root != NO_ROOT {
            parts.push(format!("root {root}"));
        }
        if !parts.is_empty() {
            write!(f, "({})", parts.join(", "))?;
        }
        if kind != TagKind::Internal {
            write!(f, " #{}", self.seq)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_name_what_differs() {
        let sum = OpTag::collective(
            TagKind::AllReduce,
            5,
            Some(DataType::F32),
            Some(ReduceOp::Sum),
            None,
        );
        let max = OpTag::collective(
            TagKind::AllReduce,
            5,
            Some(DataType::F32),
            Some(ReduceOp::Max),
            None,
        );
        assert_ne!(sum, max);
        assert_eq!(sum.to_string(), "all_reduce(f32, sum) #5");
        assert_eq!(max.to_string(), "all_reduce(f32, max) #5");
        let bcast = OpTag::collective(TagKind::Broadcast, 9, None, None, Some(2));
        assert_eq!(bcast.to_string(), "broadcast(root 2) #9");
        assert_eq!(OpTag::P2P.to_string(), "point-to-point");
        // PREMUL_SUM factors may differ per rank.
        let a = OpTag::collective(
            TagKind::AllReduce,
            1,
            Some(DataType::F16),
            Some(ReduceOp::PremulSum { factor: 2.0 }),
            None,
        );
        let b = OpTag::collective(
            TagKind::AllReduce,
            1,
            Some(DataType::F16),
            Some(ReduceOp::PremulSum { factor: 0.5 }),
            None,
        );
        assert_eq!(a, b);
        assert_eq!(
            OpTag { word: 0xEE, seq: 0 }.to_string(),
            "an unknown operation (tag 0xee)"
        );
    }
}
