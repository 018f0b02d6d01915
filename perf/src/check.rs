//! Deterministic inputs and the results the host expects, for every (dtype, reduction).
//!
//! Inputs are small integers chosen so that every result is exact in every dtype:
//!
//! - data movement: `(rank * 131 + i * 7) % 97` (0..=96; its parity for bool), distinct
//!   enough across ranks and positions that a misplaced block shows;
//! - reductions: `((rank * 3 + i) % 7) - 3` (shifted to 0..=6 for u8); min and max use
//!   `((rank + i) % nranks) - 48` (not shifted for u8), so every rank holds the extreme at some
//!   positions and a lost contribution shows; products use 2 at one
//!   position in eight and -1 (3 for u8) at another, 1 elsewhere, so a product over 16 ranks
//!   stays within ±4; `avg` uses `nranks * v` with `v` in {-1, 0, 1} ({0, 1, 2} for u8), so
//!   each prescaled float input is `v` again and a lost contribution changes the result by a
//!   whole `v` (integer sums may wrap: the host wraps the same way); bool uses `(rank * 3 + i) % 5 != 0` for the and-like reductions
//!   (prod, min, band) and its negation for the others. Float inputs of ranks from 16 on
//!   are neutral (0, or 1 for products), which keeps sums exact in bf16 at any scale.
//!
//! Integer results wrap like the engine's arithmetic, so the check holds even when a sum
//! overflows i8. Float results are compared exactly, except float `avg`, whose prescale by a
//! rounded `1/n` may be off by an ulp: its expected value is an integer and a result within
//! 0.5 of it passes (any lost or duplicated contribution moves it by at least 1).

use ctran::{DataType, ReduceOp};
use half::{bf16, f16};

/// Element types the check reads and writes.
pub(crate) trait Elem: torchcomms::Element + PartialEq {
    /// The integer `v` as this type (integers wrap, bool is `v != 0`).
    fn from_i64(v: i64) -> Self;
    /// `v` as this type (integers truncate toward zero and saturate, like `as`).
    fn from_f64(v: f64) -> Self;
    /// The value as f64.
    fn to_f64(self) -> f64;
    /// The value as i64 (floats truncate).
    fn to_i64(self) -> i64;
}

macro_rules! elem_int {
    ($($t:ty),*) => {$(
        #[allow(clippy::unnecessary_cast, clippy::cast_lossless)]
        impl Elem for $t {
            fn from_i64(v: i64) -> Self { v as $t }
            fn from_f64(v: f64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
            fn to_i64(self) -> i64 { self as i64 }
        }
    )*};
}
elem_int!(i8, u8, i32, i64);

macro_rules! elem_float {
    ($($t:ty),*) => {$(
        #[allow(clippy::unnecessary_cast, clippy::cast_lossless)]
        impl Elem for $t {
            fn from_i64(v: i64) -> Self { v as $t }
            fn from_f64(v: f64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
            fn to_i64(self) -> i64 { self as i64 }
        }
    )*};
}
elem_float!(f32, f64);

macro_rules! elem_half {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn from_i64(v: i64) -> Self { <$t>::from_f64(v as f64) }
            fn from_f64(v: f64) -> Self { <$t>::from_f64(v) }
            fn to_f64(self) -> f64 { <$t>::to_f64(self) }
            fn to_i64(self) -> i64 { <$t>::to_f64(self) as i64 }
        }
    )*};
}
elem_half!(f16, bf16);

