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

use std::mem::size_of;

use bytemuck::Pod;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::types::{DataType, ReduceOp};

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

// ---------------------------------------------------------------------------------------------
// Dispatch: one match per call, to code monomorphised for the element type and the operator.

fn prescale_in_place<K: Kind>(factor: f64, buf: &mut [u8]) {
    let s = K::scale_factor(factor);
    drive::<K::S, 0>(buf, [], |d, []| K::S::map_in_place(d, |x| K::scale(x, s)));
}

fn load_input<K: Kind>(factor: f64, dst: &mut [u8], src: &[u8]) {
    let s = K::scale_factor(factor);
    drive::<K::S, 1>(dst, [src], |d, [x]| K::S::map(d, x, |x| K::scale(x, s)));
}

fn combine_input<K: Kind>(factor: f64, dst: &mut [u8], src: &[u8]) {
    let s = K::scale_factor(factor);
    drive::<K::S, 1>(dst, [src], |d, [x]| {
        K::S::zip_in_place_pre(d, x, |x| K::scale(x, s), K::add);
    });
}

fn finish<K: Kind>(n: i64, buf: &mut [u8]) {
    drive::<K::S, 0>(buf, [], |d, []| K::S::map_in_place(d, |x| K::div(x, n)));
}

/// Runs `$body` with `$f` bound to the [`Kind`] `$k`'s function for `$op`.
macro_rules! with_pairwise {
    ($op:expr, $k:ty, $f:ident => $body:expr) => {
        match $op {
            Pairwise::Add => {
                let $f = <$k>::add;
                $body
            }
            Pairwise::Mul => {
                let $f = <$k>::mul;
                $body
            }
            Pairwise::Min => {
                let $f = <$k>::min;
                $body
            }
            Pairwise::Max => {
                let $f = <$k>::max;
                $body
            }
            Pairwise::And => {
                let $f = <$k>::and;
                $body
            }
            Pairwise::Or => {
                let $f = <$k>::or;
                $body
            }
            Pairwise::Xor => {
                let $f = <$k>::xor;
                $body
            }
        }
    };
}

fn combine<K: Kind>(op: Pairwise, dst: &mut [u8], src: &[u8]) {
    fn go<S: Storage>(dst: &mut [u8], src: &[u8], f: impl Fn(S::C, S::C) -> S::C) {
        drive::<S, 1>(dst, [src], |d, [s]| S::zip_in_place(d, s, &f));
    }
    with_pairwise!(op, K, f => go::<K::S>(dst, src, f))
}

fn combine3<K: Kind>(op: Pairwise, dst: &mut [u8], a: &[u8], b: &[u8]) {
    fn go<S: Storage>(dst: &mut [u8], a: &[u8], b: &[u8], f: impl Fn(S::C, S::C) -> S::C) {
        drive::<S, 2>(dst, [a, b], |d, [a, b]| S::zip(d, a, b, &f));
    }
    with_pairwise!(op, K, f => go::<K::S>(dst, a, b, f))
}

/// `dst = srcs[0] ⊕ …` (`onto_dst` false) or `dst = dst ⊕ srcs[0] ⊕ …` (true), for 1 to
/// [`FOLD_WIDTH`] sources.
fn fold<K: Kind>(op: Pairwise, dst: &mut [u8], srcs: &[&[u8]], onto_dst: bool) {
    fn go<S: Storage, const N: usize>(
        dst: &mut [u8],
        srcs: &[&[u8]],
        onto_dst: bool,
        f: impl Fn(S::C, S::C) -> S::C,
    ) {
        let srcs: [&[u8]; N] = srcs.try_into().expect("N sources");
        if onto_dst {
            drive::<S, N>(dst, srcs, |d, s| S::fold_in_place(d, s, &f));
        } else {
            drive::<S, N>(dst, srcs, |d, s| S::fold(d, s, &f));
        }
    }
    with_pairwise!(op, K, f => match srcs.len() {
        1 if !onto_dst => dst.copy_from_slice(srcs[0]),
        1 => go::<K::S, 1>(dst, srcs, onto_dst, f),
        2 => go::<K::S, 2>(dst, srcs, onto_dst, f),
        3 => go::<K::S, 3>(dst, srcs, onto_dst, f),
        4 => go::<K::S, 4>(dst, srcs, onto_dst, f),
        k => unreachable!("fold of {k} sources at once"),
    })
}

/// Runs `kernel` on `dst` and `srcs` viewed as slices of `S`: directly when every slice is
/// aligned for `S`, else through aligned stack blocks of [`BLOCK`] elements. Lengths are equal
/// multiples of `size_of::<S>()` (checked by the caller).
///
/// On x86-64 CPUs with AVX2 and F16C (all since 2013) the loops run in a copy compiled for
/// those, chosen at run time: the build targets the x86-64 baseline (SSE2), whose 4-lane
/// vectors and lack of 64-bit compares leave a lot on the table (`i64` max runs 4x faster).
#[inline]
fn drive<S: Storage, const N: usize>(
    dst: &mut [u8],
    srcs: [&[u8]; N],
    kernel: impl Fn(&mut [S], [&[S]; N]),
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_f16c() {
        // SAFETY: the CPU has AVX2 and F16C, the features `drive_avx2` is compiled for.
        unsafe { drive_avx2(dst, srcs, kernel) };
        return;
    }
    drive_portable(dst, srcs, kernel);
}

/// True when the CPU has AVX2 and F16C (the standard library caches the answer).
#[cfg(target_arch = "x86_64")]
#[inline]
fn has_avx2_f16c() -> bool {
    #[cfg(test)]
    if tests::PORTABLE_ONLY.with(std::cell::Cell::get) {
        return false;
    }
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
}

/// [`drive_portable`] compiled with AVX2 and F16C enabled: the kernel, the loops and the
/// conversions it calls are inlined here and vectorised for those.
///
/// # Safety
///
/// The CPU must support AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn drive_avx2<S: Storage, const N: usize>(
    dst: &mut [u8],
    srcs: [&[u8]; N],
    kernel: impl Fn(&mut [S], [&[S]; N]),
) {
    drive_portable(dst, srcs, kernel);
}

