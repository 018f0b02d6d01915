//! Element types, reduction operators and devices: the vocabulary every layer shares.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Element type of a buffer. Mirrors the dtypes torch.distributed backends accept.
// Exhaustive on purpose: every layer matches on it, and a new dtype must reach every match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Boolean stored as one byte (0 or 1).
    Bool,
}

impl DataType {
    /// Every supported type, in a stable order (used by tests and the benchmark).
    pub const ALL: [DataType; 9] = [
        DataType::F16,
        DataType::BF16,
        DataType::F32,
        DataType::F64,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::I64,
        DataType::Bool,
    ];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 | DataType::Bool => 1,
            DataType::F16 | DataType::BF16 => 2,
            DataType::F32 | DataType::I32 => 4,
            DataType::F64 | DataType::I64 => 8,
        }
    }

    /// True for floating-point types (bitwise reductions are refused on these).
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::BF16 | DataType::F32 | DataType::F64
        )
    }

    /// The short name used on command lines and in traces (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::F16 => "f16",
            DataType::BF16 => "bf16",
            DataType::F32 => "f32",
            DataType::F64 => "f64",
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::I32 => "i32",
            DataType::I64 => "i64",
            DataType::Bool => "bool",
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DataType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let t = match s.to_ascii_lowercase().as_str() {
            "f16" | "float16" | "half" => DataType::F16,
            "bf16" | "bfloat16" => DataType::BF16,
            "f32" | "float32" | "float" => DataType::F32,
            "f64" | "float64" | "double" => DataType::F64,
            "i8" | "int8" => DataType::I8,
            "u8" | "uint8" => DataType::U8,
            "i32" | "int32" | "int" => DataType::I32,
            "i64" | "int64" | "long" => DataType::I64,
            "bool" => DataType::Bool,
            _ => {
                return Err(Error::invalid(
                    "dtype",
                    "one of f16, bf16, f32, f64, i8, u8, i32, i64, bool",
                    s,
                ))
            }
        };
        Ok(t)
    }
}

/// Reduction operator. `PremulSum` multiplies every input by `factor` before summing
/// (NCCL's `ncclRedOpCreatePreMulSum`); `Avg` sums then divides by the number of ranks
/// (NCCL's `ncclAvg`; integer types divide with truncation).
// Exhaustive on purpose, like `DataType`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Product,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Bitwise and (integer and bool types only).
    BAnd,
    /// Bitwise or (integer and bool types only).
    BOr,
    /// Bitwise xor (integer and bool types only).
    BXor,
    /// Average over ranks.
    Avg,
    /// Sum of inputs each pre-multiplied by a scalar.
    PremulSum {
        /// The scalar every input is multiplied by.
        factor: f64,
    },
}

impl ReduceOp {
    /// Every operator with its default parameters (PREMUL_SUM with factor 2).
    pub const ALL: [ReduceOp; 9] = [
        ReduceOp::Sum,
        ReduceOp::Product,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::BAnd,
        ReduceOp::BOr,
        ReduceOp::BXor,
        ReduceOp::Avg,
        ReduceOp::PremulSum { factor: 2.0 },
    ];

    /// True for the bitwise operators.
    pub const fn is_bitwise(self) -> bool {
        matches!(self, ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor)
    }

    /// The short name used on command lines and in traces.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Product => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::BAnd => "band",
            ReduceOp::BOr => "bor",
            ReduceOp::BXor => "bxor",
            ReduceOp::Avg => "avg",
            ReduceOp::PremulSum { .. } => "premul_sum",
        }
    }

    /// Checks that this operator applies to `dtype`, with an error naming both if not: bitwise
    /// operators need integers or bools, AVG and PREMUL_SUM need numbers, and PREMUL_SUM's
    /// factor must be finite.
    pub fn check_dtype(self, dtype: DataType) -> Result<()> {
        if self.is_bitwise() && dtype.is_float() {
            return Err(Error::invalid(
                "op",
                "a bitwise reduce op (band, bor, bxor) only on integer or bool tensors",
                format!("{} on {}", self.name(), dtype),
            ));
        }
        if dtype == DataType::Bool && matches!(self, ReduceOp::Avg | ReduceOp::PremulSum { .. }) {
            return Err(Error::invalid(
                "op",
                "a reduce op that applies to bool (sum, prod, min, max, band, bor, bxor)",
                format!("{} on {}", self.name(), dtype),
            ));
        }
        if let ReduceOp::PremulSum { factor } = self {
            if !factor.is_finite() {
                return Err(Error::invalid(
                    "op",
                    "PREMUL_SUM with a finite factor",
                    factor,
                ));
            }
        }
        Ok(())
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReduceOp::PremulSum { factor } => write!(f, "premul_sum({factor})"),
            op => f.write_str(op.name()),
        }
    }
}

impl FromStr for ReduceOp {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let op = match s.to_ascii_lowercase().as_str() {
            "sum" => ReduceOp::Sum,
            "prod" | "product" => ReduceOp::Product,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            "band" => ReduceOp::BAnd,
            "bor" => ReduceOp::BOr,
            "bxor" => ReduceOp::BXor,
            "avg" => ReduceOp::Avg,
            "premul_sum" => ReduceOp::PremulSum { factor: 2.0 },
            _ => {
                return Err(Error::invalid(
                    "op",
                    "one of sum, prod, min, max, band, bor, bxor, avg, premul_sum",
                    s,
                ))
            }
        };
        Ok(op)
    }
}

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory.
    Cpu,
    /// Memory of CUDA device `N`.
    Cuda(u32),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl FromStr for Device {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        if s == "cpu" {
            return Ok(Device::Cpu);
        }
        if s == "cuda" {
            return Ok(Device::Cuda(0));
        }
        if let Some(idx) = s.strip_prefix("cuda:") {
            if let Ok(i) = idx.parse() {
                return Ok(Device::Cuda(i));
            }
        }
        Err(Error::invalid("device", "cpu, cuda or cuda:N", s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in DataType::ALL {
            assert_eq!(t.name().parse::<DataType>().unwrap(), t);
        }
        for op in ReduceOp::ALL {
            assert_eq!(op.name().parse::<ReduceOp>().unwrap().name(), op.name());
        }
        assert_eq!("cuda:3".parse::<Device>().unwrap(), Device::Cuda(3));
        assert!("tpu"
            .parse::<Device>()
            .unwrap_err()
            .to_string()
            .contains("device"));
    }

    #[test]
    fn bitwise_on_float_is_refused() {
        let err = ReduceOp::BXor.check_dtype(DataType::F32).unwrap_err();
        assert!(err.to_string().contains("bxor on f32"), "{err}");
        ReduceOp::BXor.check_dtype(DataType::I64).unwrap();
    }
}