impl Elem for bool {
    fn from_i64(v: i64) -> Self {
        v != 0
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn to_f64(self) -> f64 {
        f64::from(u8::from(self))
    }
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
}

/// Runs `$body` with `$t` the element type of `$dtype`; `$other` for dtypes the check does not
/// know (the enum is non-exhaustive).
macro_rules! with_elem {
    ($dtype:expr, $t:ident => $body:expr, _ => $other:expr) => {
        match $dtype {
            ctran::DataType::F16 => {
                type $t = half::f16;
                $body
            }
            ctran::DataType::BF16 => {
                type $t = half::bf16;
                $body
            }
            ctran::DataType::F32 => {
                type $t = f32;
                $body
            }
            ctran::DataType::F64 => {
                type $t = f64;
                $body
            }
            ctran::DataType::I8 => {
                type $t = i8;
                $body
            }
            ctran::DataType::U8 => {
                type $t = u8;
                $body
            }
            ctran::DataType::I32 => {
                type $t = i32;
                $body
            }
            ctran::DataType::I64 => {
                type $t = i64;
                $body
            }
            ctran::DataType::Bool => {
                type $t = bool;
                $body
            }
            #[allow(unreachable_patterns)]
            _ => $other,
        }
    };
}
pub(crate) use with_elem;

/// Why a (dtype, reduction) pair does not exist, or `None` when it does.
pub(crate) fn invalid_combo(dtype: DataType, op: ReduceOp) -> Option<&'static str> {
    if op.is_bitwise() && dtype.is_float() {
        Some("bitwise reduction on a float type")
    } else if dtype == DataType::Bool && matches!(op, ReduceOp::Avg | ReduceOp::PremulSum { .. }) {
        Some("avg and premul_sum do not apply to bool")
    } else {
        None
    }
}

/// What an input holds.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Pattern {
    /// Data that is only moved.
    Move,
    /// Data that is reduced with this operator.
    Reduce(ReduceOp),
}

/// Ranks from this one on contribute neutral values to float reductions.
const FLOAT_EXACT_RANKS: usize = 16;

/// Element `i` of `rank`'s input, as an integer to convert to the dtype.
pub(crate) fn input_value(dtype: DataType, pat: Pattern, n: usize, rank: usize, i: usize) -> i64 {
    let (r, i) = (rank as u64, i as u64);
    match pat {
        Pattern::Move => {
            let m = ((r.wrapping_mul(131).wrapping_add(i.wrapping_mul(7))) % 97) as i64;
            if dtype == DataType::Bool {
                m & 1
            } else {
                m
            }
        }
        Pattern::Reduce(op) => {
            if dtype == DataType::Bool {
                // Mostly true for the and-like reductions, mostly false for the or-like ones.
                let hit = (r * 3 + i) % 5 == 0;
                let and_like = matches!(op, ReduceOp::Product | ReduceOp::Min | ReduceOp::BAnd);
                return i64::from(hit != and_like);
            }
            let neutral = dtype.is_float() && rank >= FLOAT_EXACT_RANKS;
            match op {
                ReduceOp::Product => match (r + i) % 8 {
                    _ if neutral => 1,
                    0 => 2,
                    3 if dtype == DataType::U8 => 3,
                    3 => -1,
                    _ => 1,
                },
                ReduceOp::Min | ReduceOp::Max => {
                    // Every rank holds the extreme somewhere, so a lost rank shows.
                    let m = ((r + i) % n.max(1) as u64 % 97) as i64;
                    if dtype == DataType::U8 {
                        m
                    } else {
                        m - 48
                    }
                }
                _ if neutral => 0,
                ReduceOp::Avg => {
                    let v = ((r + i) % 3) as i64;
                    n as i64 * if dtype == DataType::U8 { v } else { v - 1 }
                }
                _ => {
                    let b = ((r * 3 + i) % 7) as i64 - 3;
                    if dtype == DataType::U8 {
                        b + 3
                    } else {
                        b
                    }
                }
            }
        }
    }
}

/// An expected element.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Expect {
    /// An integer, after wrapping to the dtype.
    Int(i64),
    /// An exactly representable float.
    Float(f64),
    /// A float known to within 0.5 (float `avg`).
    Near(f64),
    /// A bool.
    Bool(bool),
}

impl Expect {
    /// The raw input `v` read back as `T`.
    pub(crate) fn raw<T: Elem>(v: i64) -> Expect {
        let t = T::from_i64(v);
        match T::DTYPE {
            DataType::Bool => Expect::Bool(v != 0),
            d if d.is_float() => Expect::Float(t.to_f64()),
            _ => Expect::Int(t.to_i64()),
        }
    }

