//! Reduction kernels: element-wise combination of byte buffers for every (dtype, op) pair.
//!
//! # Prescale, combine, finish
//!
//! A collective does not apply a reduction as one n-ary function. Ring, tree and
//! halving-doubling schedules combine contributions *pairwise*, in whatever order the schedule
//! visits them, and a given partial may be produced on any rank. Following NCCL, a
//! [`ReduceOp`] is therefore split into three steps, each applied a fixed number of times
//! whatever the schedule:
//!
//! - **prescale**, once to each rank's input ([`Reducer::prescale_in_place`],
//!   [`Reducer::load_input`]): `PremulSum { factor }` multiplies by `factor`; `Avg` on float
//!   types multiplies by `1/nranks` (NCCL lowers float avg to premul-sum with that scalar, which
//!   keeps partial sums in range where the plain sum would overflow, as f16 easily does).
//!   Nothing for the other ops.
//! - **combine**, once per pair of partials ([`Reducer::combine`], [`Reducer::combine3`],
//!   [`Reducer::fold`], [`Reducer::combine_input`]): add for `Sum`, `Avg` and `PremulSum`; multiply for `Product`;
//!   `Min`, `Max`, `BAnd`, `BOr`, `BXor`.
//! - **finish**, once to the final result ([`Reducer::finish`]): `Avg` on integer types divides
//!   by `nranks`, truncating toward zero (NCCL's `SumPostDiv`; a `1/n` prescale would truncate
//!   every input to zero). Nothing for the other ops.
//!
//! Every step is a deterministic function of its operands, and the fused forms are bit for bit
//! the unfused sequences they replace: `load_input(d, s)` is `d = s; prescale_in_place(d)`,
//! `combine_input(d, s)` is `combine(d, prescale(s))` (the scaled value is rounded to the dtype
//! before it is added, as the unfused form would store it), `combine3(d, a, b)` is
//! `d = a; combine(d, b)`, and `fold(d, [s0, s1, …])` is `combine3(d, s0, s1)` followed by
//! `combine(d, si)` for each further source. So the result depends only on the order in which the algorithm
//! combines contributions, never on which rank performs a combine or whether it fused steps.
//! (`combine_input` scales with this reducer's factor; torch gives every rank the same one.)
//!
//! # Numerics
//!
//! - `f16`/`bf16` widen to `f32`, operate, and round back after every pairwise operation (the
//!   result is the correctly rounded operation in the dtype). Scalars (`factor`, `1/nranks`) are
//!   rounded to the dtype first, as NCCL stores them.
//! - Integers use wrapping arithmetic. `PremulSum` on integers multiplies as `f64` and truncates
//!   toward zero, saturating at the type's range.
//! - `Bool` bytes read as false (0) or true (anything else): `Sum`/`Max`/`BOr` are logical or,
//!   `Product`/`Min`/`BAnd` logical and, `BXor` exclusive or; combined outputs are always 0 or 1.
//!   `Avg` and `PremulSum` are refused on `Bool`.
//! - Float `Min`/`Max` propagate NaN (like `torch.minimum`/`torch.maximum`) and order `-0.0`
//!   below `+0.0` (IEEE 754-2019 `minimum`/`maximum`), so both are commutative bit for bit.
//!
//! # Performance
//!
//! The (dtype, op) pair is dispatched once per call, to loops monomorphised for the element
//! type and operator, written so the compiler vectorises them (no branches per element). `bf16`
//! converts to and from `f32` inside those loops; `f16` converts blocks of 256 elements with
//! the CPU's conversion instructions. Slices not aligned for the element type (a user tensor at
//! an odd address) are staged through aligned stack blocks.
//!
//! The build targets the x86-64 baseline (SSE2). On CPUs with AVX2 and F16C, chosen at run time,
//! the loops run in a copy compiled for those: 8-lane vectors, 64-bit compares (`i64` max runs
//! about 4x faster) and hardware f16 conversion. That choice and the f16 intrinsics are the only
//! `unsafe` here; byte-to-element casts go through `bytemuck`, which checks alignment.

mod dispatch;
mod drive;
mod f16_storage;
mod kind;
mod storage;
#[cfg(test)]
mod tests;

use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::types::{DataType, ReduceOp};
use dispatch::{combine, combine3, combine_input, finish, fold, load_input, prescale_in_place};
use kind::Bool;

