//! Storage: how stored elements are brought into the type their arithmetic runs in.

use bytemuck::Pod;
use half::bf16;

/// A stored element type and the loops over its slices. The loops take the arithmetic as a
/// closure over the compute type [`Storage::C`]; slices passed to one call have equal lengths.
pub(super) trait Storage: Pod {
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

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::{bf16_to_f32, f32_to_bf16};

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
}