#[inline(always)]
fn drive_portable<S: Storage, const N: usize>(
    dst: &mut [u8],
    srcs: [&[u8]; N],
    kernel: impl Fn(&mut [S], [&[S]; N]),
) {
    let aligned = |b: &[u8]| b.as_ptr().cast::<S>().is_aligned();
    if aligned(dst) && srcs.iter().all(|s| aligned(s)) {
        kernel(
            bytemuck::cast_slice_mut(dst),
            srcs.map(bytemuck::cast_slice),
        );
        return;
    }
    let mut d_blk = [S::zeroed(); BLOCK];
    let mut s_blk = [[S::zeroed(); BLOCK]; N];
    let step = BLOCK * size_of::<S>();
    for (i, dc) in dst.chunks_mut(step).enumerate() {
        let n = dc.len() / size_of::<S>();
        let bytes = i * step..i * step + dc.len();
        bytemuck::cast_slice_mut::<S, u8>(&mut d_blk[..n]).copy_from_slice(dc);
        for (blk, s) in s_blk.iter_mut().zip(&srcs) {
            bytemuck::cast_slice_mut::<S, u8>(&mut blk[..n]).copy_from_slice(&s[bytes.clone()]);
        }
        kernel(&mut d_blk[..n], std::array::from_fn(|j| &s_blk[j][..n]));
        dc.copy_from_slice(bytemuck::cast_slice(&d_blk[..n]));
    }
}

// ---------------------------------------------------------------------------------------------
// Storage: how stored elements are brought into the type their arithmetic runs in.

/// A stored element type and the loops over its slices. The loops take the arithmetic as a
/// closure over the compute type [`Storage::C`]; slices passed to one call have equal lengths.
trait Storage: Pod {
    /// Type the arithmetic runs in: `f32` for `f16`/`bf16`, the type itself otherwise.
    type C: Copy;
    /// `buf[i] = f(buf[i])`.
    fn map_in_place(buf: &mut [Self], f: impl Fn(Self::C) -> Self::C);
    /// `dst[i] = f(src[i])`.
    fn map(dst: &mut [Self], src: &[Self], f: impl Fn(Self::C) -> Self::C);
    /// `dst[i] = f(dst[i], src[i])`.
    fn zip_in_place(dst: &mut [Self], src: &[Self], f: impl Fn(Self::C, Self::C) -> Self::C);
    /// `dst[i] = f(dst[i], round(pre(src[i])))`, where `round` rounds to `Self`.
    fn zip_in_place_pre(
        dst: &mut [Self],
        src: &[Self],
        pre: impl Fn(Self::C) -> Self::C,
        f: impl Fn(Self::C, Self::C) -> Self::C,
    );
    /// `dst[i] = f(a[i], b[i])`.
    fn zip(dst: &mut [Self], a: &[Self], b: &[Self], f: impl Fn(Self::C, Self::C) -> Self::C);
    /// `dst[i] = f(…f(f(s[0][i], s[1][i]), s[2][i])…, s[N-1][i])`, rounded to `Self` after every
    /// step (`N >= 2`). Unfused by default.
    fn fold<const N: usize>(
        dst: &mut [Self],
        srcs: [&[Self]; N],
        f: impl Fn(Self::C, Self::C) -> Self::C,
    ) {
        Self::zip(dst, srcs[0], srcs[1], &f);
        for s in &srcs[2..] {
            Self::zip_in_place(dst, s, &f);
        }
    }
    /// `dst[i] = f(…f(dst[i], s[0][i])…, s[N-1][i])`, rounded to `Self` after every step.
    /// Unfused by default.
    fn fold_in_place<const N: usize>(
        dst: &mut [Self],
        srcs: [&[Self]; N],
        f: impl Fn(Self::C, Self::C) -> Self::C,
    ) {
        for s in srcs {
            Self::zip_in_place(dst, s, &f);
        }
    }
}

/// Types converted element by element inside the loop (`$to_c`, `$from_c`): one pass, no
/// temporaries, vectorised whole. Native types convert with the identity.
macro_rules! elementwise_storage {
    ($t:ty, $c:ty, $to_c:path, $from_c:path) => {
        impl Storage for $t {
            type C = $c;
            #[inline]
            fn map_in_place(buf: &mut [$t], f: impl Fn($c) -> $c) {
                for x in buf {
                    *x = $from_c(f($to_c(*x)));
                }
            }
            #[inline]
            fn map(dst: &mut [$t], src: &[$t], f: impl Fn($c) -> $c) {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = $from_c(f($to_c(*s)));
                }
            }
            #[inline]
            fn zip_in_place(dst: &mut [$t], src: &[$t], f: impl Fn($c, $c) -> $c) {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = $from_c(f($to_c(*d), $to_c(*s)));
                }
            }
            #[inline]
            fn zip_in_place_pre(
                dst: &mut [$t],
                src: &[$t],
                pre: impl Fn($c) -> $c,
                f: impl Fn($c, $c) -> $c,
            ) {
                for (d, s) in dst.iter_mut().zip(src) {
                    // Round the prescaled input to the dtype, as load_input would store it.
                    let s = $to_c($from_c(pre($to_c(*s))));
                    *d = $from_c(f($to_c(*d), s));
                }
            }
            #[inline]
            fn zip(dst: &mut [$t], a: &[$t], b: &[$t], f: impl Fn($c, $c) -> $c) {
                for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
                    *d = $from_c(f($to_c(*x), $to_c(*y)));
                }
            }
            #[inline]
            fn fold<const N: usize>(dst: &mut [$t], srcs: [&[$t]; N], f: impl Fn($c, $c) -> $c) {
                // Equal lengths, so the indexing below needs no bounds checks.
                let srcs = srcs.map(|s| &s[..dst.len()]);
                for (i, d) in dst.iter_mut().enumerate() {
                    *d = srcs[1..]
                        .iter()
                        .fold(srcs[0][i], |acc, s| $from_c(f($to_c(acc), $to_c(s[i]))));
                }
            }
            #[inline]
            fn fold_in_place<const N: usize>(
                dst: &mut [$t],
                srcs: [&[$t]; N],
                f: impl Fn($c, $c) -> $c,
            ) {
                let srcs = srcs.map(|s| &s[..dst.len()]);
                for (i, d) in dst.iter_mut().enumerate() {
                    *d = srcs
                        .iter()
                        .fold(*d, |acc, s| $from_c(f($to_c(acc), $to_c(s[i]))));
                }
            }
        }
    };
}
elementwise_storage!(f32, f32, std::convert::identity, std::convert::identity);
elementwise_storage!(f64, f64, std::convert::identity, std::convert::identity);
elementwise_storage!(i8, i8, std::convert::identity, std::convert::identity);
elementwise_storage!(u8, u8, std::convert::identity, std::convert::identity);
elementwise_storage!(i32, i32, std::convert::identity, std::convert::identity);
elementwise_storage!(i64, i64, std::convert::identity, std::convert::identity);
elementwise_storage!(bf16, f32, bf16_to_f32, f32_to_bf16);

