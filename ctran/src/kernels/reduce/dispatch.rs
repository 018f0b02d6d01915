//! Dispatch: one match per call, to code monomorphised for the element type and the operator.

use super::drive::drive;
use super::kind::Kind;
use super::storage::Storage;
use super::Pairwise;

pub(super) fn prescale_in_place<K: Kind>(factor: f64, buf: &mut [u8]) {
    let s = K::scale_factor(factor);
    drive::<K::S, 0>(buf, [], |d, []| K::S::map_in_place(d, |x| K::scale(x, s)));
}

pub(super) fn load_input<K: Kind>(factor: f64, dst: &mut [u8], src: &[u8]) {
    let s = K::scale_factor(factor);
    drive::<K::S, 1>(dst, [src], |d, [x]| K::S::map(d, x, |x| K::scale(x, s)));
}

pub(super) fn combine_input<K: Kind>(factor: f64, dst: &mut [u8], src: &[u8]) {
    let s = K::scale_factor(factor);
    drive::<K::S, 1>(dst, [src], |d, [x]| {
        K::S::zip_in_place_pre(d, x, |x| K::scale(x, s), K::add);
    });
}

pub(super) fn finish<K: Kind>(n: i64, buf: &mut [u8]) {
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

pub(super) fn combine<K: Kind>(op: Pairwise, dst: &mut [u8], src: &[u8]) {
    fn go<S: Storage>(dst: &mut [u8], src: &[u8], f: impl Fn(S::C, S::C) -> S::C) {
        drive::<S, 1>(dst, [src], |d, [s]| S::zip_in_place(d, s, &f));
    }
    with_pairwise!(op, K, f => go::<K::S>(dst, src, f))
}

pub(super) fn combine3<K: Kind>(op: Pairwise, dst: &mut [u8], a: &[u8], b: &[u8]) {
    fn go<S: Storage>(dst: &mut [u8], a: &[u8], b: &[u8], f: impl Fn(S::C, S::C) -> S::C) {
        drive::<S, 2>(dst, [a, b], |d, [a, b]| S::zip(d, a, b, &f));
    }
    with_pairwise!(op, K, f => go::<K::S>(dst, a, b, f))
}

/// `dst = srcs[0] ⊕ …` (`onto_dst` false) or `dst = dst ⊕ srcs[0] ⊕ …` (true), for 1 to
/// [`FOLD_WIDTH`](super::FOLD_WIDTH) sources.
pub(super) fn fold<K: Kind>(op: Pairwise, dst: &mut [u8], srcs: &[&[u8]], onto_dst: bool) {
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