/// Elements per stack block, for half-precision conversion and for staging misaligned bytes.
/// At most 3 blocks of 8-byte elements (6 KiB) are live at once.
const BLOCK: usize = 256;

/// Most sources [`Reducer::fold`] reads in one pass (besides `dst`): wide enough that a direct
/// reduction over 4-5 ranks is one pass, narrow enough to keep the monomorphised loops few.
pub const FOLD_WIDTH: usize = 4;

/// The pairwise operation combine applies (prescale and finish are separate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pairwise {
    Add,
    Mul,
    Min,
    Max,
    And,
    Or,
    Xor,
}

/// Runs `$body` with `$k` bound to the [`Kind`] of `$dtype`.
macro_rules! with_kind {
    ($dtype:expr, $k:ident => $body:expr) => {
        match $dtype {
            DataType::F16 => {
                type $k = f16;
                $body
            }
            DataType::BF16 => {
                type $k = bf16;
                $body
            }
            DataType::F32 => {
                type $k = f32;
                $body
            }
            DataType::F64 => {
                type $k = f64;
                $body
            }
            DataType::I8 => {
                type $k = i8;
                $body
            }
            DataType::U8 => {
                type $k = u8;
                $body
            }
            DataType::I32 => {
                type $k = i32;
                $body
            }
            DataType::I64 => {
                type $k = i64;
                $body
            }
            DataType::Bool => {
                type $k = Bool;
                $body
            }
        }
    };
}

/// Applies one reduction operator to byte buffers of one dtype. See the module docs.
///
/// Every method taking byte slices panics unless the slices have equal lengths that are a
/// multiple of the element size. Slices need no particular alignment.
#[derive(Debug, Clone, Copy)]
pub struct Reducer {
    dtype: DataType,
    op: ReduceOp,
    nranks: usize,
    pairwise: Pairwise,
    /// Factor every input is multiplied by, when the op prescales.
    prescale: Option<f64>,
    /// Divisor applied by [`Reducer::finish`], when the op has one.
    post_div: Option<i64>,
}

