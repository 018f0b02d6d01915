//! The operations: as the command line names them, and as the benchmark measures them.

use clap::ValueEnum;

/// The operations the benchmark measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OpArg {
    /// Every operation below.
    All,
    /// In-place all-reduce.
    #[value(name = "all_reduce", alias = "allreduce")]
    AllReduce,
    /// All-gather into one tensor.
    #[value(name = "all_gather", alias = "allgather")]
    AllGather,
    /// Reduce-scatter of one tensor.
    #[value(name = "reduce_scatter", alias = "reducescatter")]
    ReduceScatter,
    /// All-to-all of one tensor in equal blocks.
    #[value(name = "all_to_all", alias = "alltoall")]
    AllToAll,
    /// In-place broadcast from the root.
    Broadcast,
    /// In-place reduce onto the root.
    Reduce,
    /// Scatter from the root.
    Scatter,
    /// Gather onto the root.
    Gather,
    /// Ring exchange: every rank sends to the next and receives from the previous.
    #[value(name = "send_recv", alias = "sendrecv")]
    SendRecv,
}

/// One measured operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CollOp {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Broadcast,
    Reduce,
    Scatter,
    Gather,
    SendRecv,
}

impl CollOp {
    /// Every operation, in the order `--op all` runs them.
    pub(crate) const ALL: [CollOp; 9] = [
        CollOp::AllReduce,
        CollOp::AllGather,
        CollOp::ReduceScatter,
        CollOp::AllToAll,
        CollOp::Broadcast,
        CollOp::Reduce,
        CollOp::Scatter,
        CollOp::Gather,
        CollOp::SendRecv,
    ];

    /// The name used on the command line and in the output.
    pub(crate) fn name(self) -> &'static str {
        match self {
            CollOp::AllReduce => "all_reduce",
            CollOp::AllGather => "all_gather",
            CollOp::ReduceScatter => "reduce_scatter",
            CollOp::AllToAll => "all_to_all",
            CollOp::Broadcast => "broadcast",
            CollOp::Reduce => "reduce",
            CollOp::Scatter => "scatter",
            CollOp::Gather => "gather",
            CollOp::SendRecv => "send_recv",
        }
    }

    /// True for the operations that take a reduction.
    pub(crate) fn reduces(self) -> bool {
        matches!(
            self,
            CollOp::AllReduce | CollOp::Reduce | CollOp::ReduceScatter
        )
    }

    /// True for the operations that have a root.
    pub(crate) fn rooted(self) -> bool {
        matches!(
            self,
            CollOp::Broadcast | CollOp::Reduce | CollOp::Scatter | CollOp::Gather
        )
    }

    /// True when the size splits into one block per rank.
    pub(crate) fn splits(self) -> bool {
        matches!(
            self,
            CollOp::AllGather
                | CollOp::ReduceScatter
                | CollOp::AllToAll
                | CollOp::Scatter
                | CollOp::Gather
        )
    }

    /// The ctran algorithm names of this operation; `None` for point-to-point.
    pub(crate) fn algos(self) -> Option<Vec<&'static str>> {
        ctran::algos::names_for(self.name())
    }

    /// True when `name` is an algorithm of this operation.
    pub(crate) fn has_algo(self, name: &str) -> bool {
        self.algos().is_some_and(|v| v.contains(&name))
    }

    /// busbw / algbw for `n` ranks (nccl-tests' factors).
    pub(crate) fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            CollOp::AllReduce => 2.0 * (n - 1.0) / n,
            CollOp::AllGather | CollOp::ReduceScatter | CollOp::AllToAll => (n - 1.0) / n,
            CollOp::Broadcast
            | CollOp::Reduce
            | CollOp::Scatter
            | CollOp::Gather
            | CollOp::SendRecv => 1.0,
        }
    }
}
