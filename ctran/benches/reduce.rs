//! Throughput of `Reducer::combine` (`dst = dst ⊕ src`) and `Reducer::fold` (`dst = s0 ⊕ s1 ⊕ …`),
//! in bytes of `dst` per second.
//!
//! Each combine reads `dst` and `src` and writes `dst`, so memory traffic is three times the
//! reported figure. 64 KiB buffers stay in cache; 8 MiB ones measure memory bandwidth.
//!
//! Run with `cargo bench -p ctran --bench reduce` (add `-- --quick` for a short run).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput};
use ctran::kernels::Reducer;
use ctran::{DataType, ReduceOp};

const SIZES: [(usize, &str); 2] = [(64 << 10, "64KiB"), (8 << 20, "8MiB")];

/// A buffer of `len + 16` bytes in 8-byte-aligned storage, every byte `fill`: small values in
/// every dtype benchmarked, so sums stay finite and normal.
fn buffer(len: usize, fill: u8) -> Vec<u64> {
    vec![u64::from_ne_bytes([fill; 8]); len / 8 + 2]
}

fn combine(c: &mut Criterion) {
    let cases = [
        ("f32_sum", DataType::F32, ReduceOp::Sum, 0),
        ("bf16_sum", DataType::BF16, ReduceOp::Sum, 0),
        ("i64_max", DataType::I64, ReduceOp::Max, 0),
        ("f16_sum", DataType::F16, ReduceOp::Sum, 0),
        // The staged fallback for buffers at odd addresses.
        ("f32_sum_misaligned", DataType::F32, ReduceOp::Sum, 1),
    ];
    let mut group = c.benchmark_group("combine");
    for (name, dtype, op, off) in cases {
        let r = Reducer::new(dtype, op, 2).expect("valid pair");
        for (len, size) in SIZES {
            let mut dst = buffer(len, 0x21);
            let src = buffer(len, 0x01);
            group.throughput(Throughput::Bytes(len as u64));
            group.bench_function(BenchmarkId::new(name, size), |b| {
                let src = &bytemuck::cast_slice::<u64, u8>(&src)[off..off + len];
                let dst = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut dst)[off..off + len];
                b.iter(|| r.combine(black_box(&mut *dst), black_box(src)));
            });
        }
    }
    group.finish();
}

/// Direct reductions combine one contribution per rank into one result: `fold` in one pass
/// against the unfused sequence (`combine3`, then `combine` per further source), in bytes of
/// `dst` per second, for 4 and 8 sources.
fn fold(c: &mut Criterion) {
    let mut group = c.benchmark_group("fold");
    let r = Reducer::new(DataType::F32, ReduceOp::Sum, 8).expect("valid pair");
    for sources in [4, 8] {
        for (len, size) in SIZES {
            let mut dst = buffer(len, 0x21);
            let srcs: Vec<Vec<u64>> = (0..sources).map(|_| buffer(len, 0x01)).collect();
            let srcs: Vec<&[u8]> = srcs
                .iter()
                .map(|s| &bytemuck::cast_slice::<u64, u8>(s)[..len])
                .collect();
            let dst = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut dst)[..len];
            group.throughput(Throughput::Bytes(len as u64));
            let name = format!("f32_sum_{sources}_sources");
            group.bench_function(BenchmarkId::new(format!("{name}_fused"), size), |b| {
                b.iter(|| r.fold(black_box(&mut *dst), black_box(&srcs)));
            });
            group.bench_function(BenchmarkId::new(format!("{name}_unfused"), size), |b| {
                b.iter(|| {
                    r.combine3(black_box(&mut *dst), srcs[0], srcs[1]);
                    for s in &srcs[2..] {
                        r.combine(black_box(&mut *dst), black_box(s));
                    }
                });
            });
        }
    }
    group.finish();
}

// What `criterion_group!`/`criterion_main!` expand to, without their undocumented `pub fn`.
fn main() {
    let mut c = Criterion::default().configure_from_args();
    combine(&mut c);
    fold(&mut c);
    c.final_summary();
}