// `half` converts bf16 element by element with branches; these branch-free forms vectorise inside
// the loops above and give the same bits (NaN aside: a NaN stays a NaN). Tested exhaustively for
// widening and over a sweep of f32 bit patterns for rounding.

/// Exact.
#[inline(always)]
fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// Round to nearest even; a NaN stays a NaN and is made quiet.
#[inline(always)]
fn f32_to_bf16(x: f32) -> bf16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    let quiet_nan = ((b >> 16) | 0x0040) as u16;
    bf16::from_bits(if x.is_nan() { quiet_nan } else { rounded })
}

/// `f16` converts a block at a time with the CPU's conversion instructions (F16C on x86-64,
/// FP16 on aarch64 through `half`) or `half`'s software fallback; the arithmetic runs on the
/// `f32` block in between.
impl Storage for f16 {
    type C = f32;
    #[inline]
    fn map_in_place(buf: &mut [f16], f: impl Fn(f32) -> f32) {
        let mut a = [0f32; BLOCK];
        for blk in buf.chunks_mut(BLOCK) {
            let a = &mut a[..blk.len()];
            widen_f16(blk, a);
            a.iter_mut().for_each(|x| *x = f(*x));
            narrow_f16(a, blk);
        }
    }
    #[inline]
    fn map(dst: &mut [f16], src: &[f16], f: impl Fn(f32) -> f32) {
        let mut a = [0f32; BLOCK];
        for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
            let a = &mut a[..d.len()];
            widen_f16(s, a);
            a.iter_mut().for_each(|x| *x = f(*x));
            narrow_f16(a, d);
        }
    }
    #[inline]
    fn zip_in_place(dst: &mut [f16], src: &[f16], f: impl Fn(f32, f32) -> f32) {
        let (mut a, mut b) = ([0f32; BLOCK], [0f32; BLOCK]);
        for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
            let (a, b) = (&mut a[..d.len()], &mut b[..d.len()]);
            widen_f16(d, a);
            widen_f16(s, b);
            a.iter_mut().zip(b.iter()).for_each(|(x, y)| *x = f(*x, *y));
            narrow_f16(a, d);
        }
    }
    #[inline]
    fn zip_in_place_pre(
        dst: &mut [f16],
        src: &[f16],
        pre: impl Fn(f32) -> f32,
        f: impl Fn(f32, f32) -> f32,
    ) {
        let (mut a, mut b) = ([0f32; BLOCK], [0f32; BLOCK]);
        let mut t = [f16::ZERO; BLOCK];
        for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
            let (a, b, t) = (&mut a[..d.len()], &mut b[..d.len()], &mut t[..d.len()]);
            // Round the prescaled input to the dtype, as load_input would store it.
            widen_f16(s, b);
            b.iter_mut().for_each(|x| *x = pre(*x));
            narrow_f16(b, t);
            widen_f16(t, b);
            widen_f16(d, a);
            a.iter_mut().zip(b.iter()).for_each(|(x, y)| *x = f(*x, *y));
            narrow_f16(a, d);
        }
    }
    #[inline]
    fn zip(dst: &mut [f16], x: &[f16], y: &[f16], f: impl Fn(f32, f32) -> f32) {
        let (mut a, mut b) = ([0f32; BLOCK], [0f32; BLOCK]);
        for ((d, x), y) in dst
            .chunks_mut(BLOCK)
            .zip(x.chunks(BLOCK))
            .zip(y.chunks(BLOCK))
        {
            let (a, b) = (&mut a[..d.len()], &mut b[..d.len()]);
            widen_f16(x, a);
            widen_f16(y, b);
            a.iter_mut().zip(b.iter()).for_each(|(x, y)| *x = f(*x, *y));
            narrow_f16(a, d);
        }
    }
}

/// `dst = src` widened to f32 (exact).
#[inline]
fn widen_f16(src: &[f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_f16c() {
        // SAFETY: the CPU has F16C (and AVX2, so AVX).
        unsafe { f16c::widen(src, dst) };
        return;
    }
    src.convert_to_f32_slice(dst);
}

/// `dst = src` rounded to f16 (to nearest even).
#[inline]
fn narrow_f16(src: &[f32], dst: &mut [f16]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_f16c() {
        // SAFETY: the CPU has F16C (and AVX2, so AVX).
        unsafe { f16c::narrow(src, dst) };
        return;
    }
    dst.convert_from_f32_slice(src);
}

/// f16 slice conversions with the F16C instructions, 8 lanes at a time. `half` has these too,
/// but calls them through a function pointer per 8 elements; these inline into the loops of
/// [`drive_avx2`].
#[cfg(target_arch = "x86_64")]
mod f16c {
    use std::arch::x86_64::_MM_FROUND_TO_NEAREST_INT;
    use std::arch::x86_64::{__m128i, __m256, _mm256_cvtph_ps, _mm256_cvtps_ph};

    use half::f16;
    use half::slice::HalfFloatSliceExt;

    /// # Safety
    ///
    /// The CPU must support AVX and F16C.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        let (s8, mut d8) = (src.chunks_exact(8), dst.chunks_exact_mut(8));
        let rest = s8.remainder();
        for (s, d) in s8.zip(&mut d8) {
            let h: [f16; 8] = s.try_into().expect("chunk of 8");
            // The intrinsic is a safe fn from Rust 1.86; unsafe before (the workspace MSRV).
            // SAFETY: the caller guarantees F16C.
            #[allow(unused_unsafe)]
            let w: __m256 = unsafe { _mm256_cvtph_ps(bytemuck::cast::<_, __m128i>(h)) };
            d.copy_from_slice(&bytemuck::cast::<_, [f32; 8]>(w));
        }
        rest.convert_to_f32_slice(d8.into_remainder());
    }

    /// # Safety
    ///
    /// The CPU must support AVX and F16C.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn narrow(src: &[f32], dst: &mut [f16]) {
        let (s8, mut d8) = (src.chunks_exact(8), dst.chunks_exact_mut(8));
        let rest = s8.remainder();
        for (s, d) in s8.zip(&mut d8) {
            let x: [f32; 8] = s.try_into().expect("chunk of 8");
            // SAFETY: as in `widen`.
            #[allow(unused_unsafe)]
            let h: __m128i = unsafe {
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(bytemuck::cast::<_, __m256>(x))
            };
            d.copy_from_slice(&bytemuck::cast::<_, [f16; 8]>(h));
        }
        d8.into_remainder().convert_from_f32_slice(rest);
    }
}

