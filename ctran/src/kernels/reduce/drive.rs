//! Running a kernel over byte slices: viewed as elements where aligned, else staged through
//! aligned stack blocks; in a copy compiled for AVX2 and F16C where the CPU has them.

use std::mem::size_of;

use super::storage::Storage;
use super::BLOCK;

/// Runs `kernel` on `dst` and `srcs` viewed as slices of `S`: directly when every slice is
/// aligned for `S`, else through aligned stack blocks of [`BLOCK`] elements. Lengths are equal
/// multiples of `size_of::<S>()` (checked by the caller).
///
/// On x86-64 CPUs with AVX2 and F16C (all since 2013) the loops run in a copy compiled for
/// those, chosen at run time: the build targets the x86-64 baseline (SSE2), whose 4-lane
/// vectors and lack of 64-bit compares leave a lot on the table (`i64` max runs 4x faster).
#[inline]
pub(super) fn drive<S: Storage, const N: usize>(
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
pub(super) fn has_avx2_f16c() -> bool {
    #[cfg(test)]
    if super::tests::PORTABLE_ONLY.with(std::cell::Cell::get) {
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
