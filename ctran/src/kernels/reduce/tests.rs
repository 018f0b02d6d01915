use std::cell::Cell;

use bytemuck::Pod;

use super::drive::has_avx2_f16c;
use super::*;

thread_local! {
    /// Makes this thread's kernels take the portable loops even where AVX2 is available.
    pub(super) static PORTABLE_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// The code paths this machine can run: the AVX2 copy where the CPU has it, and always the
/// portable one.
pub(super) fn paths() -> Vec<bool> {
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
        (DataType::BF16, V::F(x)) => out.copy_from_slice(&bf16::from_f32(x as f32).to_le_bytes()),
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

/// Runs `case(reducer, dtype, sources, len)` for every path x (dtype, op) pair x source count
/// x length, and checks every case ran.
fn each_fold_case(
    sources: &[usize],
    lens: &[usize],
    mut case: impl FnMut(&Reducer, DataType, usize, usize, bool),
) {
    let mut checked = 0usize;
    let paths = paths();
    for (portable, (t, op)) in paths
        .iter()
        .flat_map(|&p| valid_pairs().into_iter().map(move |x| (p, x)))
    {
        PORTABLE_ONLY.with(|c| c.set(portable));
        let r = Reducer::new(t, op, 3).unwrap();
        for &k in sources {
            for &n in lens {
                case(&r, t, k, n, portable);
                checked += 1;
            }
        }
    }
    assert_eq!(checked, paths.len() * 75 * sources.len() * lens.len());
}

#[test]
fn fold_is_bit_for_bit_the_pairwise_sequence() {
    // Source counts from a copy to past two passes of FOLD_WIDTH; lengths around a block.
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    each_fold_case(
        &[1, 2, 3, 4, 5, 9],
        &[0, 7, 1000],
        |r, t, k, n, portable| {
            // Every other source and the destination start at an odd address.
            let srcs: Vec<Buf> = (0..k).map(|i| Buf::new(&rng.elems(t, n), i % 2)).collect();
            let views: Vec<&[u8]> = srcs.iter().map(Buf::get).collect();
            let mut want = Buf::new(views[0], 0);
            for s in &views[1..] {
                r.combine(want.get_mut(), s);
            }
            let mut got = Buf::new(&vec![0x5A; views[0].len()], 1);
            r.fold(got.get_mut(), &views);
            let ctx = format!("{} {t} sources={k} n={n} portable={portable}", r.op());
            // A NaN's payload depends on which operand the compiler puts first.
            assert_same(t, got.get(), want.get(), &ctx);
        },
    );
}

#[test]
fn fold_onto_is_bit_for_bit_combining_each_source_in_turn() {
    // Source counts from none to past two passes of FOLD_WIDTH; lengths around a block.
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    each_fold_case(
        &[0, 1, 3, 4, 5, 9],
        &[0, 7, 1000],
        |r, t, k, n, portable| {
            // Every other source and the destination start at an odd address.
            let start = rng.elems(t, n);
            let srcs: Vec<Buf> = (0..k).map(|i| Buf::new(&rng.elems(t, n), i % 2)).collect();
            let views: Vec<&[u8]> = srcs.iter().map(Buf::get).collect();
            let mut want = Buf::new(&start, 0);
            for s in &views {
                r.combine(want.get_mut(), s);
            }
            let mut got = Buf::new(&start, 1);
            r.fold_onto(got.get_mut(), &views);
            let ctx = format!("{} {t} sources={k} n={n} portable={portable}", r.op());
            assert_same(t, got.get(), want.get(), &ctx);
        },
    );
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
