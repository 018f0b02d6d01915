//! Tree all_reduce: a binomial-tree reduce onto rank 0 whose chunks go back down the same tree
//! as a broadcast as soon as rank 0 has them, pipelined in staging chunks. `2 log2 n` latency
//! steps and no rank moves more than `log2 n` buffers each way; the result is computed once (on
//! rank 0) and copied, so it is bitwise identical on every rank.

use crate::algos::ctx::OpCtx;
use crate::algos::reduce;
use crate::error::Result;
use crate::span::Span;
use crate::types::{DataType, ReduceOp};

/// Runs the tree all_reduce in place on `buf`.
pub fn run(cx: &mut OpCtx<'_>, buf: Span, dtype: DataType, op: ReduceOp) -> Result<()> {
    reduce::tree::run_all_reduce(cx, buf, dtype, op, 0)
}