    /// True when `got` is this value.
    pub(crate) fn matches<T: Elem>(self, got: T) -> bool {
        match self {
            Expect::Int(v) => got.to_i64() == v,
            Expect::Float(v) => got.to_f64() == v,
            Expect::Near(v) => (got.to_f64() - v).abs() < 0.5,
            Expect::Bool(b) => (got.to_i64() != 0) == b,
        }
    }
}

/// The reduction with `op` over `n` ranks of element `i` of their inputs.
pub(crate) fn reduce_expected<T: Elem>(op: ReduceOp, n: usize, i: usize) -> Expect {
    let dtype = T::DTYPE;
    let vals = (0..n).map(|r| input_value(dtype, Pattern::Reduce(op), n, r, i));
    if dtype == DataType::Bool {
        let mut bits = vals.map(|v| v != 0);
        return Expect::Bool(match op {
            ReduceOp::Product | ReduceOp::Min | ReduceOp::BAnd => bits.all(|b| b),
            ReduceOp::BXor => bits.filter(|&b| b).count() % 2 == 1,
            _ => bits.any(|b| b),
        });
    }
    if dtype.is_float() {
        let xs = vals.map(|v| v as f64);
        return match op {
            ReduceOp::Product => Expect::Float(xs.product()),
            ReduceOp::Min => Expect::Float(xs.fold(f64::INFINITY, f64::min)),
            ReduceOp::Max => Expect::Float(xs.fold(f64::NEG_INFINITY, f64::max)),
            ReduceOp::Avg => Expect::Near(xs.sum::<f64>() / n as f64),
            ReduceOp::PremulSum { factor } => Expect::Float(xs.map(|x| x * factor).sum()),
            _ => Expect::Float(xs.sum()),
        };
    }
    let wrap = |v: i64| T::from_i64(v).to_i64();
    let v = match op {
        ReduceOp::Product => wrap(vals.fold(1i64, i64::wrapping_mul)),
        ReduceOp::Min => vals.min().unwrap_or(0),
        ReduceOp::Max => vals.max().unwrap_or(0),
        ReduceOp::BAnd => wrap(vals.fold(-1, |a, b| a & b)),
        ReduceOp::BOr => wrap(vals.fold(0, |a, b| a | b)),
        ReduceOp::BXor => wrap(vals.fold(0, |a, b| a ^ b)),
        ReduceOp::Avg => wrap(vals.fold(0i64, i64::wrapping_add)) / n.max(1) as i64,
        ReduceOp::PremulSum { factor } => wrap(
            vals.map(|x| T::from_f64(x as f64 * factor).to_i64())
                .fold(0i64, i64::wrapping_add),
        ),
        _ => wrap(vals.fold(0i64, i64::wrapping_add)),
    };
    Expect::Int(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine's reduction (the real kernels, pairwise in rank order) agrees with the
    /// host's expectation for every dtype, reduction and rank count up to 16.
    #[test]
    fn expectations_match_the_engine_kernels() {
        fn run<T: Elem>() {
            for op in ReduceOp::ALL {
                if invalid_combo(T::DTYPE, op).is_some() {
                    continue;
                }
                for (n, lose) in [1, 2, 3, 5, 7, 8, 9, 13, 16]
                    .into_iter()
                    .flat_map(|n| [(n, None), (n, Some(n / 2))])
                {
                    if n == 1 && lose.is_some() {
                        continue;
                    }
                    let red = ctran::kernels::Reducer::new(T::DTYPE, op, n).unwrap();
                    let len = 64;
                    let mut acc: Option<Vec<T>> = None;
                    for r in (0..n).filter(|&r| Some(r) != lose) {
                        let x: Vec<T> = (0..len)
                            .map(|i| {
                                T::from_i64(input_value(T::DTYPE, Pattern::Reduce(op), n, r, i))
                            })
                            .collect();
                        let xb = bytes_of(&x);
                        acc = Some(match acc {
                            None => {
                                let mut d = vec![0u8; xb.len()];
                                red.load_input(&mut d, &xb);
                                from_bytes(&d)
                            }
                            Some(a) => {
                                let mut d = bytes_of(&a);
                                red.combine_input(&mut d, &xb);
                                from_bytes(&d)
                            }
                        });
                    }
                    let mut d = bytes_of(&acc.unwrap());
                    red.finish(&mut d);
                    let got: Vec<T> = from_bytes(&d);
                    let wrong = got
                        .into_iter()
                        .enumerate()
                        .filter(|&(i, g)| !reduce_expected::<T>(op, n, i).matches(g))
                        .count();
                    // Idempotent reductions (and, or, bool) saturate over many ranks: a lost
                    // contribution need not show there.
                    let saturates =
                        T::DTYPE == DataType::Bool || matches!(op, ReduceOp::BAnd | ReduceOp::BOr);
                    match lose {
                        // Every element is right when every rank contributes.
                        None => assert_eq!(wrong, 0, "{} {op} n={n}", T::DTYPE),
                        // A lost contribution shows.
                        Some(r) if !saturates || n <= 3 => {
                            assert!(wrong > 0, "{} {op} n={n} without rank {r}", T::DTYPE)
                        }
                        Some(_) => {}
                    }
                }
            }
        }
        for d in DataType::ALL {
            with_elem!(d, T => run::<T>(), _ => panic!("unknown dtype {d}"));
        }
    }

    fn bytes_of<T: Elem>(v: &[T]) -> Vec<u8> {
        let size = T::DTYPE.size_bytes();
        let mut out = Vec::with_capacity(v.len() * size);
        for &x in v {
            let b: Vec<u8> = match T::DTYPE {
                DataType::Bool => vec![x.to_i64() as u8],
                DataType::F16 => f16::from_f64(x.to_f64()).to_le_bytes().to_vec(),
                DataType::BF16 => bf16::from_f64(x.to_f64()).to_le_bytes().to_vec(),
                DataType::F32 => (x.to_f64() as f32).to_le_bytes().to_vec(),
                DataType::F64 => x.to_f64().to_le_bytes().to_vec(),
                _ => x.to_i64().to_le_bytes()[..size].to_vec(),
            };
            out.extend(b);
        }
        out
    }

    fn from_bytes<T: Elem>(b: &[u8]) -> Vec<T> {
        let size = T::DTYPE.size_bytes();
        b.chunks(size)
            .map(|c| match T::DTYPE {
                DataType::Bool => T::from_i64(i64::from(c[0])),
                DataType::F16 => T::from_f64(f16::from_le_bytes([c[0], c[1]]).to_f64()),
                DataType::BF16 => T::from_f64(bf16::from_le_bytes([c[0], c[1]]).to_f64()),
                DataType::F32 => T::from_f64(f64::from(f32::from_le_bytes(c.try_into().unwrap()))),
                DataType::F64 => T::from_f64(f64::from_le_bytes(c.try_into().unwrap())),
                DataType::I8 => T::from_i64(i64::from(c[0] as i8)),
                DataType::U8 => T::from_i64(i64::from(c[0])),
                DataType::I32 => T::from_i64(i64::from(i32::from_le_bytes(c.try_into().unwrap()))),
                _ => T::from_i64(i64::from_le_bytes(c.try_into().unwrap())),
            })
            .collect()
    }

    #[test]
    fn invalid_combos() {
        assert!(invalid_combo(DataType::F32, ReduceOp::BAnd).is_some());
        assert!(invalid_combo(DataType::Bool, ReduceOp::Avg).is_some());
        assert!(invalid_combo(DataType::Bool, ReduceOp::BXor).is_none());
        assert!(invalid_combo(DataType::I8, ReduceOp::BXor).is_none());
    }
}