// ---------------------------------------------------------------------------------------------
// Kind: the arithmetic of one dtype, in its compute type.

/// Compute type of kind `K`.
type C<K> = <<K as Kind>::S as Storage>::C;

/// The arithmetic of one [`DataType`]. Operators that [`Reducer::new`] refuses for a dtype
/// (bitwise ops on floats; scale and divide on `Bool`) are never called; they are still defined,
/// as the obvious bit-level or identity operation, so that dispatch needs no extra branch.
trait Kind: Sized {
    /// How elements are stored.
    type S: Storage;
    /// The prescale factor, converted once per call.
    type Scale: Copy;
    fn scale_factor(factor: f64) -> Self::Scale;
    fn scale(x: C<Self>, s: Self::Scale) -> C<Self>;
    fn div(x: C<Self>, n: i64) -> C<Self>;
    fn add(a: C<Self>, b: C<Self>) -> C<Self>;
    fn mul(a: C<Self>, b: C<Self>) -> C<Self>;
    fn min(a: C<Self>, b: C<Self>) -> C<Self>;
    fn max(a: C<Self>, b: C<Self>) -> C<Self>;
    fn and(a: C<Self>, b: C<Self>) -> C<Self>;
    fn or(a: C<Self>, b: C<Self>) -> C<Self>;
    fn xor(a: C<Self>, b: C<Self>) -> C<Self>;
}

/// IEEE 754-2019 `minimum`/`maximum` written as selects, so loops over them vectorise.
macro_rules! float_min_max {
    ($min:ident, $max:ident, $t:ty) => {
        /// NaN if either is NaN; `-0.0 < +0.0`.
        #[inline(always)]
        fn $min(a: $t, b: $t) -> $t {
            // Equal (±0 included): or-ing the bits keeps a negative sign. Unordered: the or of a
            // NaN with anything has all exponent bits and a non-zero mantissa, so is NaN.
            let tie = <$t>::from_bits(a.to_bits() | b.to_bits());
            if a < b {
                a
            } else if b < a {
                b
            } else {
                tie
            }
        }
        /// NaN if either is NaN; `+0.0 > -0.0`.
        #[inline(always)]
        fn $max(a: $t, b: $t) -> $t {
            let equal = <$t>::from_bits(a.to_bits() & b.to_bits());
            let unordered = <$t>::from_bits(a.to_bits() | b.to_bits());
            if a > b {
                a
            } else if b > a {
                b
            } else if a == b {
                equal
            } else {
                unordered
            }
        }
    };
}
float_min_max!(min_f32, max_f32, f32);
float_min_max!(min_f64, max_f64, f64);

macro_rules! float_kind {
    ($t:ty, $c:ty, $min:ident, $max:ident, $round_scalar:path) => {
        impl Kind for $t {
            type S = $t;
            type Scale = $c;
            #[inline]
            fn scale_factor(factor: f64) -> $c {
                $round_scalar(factor)
            }
            #[inline(always)]
            fn scale(x: $c, s: $c) -> $c {
                x * s
            }
            #[inline(always)]
            fn div(x: $c, n: i64) -> $c {
                x / n as $c
            }
            #[inline(always)]
            fn add(a: $c, b: $c) -> $c {
                a + b
            }
            #[inline(always)]
            fn mul(a: $c, b: $c) -> $c {
                a * b
            }
            #[inline(always)]
            fn min(a: $c, b: $c) -> $c {
                $min(a, b)
            }
            #[inline(always)]
            fn max(a: $c, b: $c) -> $c {
                $max(a, b)
            }
            #[inline(always)]
            fn and(a: $c, b: $c) -> $c {
                <$c>::from_bits(a.to_bits() & b.to_bits())
            }
            #[inline(always)]
            fn or(a: $c, b: $c) -> $c {
                <$c>::from_bits(a.to_bits() | b.to_bits())
            }
            #[inline(always)]
            fn xor(a: $c, b: $c) -> $c {
                <$c>::from_bits(a.to_bits() ^ b.to_bits())
            }
        }
    };
}
// Scalars are rounded to the element type, through f32 for the half types as NCCL does.
fn scalar_f64(f: f64) -> f64 {
    f
}
fn scalar_f32(f: f64) -> f32 {
    f as f32
}
fn scalar_f16(f: f64) -> f32 {
    f16::from_f32(f as f32).to_f32()
}
fn scalar_bf16(f: f64) -> f32 {
    bf16::from_f32(f as f32).to_f32()
}
float_kind!(f64, f64, min_f64, max_f64, scalar_f64);
float_kind!(f32, f32, min_f32, max_f32, scalar_f32);
float_kind!(f16, f32, min_f32, max_f32, scalar_f16);
float_kind!(bf16, f32, min_f32, max_f32, scalar_bf16);

