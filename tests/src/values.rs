//! Test values for every dtype and reduce op, chosen so every result is exactly representable
//! (sums and products of small integers), and host-side reference results.

use ctran::{DataType, ReduceOp};
use half::{bf16, f16};

/// Encodes `vals` as elements of `dtype`.
pub fn encode(dtype: DataType, vals: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(vals.len() * dtype.size_bytes());
    for &v in vals {
        match dtype {
            DataType::F16 => out.extend(f16::from_f64(v).to_le_bytes()),
            DataType::BF16 => out.extend(bf16::from_f64(v).to_le_bytes()),
            DataType::F32 => out.extend((v as f32).to_le_bytes()),
            DataType::F64 => out.extend(v.to_le_bytes()),
            DataType::I8 => out.extend((v as i8).to_le_bytes()),
            DataType::U8 => out.extend((v as u8).to_le_bytes()),
            DataType::I32 => out.extend((v as i32).to_le_bytes()),
            DataType::I64 => out.extend((v as i64).to_le_bytes()),
            DataType::Bool => out.push(u8::from(v != 0.0)),
        }
    }
    out
}

/// Decodes elements of `dtype`.
pub fn decode(dtype: DataType, bytes: &[u8]) -> Vec<f64> {
    let es = dtype.size_bytes();
    bytes
        .chunks_exact(es)
        .map(|b| match dtype {
            DataType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
            DataType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
            DataType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
            DataType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
            DataType::I8 => i8::from_le_bytes([b[0]]) as f64,
            DataType::U8 => b[0] as f64,
            DataType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
            DataType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
            DataType::Bool => b[0] as f64,
        })
        .collect()
}

fn unsigned(dtype: DataType) -> bool {
    matches!(dtype, DataType::U8 | DataType::Bool)
}

/// Element `i` of `rank`'s input for `op` on `dtype`.
pub fn input(dtype: DataType, op: ReduceOp, rank: usize, i: usize) -> f64 {
    if dtype == DataType::Bool {
        return match op {
            ReduceOp::Product | ReduceOp::Min | ReduceOp::BAnd => f64::from((rank + i) % 4 != 0),
            _ => ((rank + i) % 2) as f64,
        };
    }
    match op {
        ReduceOp::Product => {
            if rank == 0 && i % 2 == 0 {
                2.0
            } else if (rank + i) % 3 == 0 && !unsigned(dtype) {
                -1.0
            } else {
                1.0
            }
        }
        ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => ((rank * 5 + i * 3) % 16) as f64,
        _ if unsigned(dtype) => ((rank * 3 + i) % 7) as f64,
        _ => ((rank * 3 + i) % 7) as f64 - 3.0,
    }
}

/// Whether `op` applies to `dtype` (bitwise ops need integers; avg/premul need numbers).
pub fn valid(dtype: DataType, op: ReduceOp) -> bool {
    let bitwise_on_float = op.is_bitwise() && dtype.is_float();
    let scaling_bool =
        dtype == DataType::Bool && matches!(op, ReduceOp::Avg | ReduceOp::PremulSum { .. });
    !(bitwise_on_float || scaling_bool)
}

fn to_type(dtype: DataType, v: f64) -> f64 {
    decode(dtype, &encode(dtype, &[v]))[0]
}

/// The reduction of element `i` over `n` ranks.
pub fn expected(dtype: DataType, op: ReduceOp, n: usize, i: usize) -> f64 {
    let xs = (0..n).map(|r| input(dtype, op, r, i));
    let ints = |f: fn(i64, i64) -> i64| xs.clone().map(|x| x as i64).reduce(f).unwrap_or(0) as f64;
    let v = match op {
        ReduceOp::Sum => xs.sum(),
        ReduceOp::Product => xs.product(),
        ReduceOp::Min => xs.fold(f64::INFINITY, f64::min),
        ReduceOp::Max => xs.fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::BAnd => ints(|a, b| a & b),
        ReduceOp::BOr => ints(|a, b| a | b),
        ReduceOp::BXor => ints(|a, b| a ^ b),
        ReduceOp::Avg if dtype.is_float() => xs.sum::<f64>() / n as f64,
        ReduceOp::Avg => (xs.sum::<f64>() / n as f64).trunc(),
        ReduceOp::PremulSum { factor } => xs
            .map(|x| to_type(dtype, x * factor).trunc_if(!dtype.is_float()))
            .sum(),
    };
    if dtype == DataType::Bool {
        return f64::from(v != 0.0);
    }
    v
}

trait TruncIf {
    fn trunc_if(self, cond: bool) -> f64;
}

impl TruncIf for f64 {
    fn trunc_if(self, cond: bool) -> f64 {
        if cond {
            self.trunc()
        } else {
            self
        }
    }
}

/// Whether `got` matches `want` for `dtype` (exact for integers and for results that are
/// representable; relative tolerance where an average rounds).
pub fn matches(dtype: DataType, op: ReduceOp, got: f64, want: f64) -> bool {
    let tol = match (dtype, op) {
        (_, ReduceOp::Avg) if dtype.is_float() => match dtype {
            DataType::F16 | DataType::BF16 => 2e-2,
            DataType::F32 => 1e-5,
            _ => 1e-12,
        },
        _ => 0.0,
    };
    (got - want).abs() <= tol * (1.0 + want.abs())
}
