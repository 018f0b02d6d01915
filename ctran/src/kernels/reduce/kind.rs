//! Kind: the arithmetic of one dtype, in its compute type.

use half::{bf16, f16};

use super::storage::Storage;

/// Compute type of kind `K`.
pub(super) type C<K> = <<K as Kind>::S as Storage>::C;

/// The arithmetic of one [`DataType`]. Operators that [`Reducer::new`] refuses for a dtype
/// (bitwise ops on floats; scale and divide on `Bool`) are never called; they are still defined,
/// as the obvious bit-level or identity operation, so that dispatch needs no extra branch.
pub(super) trait Kind: Sized {
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
pub(super) enum Bool {}

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