macro_rules! int_kind {
    ($($t:ty),*) => {$(
        impl Kind for $t {
            type S = $t;
            type Scale = f64;
            #[inline]
            fn scale_factor(factor: f64) -> f64 {
                factor
            }
            /// Multiplies as f64; `as` truncates toward zero and saturates (NaN gives 0).
            #[inline(always)]
            fn scale(x: $t, s: f64) -> $t {
                (x as f64 * s) as $t
            }
            /// Truncates toward zero; `|x / n| <= |x|`, so the cast back is exact.
            #[inline(always)]
            fn div(x: $t, n: i64) -> $t {
                (x as i64 / n) as $t
            }
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn mul(a: $t, b: $t) -> $t {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t {
                Ord::min(a, b)
            }
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t {
                Ord::max(a, b)
            }
            #[inline(always)]
            fn and(a: $t, b: $t) -> $t {
                a & b
            }
            #[inline(always)]
            fn or(a: $t, b: $t) -> $t {
                a | b
            }
            #[inline(always)]
            fn xor(a: $t, b: $t) -> $t {
                a ^ b
            }
        }
    )*};
}
int_kind!(i8, u8, i32, i64);

/// `DataType::Bool`: one byte, 0 is false and anything else true; results are 0 or 1.
enum Bool {}

impl Kind for Bool {
    type S = u8;
    type Scale = ();
    fn scale_factor(_: f64) {}
    #[inline(always)]
    fn scale(x: u8, _: ()) -> u8 {
        x
    }
    #[inline(always)]
    fn div(x: u8, _: i64) -> u8 {
        x
    }
    #[inline(always)]
    fn add(a: u8, b: u8) -> u8 {
        Self::or(a, b)
    }
    #[inline(always)]
    fn mul(a: u8, b: u8) -> u8 {
        Self::and(a, b)
    }
    #[inline(always)]
    fn min(a: u8, b: u8) -> u8 {
        Self::and(a, b)
    }
    #[inline(always)]
    fn max(a: u8, b: u8) -> u8 {
        Self::or(a, b)
    }
    #[inline(always)]
    fn and(a: u8, b: u8) -> u8 {
        u8::from((a != 0) & (b != 0))
    }
    #[inline(always)]
    fn or(a: u8, b: u8) -> u8 {
        u8::from((a | b) != 0)
    }
    #[inline(always)]
    fn xor(a: u8, b: u8) -> u8 {
        u8::from((a != 0) ^ (b != 0))
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    thread_local! {
        /// Makes this thread's kernels take the portable loops even where AVX2 is available.
        pub(super) static PORTABLE_ONLY: Cell<bool> = const { Cell::new(false) };
    }

    /// The code paths this machine can run: the AVX2 copy where the CPU has it, and always the
    /// portable one.
    fn paths() -> Vec<bool> {
        #[cfg(target_arch = "x86_64")]
        if has_avx2_f16c() {
            return vec![false, true];
        }
        println!("no AVX2+F16C on this CPU: testing the portable kernels only");
        vec![true]
    }

    /// One element as the reference sees it: floats widened to f64 (exact for every stored
    /// float), integers to i128, bools to bool.
    #[derive(Clone, Copy, Debug)]
    enum V {
        F(f64),
        I(i128),
        B(bool),
    }

    fn decode(t: DataType, b: &[u8]) -> V {
        match t {
            DataType::F16 => V::F(f16::from_le_bytes([b[0], b[1]]).to_f64()),
            DataType::BF16 => V::F(bf16::from_le_bytes([b[0], b[1]]).to_f64()),
            DataType::F32 => V::F(f32::from_le_bytes(b.try_into().unwrap()).into()),
            DataType::F64 => V::F(f64::from_le_bytes(b.try_into().unwrap())),
            DataType::I8 => V::I(i8::from_le_bytes([b[0]]).into()),
            DataType::U8 => V::I(b[0].into()),
            DataType::I32 => V::I(i32::from_le_bytes(b.try_into().unwrap()).into()),
            DataType::I64 => V::I(i64::from_le_bytes(b.try_into().unwrap()).into()),
            DataType::Bool => V::B(b[0] != 0),
        }
    }

    /// Rounds (floats: to nearest even; f64 -> f32 -> half is exact-then-once-rounded for
    /// results of one operation on representable operands) or wraps (integers) into `t`.
    fn encode(t: DataType, v: V, out: &mut [u8]) {
        match (t, v) {
            (DataType::F16, V::F(x)) => out.copy_from_slice(&f16::from_f32(x as f32).to_le_bytes()),
            (DataType::BF16, V::F(x)) => {
                out.copy_from_slice(&bf16::from_f32(x as f32).to_le_bytes())
            }
            (DataType::F32, V::F(x)) => out.copy_from_slice(&(x as f32).to_le_bytes()),
            (DataType::F64, V::F(x)) => out.copy_from_slice(&x.to_le_bytes()),
            (DataType::I8, V::I(x)) => out.copy_from_slice(&(x as i8).to_le_bytes()),
            (DataType::U8, V::I(x)) => out.copy_from_slice(&(x as u8).to_le_bytes()),
            (DataType::I32, V::I(x)) => out.copy_from_slice(&(x as i32).to_le_bytes()),
            (DataType::I64, V::I(x)) => out.copy_from_slice(&(x as i64).to_le_bytes()),
            (DataType::Bool, V::B(x)) => out[0] = u8::from(x),
            _ => unreachable!("{t} {v:?}"),
        }
    }

    /// Element-at-a-time reference for the three steps.
    struct Ref {
        t: DataType,
        op: ReduceOp,
        nranks: usize,
    }

    impl Ref {
        /// The scalar a float input is multiplied by, rounded to the dtype as the kernel does.
        fn float_scalar(&self) -> Option<f64> {
            let f = match self.op {
                ReduceOp::PremulSum { factor } => factor,
                ReduceOp::Avg => 1.0 / self.nranks as f64,
                _ => return None,
            };
            Some(match self.t {
                DataType::F16 => f16::from_f32(f as f32).to_f64(),
                DataType::BF16 => bf16::from_f32(f as f32).to_f64(),
                DataType::F32 => f64::from(f as f32),
                _ => f,
            })
        }

        fn pre(&self, x: V) -> V {
            match (x, self.op) {
                (V::F(x), _) => V::F(self.float_scalar().map_or(x, |k| x * k)),
                (V::I(x), ReduceOp::PremulSum { factor }) => {
                    let p = x as f64 * factor;
                    V::I(match self.t {
                        DataType::I8 => (p as i8).into(),
                        DataType::U8 => (p as u8).into(),
                        DataType::I32 => (p as i32).into(),
                        _ => (p as i64).into(),
                    })
                }
                (x, _) => x,
            }
        }

        fn comb(&self, a: V, b: V) -> V {
            use ReduceOp as O;
            match (a, b) {
                (V::F(a), V::F(b)) => V::F(match self.op {
                    O::Sum | O::Avg | O::PremulSum { .. } => a + b,
                    O::Product => a * b,
                    O::Min | O::Max if a.is_nan() || b.is_nan() => f64::NAN,
                    O::Min if a == b => [a, b][usize::from(a.is_sign_positive())],
                    O::Max if a == b => [a, b][usize::from(a.is_sign_negative())],
                    O::Min => a.min(b),
                    O::Max => a.max(b),
                    op => unreachable!("{op}"),
                }),
                (V::I(a), V::I(b)) => V::I(match self.op {
                    O::Sum | O::Avg | O::PremulSum { .. } => a + b,
                    O::Product => a * b,
                    O::Min => a.min(b),
                    O::Max => a.max(b),
                    O::BAnd => a & b,
                    O::BOr => a | b,
                    O::BXor => a ^ b,
                }),
                (V::B(a), V::B(b)) => V::B(match self.op {
                    O::Sum | O::Max | O::BOr => a || b,
                    O::Product | O::Min | O::BAnd => a && b,
                    O::BXor => a ^ b,
                    op => unreachable!("{op}"),
                }),
                _ => unreachable!(),
            }
        }

        fn finish(&self, x: V) -> V {
            match (x, self.op) {
                (V::I(x), ReduceOp::Avg) => V::I(x / self.nranks as i128),
                (x, _) => x,
            }
        }

        /// Applies `f` element by element over `ins`, rounding the result into the dtype.
        fn each(&self, ins: &[&[u8]], f: impl Fn(&[V]) -> V) -> Vec<u8> {
            let es = self.t.size_bytes();
            let n = ins[0].len() / es;
            let mut out = vec![0u8; n * es];
            for i in 0..n {
                let vs: Vec<V> = ins
                    .iter()
                    .map(|b| decode(self.t, &b[i * es..][..es]))
                    .collect();
                encode(self.t, f(&vs), &mut out[i * es..][..es]);
            }
            out
        }

        /// `pre(x)` rounded to the dtype, as a stored partial.
        fn stored_pre(&self, x: V) -> V {
            let mut b = [0u8; 8];
            let b = &mut b[..self.t.size_bytes()];
            encode(self.t, self.pre(x), b);
            decode(self.t, b)
        }
    }

    /// Asserts `got` and `want` hold the same elements (bit for bit; any NaN equals any NaN),
    /// naming the first that differs.
    fn assert_same(t: DataType, got: &[u8], want: &[u8], ctx: &str) {
        let (got, want) = (canon(t, got), canon(t, want));
        assert_eq!(got.len(), want.len(), "{ctx}");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            panic!("{ctx}: element {i}: got {:x?}, want {:x?}", got[i], want[i]);
        }
    }

    /// Element bits, with every NaN made equal.
    fn canon(t: DataType, b: &[u8]) -> Vec<Option<u64>> {
        b.chunks(t.size_bytes())
            .map(|e| match decode(t, e) {
                V::F(x) if x.is_nan() => None,
                _ => {
                    let mut w = [0u8; 8];
                    w[..e.len()].copy_from_slice(e);
                    Some(u64::from_le_bytes(w))
                }
            })
            .collect()
    }

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        /// `n` elements of `t`: for floats mostly moderate values (so sums round), some
        /// arbitrary bit patterns (NaN, infinities, subnormals) and signed zeros.
        fn elems(&mut self, t: DataType, n: usize) -> Vec<u8> {
            let mut out = vec![0u8; n * t.size_bytes()];
            for e in out.chunks_mut(t.size_bytes()) {
                let r = self.next();
                if t == DataType::Bool {
                    e[0] = (r & 1) as u8;
                } else if !t.is_float() || r % 8 == 0 {
                    e.copy_from_slice(&r.to_le_bytes()[..e.len()]);
                } else if r % 8 == 1 {
                    encode(t, V::F(if r & 8 == 0 { 0.0 } else { -0.0 }), e);
                } else {
                    // Up to ~4600 in magnitude: mostly finite even in f16.
                    let mag = ((r >> 8) % 4001) as f64 - 2000.0;
                    let x = mag / 7.0 * 2f64.powi(((r >> 40) % 12) as i32 - 8);
                    encode(t, V::F(x), e);
                }
            }
            out
        }
    }

    /// A byte buffer whose slice starts `off` bytes past an 8-byte-aligned address.
    struct Buf {
        words: Vec<u64>,
        off: usize,
        len: usize,
    }

    impl Buf {
        fn new(bytes: &[u8], off: usize) -> Buf {
            let mut b = Buf {
                words: vec![0; bytes.len() / 8 + 2],
                off,
                len: bytes.len(),
            };
            b.get_mut().copy_from_slice(bytes);
            b
        }

        fn get(&self) -> &[u8] {
            &bytemuck::cast_slice(&self.words)[self.off..][..self.len]
        }

        fn get_mut(&mut self) -> &mut [u8] {
            &mut bytemuck::cast_slice_mut(&mut self.words)[self.off..][..self.len]
        }
    }

    fn valid_pairs() -> Vec<(DataType, ReduceOp)> {
        let mut ops = ReduceOp::ALL.to_vec();
        ops.push(ReduceOp::PremulSum { factor: -0.3 });
        let pairs: Vec<_> = DataType::ALL
            .into_iter()
            .flat_map(|t| ops.iter().map(move |&op| (t, op)))
            .filter(|&(t, op)| Reducer::new(t, op, 3).is_ok())
            .collect();
        // 4 float types x 7 ops, 4 integer types x 10 ops, bool x 7 ops.
        assert_eq!(pairs.len(), 4 * 7 + 4 * 10 + 7);
        pairs
    }

    #[test]
    fn every_dtype_and_op_matches_reference() {
        const LENS: [usize; 5] = [0, 1, 7, 1000, 4099];
        // Byte offsets of (dst, first source, second source): aligned, all misaligned, mixed.
        const OFFS: [[usize; 3]; 5] = [[0, 0, 0], [1, 1, 1], [0, 1, 0], [1, 0, 1], [0, 0, 1]];
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut checked = 0usize;
        let paths = paths();
        for (portable, (t, op)) in paths
            .iter()
            .flat_map(|&p| valid_pairs().into_iter().map(move |x| (p, x)))
        {
            PORTABLE_ONLY.with(|c| c.set(portable));
            let nranks = 3;
            let r = Reducer::new(t, op, nranks).unwrap();
            let reference = Ref { t, op, nranks };
            for n in LENS {
                let a = rng.elems(t, n);
                let b = rng.elems(t, n);
                let want_pre = reference.each(&[&a], |v| reference.pre(v[0]));
                let want_comb = reference.each(&[&a, &b], |v| reference.comb(v[0], v[1]));
                let want_comb_in = reference.each(&[&a, &b], |v| {
                    reference.comb(v[0], reference.stored_pre(v[1]))
                });
                let want_fin = reference.each(&[&a], |v| reference.finish(v[0]));
                for [od, o1, o2] in OFFS {
                    let ctx = format!("{op} {t} n={n} offsets={od},{o1},{o2} portable={portable}");
                    let check = |what: &str, got: &[u8], want: &[u8]| {
                        assert_same(t, got, want, &format!("{what}: {ctx}"));
                    };
                    let (sa, sb) = (Buf::new(&a, o1), Buf::new(&b, o2));

                    let mut d = Buf::new(&vec![0xA5; a.len()], od);
                    r.load_input(d.get_mut(), sa.get());
                    check("load_input", d.get(), &want_pre);

                    let mut d = Buf::new(&a, od);
                    r.prescale_in_place(d.get_mut());
                    check("prescale_in_place", d.get(), &want_pre);

                    let mut d = Buf::new(&a, od);
                    r.combine(d.get_mut(), sb.get());
                    check("combine", d.get(), &want_comb);

                    let mut d = Buf::new(&a, od);
                    r.combine_input(d.get_mut(), sb.get());
                    check("combine_input", d.get(), &want_comb_in);
                    // Fused is bit-for-bit the unfused sequence.
                    let mut pre_b = Buf::new(&b, o1);
                    r.prescale_in_place(pre_b.get_mut());
                    let mut unfused = Buf::new(&a, o2);
                    r.combine(unfused.get_mut(), pre_b.get());
                    check("combine_input vs unfused", d.get(), unfused.get());

                    let mut d = Buf::new(&vec![0x5A; a.len()], od);
                    r.combine3(d.get_mut(), sa.get(), sb.get());
                    check("combine3", d.get(), &want_comb);

                    let mut d = Buf::new(&a, od);
                    r.finish(d.get_mut());
                    check("finish", d.get(), &want_fin);
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, paths.len() * 75 * 5 * 5);
    }

    #[test]
    fn fold_is_bit_for_bit_the_pairwise_sequence() {
        // Source counts from a copy to past two passes of FOLD_WIDTH; lengths around a block.
        const SOURCES: [usize; 6] = [1, 2, 3, 4, 5, 9];
        const LENS: [usize; 3] = [0, 7, 1000];
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let mut checked = 0usize;
        let paths = paths();
        for (portable, (t, op)) in paths
            .iter()
            .flat_map(|&p| valid_pairs().into_iter().map(move |x| (p, x)))
        {
            PORTABLE_ONLY.with(|c| c.set(portable));
            let r = Reducer::new(t, op, 3).unwrap();
            for (k, n) in SOURCES
                .into_iter()
                .flat_map(|k| LENS.into_iter().map(move |n| (k, n)))
            {
                // Every other source and the destination start at an odd address.
                let srcs: Vec<Buf> = (0..k).map(|i| Buf::new(&rng.elems(t, n), i % 2)).collect();
                let views: Vec<&[u8]> = srcs.iter().map(Buf::get).collect();
                let mut want = Buf::new(views[0], 0);
                for s in &views[1..] {
                    r.combine(want.get_mut(), s);
                }
                let mut got = Buf::new(&vec![0x5A; views[0].len()], 1);
                r.fold(got.get_mut(), &views);
                let ctx = format!("{op} {t} sources={k} n={n} portable={portable}");
                // A NaN's payload depends on which operand the compiler puts first.
                assert_same(t, got.get(), want.get(), &ctx);
                checked += 1;
            }
        }
        assert_eq!(checked, paths.len() * 75 * SOURCES.len() * LENS.len());
    }

    fn bytes<T: Pod>(v: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    fn vals<T: Pod>(b: &[u8]) -> Vec<T> {
        b.chunks(size_of::<T>())
            .map(bytemuck::pod_read_unaligned)
            .collect()
    }

    /// Reduces one contribution per rank the way a ring would, ending with finish.
    fn all_reduce<T: Pod>(r: &Reducer, inputs: &[Vec<T>]) -> Vec<T> {
        let mut acc = bytes(&inputs[0]);
        r.prescale_in_place(&mut acc);
        for x in &inputs[1..] {
            r.combine_input(&mut acc, &bytes(x));
        }
        r.finish(&mut acc);
        vals(&acc)
    }

    #[test]
    fn bf16_conversions_match_the_half_crate() {
        for h in 0..=u16::MAX {
            let (x, y) = (bf16::from_bits(h), bf16_to_f32(bf16::from_bits(h)));
            assert!(
                y.to_bits() == x.to_f32().to_bits() || y.is_nan() && x.is_nan(),
                "{h:#06x}"
            );
            if !x.is_nan() {
                assert_eq!(f32_to_bf16(y), x, "{h:#06x} round trip");
            }
        }
        // Every exponent and sign with a spread of mantissas, rounding ties included.
        let mut checked = 0;
        for u in (0..=u32::MAX)
            .step_by(8191)
            .chain((0..=u32::MAX).step_by(1 << 12))
        {
            for u in [
                u,
                u ^ 0x8000,
                u | 0x7FFF,
                u & !0xFFFF | 0x8000,
                u & !0x1FFFF | 0x8000,
            ] {
                let x = f32::from_bits(u);
                let b = f32_to_bf16(x);
                if x.is_nan() {
                    assert!(b.is_nan(), "{u:#010x}");
                } else {
                    assert_eq!(b.to_bits(), bf16::from_f32(x).to_bits(), "{u:#010x}");
                }
                checked += 1;
            }
        }
        assert!(checked > 5_000_000);
    }

    #[test]
    fn f16_conversions_match_the_half_crate() {
        let halves: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        // Every exponent and sign with a spread of mantissas, rounding ties included.
        let floats: Vec<f32> = (0..=u32::MAX)
            .step_by(8191)
            .flat_map(|u| {
                [
                    u,
                    u ^ 0x1000,
                    u | 0xFFF,
                    u & !0x1FFF | 0x1000,
                    u & !0x3FFF | 0x1000,
                ]
            })
            .map(f32::from_bits)
            .collect();
        for portable in paths() {
            PORTABLE_ONLY.with(|c| c.set(portable));
            // Odd lengths exercise the remainders of the 8-lane loops.
            for (src, n) in halves.chunks(BLOCK - 3).zip(0..) {
                let mut wide = vec![0f32; src.len()];
                widen_f16(src, &mut wide);
                for (h, x) in src.iter().zip(&wide) {
                    let want = h.to_f32();
                    assert!(
                        x.to_bits() == want.to_bits() || x.is_nan() && want.is_nan(),
                        "{n} {h:?}"
                    );
                }
            }
            for src in floats.chunks(BLOCK - 1) {
                let mut narrow = vec![f16::ZERO; src.len()];
                narrow_f16(src, &mut narrow);
                for (x, h) in src.iter().zip(&narrow) {
                    if x.is_nan() {
                        assert!(h.is_nan(), "{:#010x}", x.to_bits());
                    } else {
                        assert_eq!(
                            h.to_bits(),
                            f16::from_f32(*x).to_bits(),
                            "{:#010x}",
                            x.to_bits()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn avg_on_integers_truncates_toward_zero() {
        let r = Reducer::new(DataType::I32, ReduceOp::Avg, 2).unwrap();
        assert!(r.needs_finish() && !r.needs_prescale());
        assert_eq!(
            all_reduce(&r, &[vec![-3i32, 3, 7, -7], vec![0, 0, 0, 0]]),
            [-1, 1, 3, -3]
        );

        let r = Reducer::new(DataType::I8, ReduceOp::Avg, 3).unwrap();
        let got = all_reduce(&r, &[vec![-128i8, 100], vec![-1, 1], vec![0, 1]]);
        // The sum wraps like Sum would (-129 -> 127); then 127 / 3 = 42 and 102 / 3 = 34.
        assert_eq!(got, [42, 34]);

        let r = Reducer::new(DataType::U8, ReduceOp::Avg, 200).unwrap();
        let mut x = vec![199u8, 255];
        r.finish(&mut x);
        assert_eq!(x, [0, 1]);
    }

    #[test]
    fn avg_on_floats_prescales_by_one_over_n() {
        let r = Reducer::new(DataType::F32, ReduceOp::Avg, 4).unwrap();
        assert!(r.needs_prescale() && !r.needs_finish());
        let got = all_reduce(
            &r,
            &[
                vec![1f32, -8.0],
                vec![2.0, 0.0],
                vec![3.0, 0.0],
                vec![4.0, 0.0],
            ],
        );
        assert_eq!(got, [2.5, -2.0]);

        let r = Reducer::new(DataType::BF16, ReduceOp::Avg, 2).unwrap();
        let got = all_reduce(&r, &[vec![bf16::from_f32(3.0)], vec![bf16::from_f32(-1.0)]]);
        assert_eq!(got, [bf16::ONE]);
    }

    #[test]
    fn premul_sum_scales_each_input() {
        let r = Reducer::new(DataType::F64, ReduceOp::PremulSum { factor: 0.5 }, 2).unwrap();
        assert_eq!(
            all_reduce(&r, &[vec![2f64, 10.0], vec![4.0, -1.0]]),
            [3.0, 4.5]
        );

        // Integers multiply as f64 and truncate toward zero, per input.
        let r = Reducer::new(DataType::I64, ReduceOp::PremulSum { factor: 2.5 }, 2).unwrap();
        assert_eq!(
            all_reduce(&r, &[vec![-3i64, 3], vec![1, 1]]),
            [-7 + 2, 7 + 2]
        );

        // The scalar is rounded to the element type first: f16(0.1) = 0.0999755859375.
        let r = Reducer::new(DataType::F16, ReduceOp::PremulSum { factor: 0.1 }, 1).unwrap();
        let mut one = bytes(&[f16::ONE]);
        r.prescale_in_place(&mut one);
        assert_eq!(vals::<f16>(&one), [f16::from_f64(0.0999755859375)]);
    }

    #[test]
    fn bool_outputs_stay_zero_or_one() {
        let a: Vec<u8> = (0..=255).collect();
        let b: Vec<u8> = (0..=255).rev().collect();
        for op in ReduceOp::ALL {
            let Ok(r) = Reducer::new(DataType::Bool, op, 2) else {
                continue;
            };
            let mut d = a.clone();
            r.combine(&mut d, &b);
            let mut d3 = vec![7u8; 256];
            r.combine3(&mut d3, &a, &b);
            assert_eq!(d, d3, "{op}");
            for (i, &x) in d.iter().enumerate() {
                let (p, q) = (a[i] != 0, b[i] != 0);
                let want = match op {
                    ReduceOp::Sum | ReduceOp::Max | ReduceOp::BOr => p || q,
                    ReduceOp::Product | ReduceOp::Min | ReduceOp::BAnd => p && q,
                    _ => p ^ q,
                };
                assert_eq!(x, u8::from(want), "{op} {} {}", a[i], b[i]);
            }
        }
    }

    #[test]
    fn float_min_max_propagate_nan_and_order_signed_zeros() {
        for t in [DataType::F16, DataType::BF16, DataType::F32, DataType::F64] {
            let enc = |xs: &[f64]| -> Vec<u8> {
                let mut out = vec![0u8; xs.len() * t.size_bytes()];
                for (x, e) in xs.iter().zip(out.chunks_mut(t.size_bytes())) {
                    encode(t, V::F(*x), e);
                }
                out
            };
            let dec = |b: &[u8]| -> Vec<f64> {
                b.chunks(t.size_bytes())
                    .map(|e| match decode(t, e) {
                        V::F(x) => x,
                        _ => unreachable!(),
                    })
                    .collect()
            };
            let nan = f64::NAN;
            let a = enc(&[nan, 1.0, nan, -0.0, 0.0, f64::INFINITY]);
            let b = enc(&[1.0, nan, nan, 0.0, -0.0, 2.0]);
            for (op, zero_sign_negative, last) in [
                (ReduceOp::Min, true, 2.0),
                (ReduceOp::Max, false, f64::INFINITY),
            ] {
                let r = Reducer::new(t, op, 2).unwrap();
                for (x, y) in [(&a, &b), (&b, &a)] {
                    let mut d = x.clone();
                    r.combine(&mut d, y);
                    let got = dec(&d);
                    assert!(got[..3].iter().all(|v| v.is_nan()), "{op} {t}: {got:?}");
                    for z in &got[3..5] {
                        assert!(
                            *z == 0.0 && z.is_sign_negative() == zero_sign_negative,
                            "{op}"
                        );
                    }
                    assert_eq!(got[5], last);
                }
            }
        }
    }

    #[test]
    fn invalid_pairs_are_refused() {
        for t in [DataType::F16, DataType::BF16, DataType::F32, DataType::F64] {
            for op in [ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor] {
                let err = Reducer::new(t, op, 2).unwrap_err();
                assert!(err.is_invalid_argument());
                assert!(
                    err.to_string().contains(&format!("{} on {t}", op.name())),
                    "{err}"
                );
            }
        }
        for op in [ReduceOp::Avg, ReduceOp::PremulSum { factor: 2.0 }] {
            let err = Reducer::new(DataType::Bool, op, 2).unwrap_err();
            assert!(err.is_invalid_argument());
            assert!(
                err.to_string().contains(&format!("{} on bool", op.name())),
                "{err}"
            );
        }
        let err = Reducer::new(DataType::F32, ReduceOp::Sum, 0).unwrap_err();
        assert!(err.to_string().contains("nranks"), "{err}");
    }

    #[test]
    #[should_panic(expected = "buffer lengths differ")]
    fn mismatched_lengths_panic() {
        let r = Reducer::new(DataType::F32, ReduceOp::Sum, 2).unwrap();
        r.combine(&mut [0u8; 8], &[0u8; 4]);
    }

    #[test]
    #[should_panic(expected = "whole number")]
    fn partial_elements_panic() {
        let r = Reducer::new(DataType::I64, ReduceOp::Sum, 2).unwrap();
        r.combine(&mut [0u8; 12], &[0u8; 12]);
    }
}