impl Reducer {
    /// Validates the (dtype, op) pair for a reduction over `nranks` ranks.
    ///
    /// Refuses bitwise ops on float types, `Avg` and `PremulSum` on `Bool`, and `nranks == 0`.
    pub fn new(dtype: DataType, op: ReduceOp, nranks: usize) -> Result<Reducer> {
        if nranks == 0 {
            return Err(Error::invalid("nranks", "at least 1", nranks));
        }
        op.check_dtype(dtype)?;
        if dtype == DataType::Bool && matches!(op, ReduceOp::Avg | ReduceOp::PremulSum { .. }) {
            return Err(Error::invalid(
                "op",
                "sum, prod, min, max, band, bor or bxor on bool tensors",
                format!("{} on {}", op.name(), dtype),
            ));
        }
        let pairwise = match op {
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum { .. } => Pairwise::Add,
            ReduceOp::Product => Pairwise::Mul,
            ReduceOp::Min => Pairwise::Min,
            ReduceOp::Max => Pairwise::Max,
            ReduceOp::BAnd => Pairwise::And,
            ReduceOp::BOr => Pairwise::Or,
            ReduceOp::BXor => Pairwise::Xor,
        };
        let (prescale, post_div) = match op {
            ReduceOp::PremulSum { factor } => (Some(factor), None),
            ReduceOp::Avg if dtype.is_float() => (Some(1.0 / nranks as f64), None),
            ReduceOp::Avg => (None, Some(i64::try_from(nranks).unwrap_or(i64::MAX))),
            _ => (None, None),
        };
        Ok(Reducer {
            dtype,
            op,
            nranks,
            pairwise,
            prescale,
            post_div,
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The reduction operator.
    pub fn op(&self) -> ReduceOp {
        self.op
    }

    /// The number of ranks contributing (the divisor of `Avg`).
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// True when inputs must be prescaled (`PremulSum`, and `Avg` on float types).
    pub fn needs_prescale(&self) -> bool {
        self.prescale.is_some()
    }

    /// True when the final result needs [`Reducer::finish`] (`Avg` on integer types).
    pub fn needs_finish(&self) -> bool {
        self.post_div.is_some()
    }

    /// Prescales one rank's own input in place; a no-op unless [`Reducer::needs_prescale`].
    pub fn prescale_in_place(&self, buf: &mut [u8]) {
        self.check_len(buf.len(), buf.len());
        if let Some(factor) = self.prescale {
            with_kind!(self.dtype, K => prescale_in_place::<K>(factor, buf));
        }
    }

    /// `dst = prescale(src)`: loads a raw input as a partial (a copy when nothing prescales).
    pub fn load_input(&self, dst: &mut [u8], src: &[u8]) {
        self.check_len(dst.len(), src.len());
        match self.prescale {
            Some(factor) => with_kind!(self.dtype, K => load_input::<K>(factor, dst, src)),
            None => dst.copy_from_slice(src),
        }
    }

    /// `dst = dst ⊕ src` for two partials (both already prescaled).
    pub fn combine(&self, dst: &mut [u8], src: &[u8]) {
        self.check_len(dst.len(), src.len());
        with_kind!(self.dtype, K => combine::<K>(self.pairwise, dst, src));
    }

    /// `dst = dst ⊕ prescale(src)` where `dst` is a partial and `src` a raw input of some rank;
    /// fused, bit-for-bit `combine(dst, load_input(src))`.
    pub fn combine_input(&self, dst: &mut [u8], src: &[u8]) {
        self.check_len(dst.len(), src.len());
        match self.prescale {
            // Only add-like ops prescale.
            Some(factor) => with_kind!(self.dtype, K => combine_input::<K>(factor, dst, src)),
            None => with_kind!(self.dtype, K => combine::<K>(self.pairwise, dst, src)),
        }
    }

    /// `dst = a ⊕ b` for two partials, fused (no copy of `a` into `dst` first).
    pub fn combine3(&self, dst: &mut [u8], a: &[u8], b: &[u8]) {
        self.check_len(dst.len(), a.len());
        self.check_len(dst.len(), b.len());
        with_kind!(self.dtype, K => combine3::<K>(self.pairwise, dst, a, b));
    }

    /// `dst = srcs[0] ⊕ srcs[1] ⊕ … ⊕ srcs[k-1]` for partials, combined in that order; fused,
    /// bit-for-bit `combine3(dst, srcs[0], srcs[1])` then `combine(dst, srcs[i])` for the rest
    /// (a copy for one source). One pass over every [`FOLD_WIDTH`] sources where the unfused
    /// sequence reads and writes `dst` once per source.
    pub fn fold(&self, dst: &mut [u8], srcs: &[&[u8]]) {
        assert!(
            !srcs.is_empty(),
            "{} {}: fold of no sources",
            self.op,
            self.dtype
        );
        for s in srcs {
            self.check_len(dst.len(), s.len());
        }
        let (first, rest) = srcs.split_at(srcs.len().min(FOLD_WIDTH));
        with_kind!(self.dtype, K => fold::<K>(self.pairwise, dst, first, false));
        for group in rest.chunks(FOLD_WIDTH) {
            with_kind!(self.dtype, K => fold::<K>(self.pairwise, dst, group, true));
        }
    }

    /// `dst = dst ⊕ srcs[0] ⊕ … ⊕ srcs[k-1]` for partials, in that order; fused, bit-for-bit
    /// `combine(dst, srcs[i])` for each source in turn, in one pass per [`FOLD_WIDTH`] sources.
    pub fn fold_onto(&self, dst: &mut [u8], srcs: &[&[u8]]) {
        for s in srcs {
            self.check_len(dst.len(), s.len());
        }
        for group in srcs.chunks(FOLD_WIDTH) {
            with_kind!(self.dtype, K => fold::<K>(self.pairwise, dst, group, true));
        }
    }

    /// Post-processes the final result once; a no-op unless [`Reducer::needs_finish`].
    pub fn finish(&self, buf: &mut [u8]) {
        self.check_len(buf.len(), buf.len());
        if let Some(n) = self.post_div {
            with_kind!(self.dtype, K => finish::<K>(n, buf));
        }
    }

    fn check_len(&self, dst: usize, src: usize) {
        assert_eq!(
            dst, src,
            "{} {}: buffer lengths differ",
            self.op, self.dtype
        );
        assert!(
            dst % self.dtype.size_bytes() == 0,
            "{} {}: {dst} bytes is not a whole number of {}-byte elements",
            self.op,
            self.dtype,
            self.dtype.size_bytes(),
        );
    }
}
