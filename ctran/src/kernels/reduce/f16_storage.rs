//! `f16` storage: blocks converted with the CPU's conversion instructions (F16C on x86-64).

use half::f16;
use half::slice::HalfFloatSliceExt;

#[cfg(target_arch = "x86_64")]
use super::drive::has_avx2_f16c;
use super::storage::Storage;
use super::BLOCK;

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
/// `drive_avx2`.
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

#[cfg(test)]
mod tests {
    use half::f16;

    use super::super::tests::{paths, PORTABLE_ONLY};
    use super::{narrow_f16, widen_f16, BLOCK};

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
}
