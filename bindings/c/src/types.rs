//! Plain data of the C API: value types passed by value or through arrays, and the integer
//! codes of dtypes, reduce ops, devices and work states. Integer codes (not Rust enums) are
//! what C passes in, so an unknown value is an error the library reports, never undefined
//! behaviour. The conversions to the API's types live here and are safe.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};
use std::ptr;
use std::time::Duration;

use torchcomms::{DataType, Device, ReduceOp, WorkStatus};

use crate::status::{CError, CResult};

/// Element type of a buffer: one of the `TC_<TYPE>` constants.
pub type tc_dtype_t = i32;
/// IEEE 754 half precision (2 bytes).
pub const TC_FLOAT16: tc_dtype_t = 0;
/// bfloat16 (2 bytes).
pub const TC_BFLOAT16: tc_dtype_t = 1;
/// IEEE 754 single precision (4 bytes).
pub const TC_FLOAT32: tc_dtype_t = 2;
/// IEEE 754 double precision (8 bytes).
pub const TC_FLOAT64: tc_dtype_t = 3;
/// Signed 8-bit integer.
pub const TC_INT8: tc_dtype_t = 4;
/// Unsigned 8-bit integer.
pub const TC_UINT8: tc_dtype_t = 5;
/// Signed 32-bit integer.
pub const TC_INT32: tc_dtype_t = 6;
/// Signed 64-bit integer.
pub const TC_INT64: tc_dtype_t = 7;
/// Boolean stored as one byte holding 0 or 1.
pub const TC_BOOL: tc_dtype_t = 8;

/// Reduction operator: one of the `TC_<OP>` constants.
pub type tc_reduce_op_t = i32;
/// Sum.
pub const TC_SUM: tc_reduce_op_t = 0;
/// Product.
pub const TC_PRODUCT: tc_reduce_op_t = 1;
/// Minimum.
pub const TC_MIN: tc_reduce_op_t = 2;
/// Maximum.
pub const TC_MAX: tc_reduce_op_t = 3;
/// Bitwise and (integer and bool dtypes only).
pub const TC_BAND: tc_reduce_op_t = 4;
/// Bitwise or (integer and bool dtypes only).
pub const TC_BOR: tc_reduce_op_t = 5;
/// Bitwise xor (integer and bool dtypes only).
pub const TC_BXOR: tc_reduce_op_t = 6;
/// Average over ranks.
pub const TC_AVG: tc_reduce_op_t = 7;
/// Sum of inputs each multiplied first by `tc_op_options_t.premul_sum_factor`.
pub const TC_PREMUL_SUM: tc_reduce_op_t = 8;

/// Kind of device memory: one of the `TC_DEVICE_<KIND>` constants.
pub type tc_device_type_t = i32;
/// Host memory.
pub const TC_DEVICE_CPU: tc_device_type_t = 0;
/// CUDA device memory (of a CUDA communicator; operations follow the work on their `stream`).
pub const TC_DEVICE_CUDA: tc_device_type_t = 1;

/// Where asynchronous work stands: one of the `TC_WORK_<STATE>` constants.
pub type tc_work_status_t = i32;
/// Queued, not started.
pub const TC_WORK_NOT_STARTED: tc_work_status_t = 0;
/// Running.
pub const TC_WORK_IN_PROGRESS: tc_work_status_t = 1;
/// Finished successfully.
pub const TC_WORK_COMPLETED: tc_work_status_t = 2;
/// Failed at its deadline.
pub const TC_WORK_TIMED_OUT: tc_work_status_t = 3;
/// Failed.
pub const TC_WORK_ERROR: tc_work_status_t = 4;

/// Kind of a point-to-point operation in a batch: `TC_P2P_SEND` or `TC_P2P_RECV`.
pub type tc_p2p_kind_t = i32;
/// Send the tensor to the peer.
pub const TC_P2P_SEND: tc_p2p_kind_t = 0;
/// Receive into the tensor from the peer.
pub const TC_P2P_RECV: tc_p2p_kind_t = 1;

/// Pass as a rank or size to `tc_comm_create` to discover it from the launcher's environment.
pub const TC_RANK_FROM_ENV: i32 = -1;
/// Pass as `timeout_seconds` to `tc_work_wait` to wait up to the operation's own timeout.
pub const TC_WAIT_OP_TIMEOUT: f64 = -1.0;

/// A device: its kind and, for CUDA, its ordinal.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct tc_device_t {
    /// `TC_DEVICE_CPU` or `TC_DEVICE_CUDA`.
    pub device_type: tc_device_type_t,
    /// CUDA device ordinal; 0 for the CPU.
    pub index: i32,
}

/// A buffer of `count` elements of `dtype` at `data` on `device`: what every operation reads
/// or writes. Buffers are flat and contiguous. The memory belongs to the caller, who keeps it
/// valid (and leaves it alone) until the operation using it has completed.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_tensor_t {
    /// First element; may be NULL only when `count` is 0.
    pub data: *mut c_void,
    /// Number of elements.
    pub count: usize,
    /// Element type (`TC_FLOAT32`...).
    pub dtype: tc_dtype_t,
    /// Where the memory lives.
    pub device: tc_device_t,
}

/// A backend hint: a key and a value, both NUL-terminated UTF-8.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_hint_t {
    /// Hint name (`"algo"`).
    pub key: *const c_char,
    /// Hint value (`"ring"`).
    pub value: *const c_char,
}

/// Options of one operation: fill them with `tc_op_options_init()`, then set fields. NULL
/// instead of options means the defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_op_options_t {
    /// Timeout of this operation in seconds; 0 uses the communicator's.
    pub timeout_seconds: f64,
    /// `num_hints` backend hints for this call (may be NULL when `num_hints` is 0).
    pub hints: *const tc_hint_t,
    /// Number of entries of `hints`.
    pub num_hints: usize,
    /// The factor of `TC_PREMUL_SUM` (ignored by other reduce ops).
    pub premul_sum_factor: f64,
}

/// Options of a communicator: fill them with `tc_comm_options_init()`, then set fields. NULL
/// instead of options means the defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_comm_options_t {
    /// Init timeout and default operation timeout in seconds; 0 uses
    /// `TORCHCOMM_TIMEOUT_SECONDS` (default 600).
    pub timeout_seconds: f64,
    /// Abort the process when an operation times out or fails: 1 yes, 0 no, -1 from
    /// `TORCHCOMM_ABORT_ON_ERROR` (default yes, like torchcomms).
    pub abort_process_on_timeout_or_error: i32,
    /// `num_hints` backend hints (may be NULL when `num_hints` is 0).
    pub hints: *const tc_hint_t,
    /// Number of entries of `hints`.
    pub num_hints: usize,
}

/// One send or receive of a batch (`tc_batch_p2p`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_p2p_op_t {
    /// `TC_P2P_SEND` or `TC_P2P_RECV`.
    pub kind: tc_p2p_kind_t,
    /// The other rank.
    pub peer: i32,
    /// The data sent, or the buffer received into.
    pub tensor: tc_tensor_t,
}

impl Default for tc_op_options_t {
    fn default() -> Self {
        tc_op_options_t {
            timeout_seconds: 0.0,
            hints: ptr::null(),
            num_hints: 0,
            premul_sum_factor: 1.0,
        }
    }
}

impl Default for tc_comm_options_t {
    fn default() -> Self {
        tc_comm_options_t {
            timeout_seconds: 0.0,
            abort_process_on_timeout_or_error: -1,
            hints: ptr::null(),
            num_hints: 0,
        }
    }
}

/// The dtype of code `v`.
pub(crate) fn dtype(func: &str, arg: &str, v: tc_dtype_t) -> CResult<DataType> {
    Ok(match v {
        TC_FLOAT16 => DataType::F16,
        TC_BFLOAT16 => DataType::BF16,
        TC_FLOAT32 => DataType::F32,
        TC_FLOAT64 => DataType::F64,
        TC_INT8 => DataType::I8,
        TC_UINT8 => DataType::U8,
        TC_INT32 => DataType::I32,
        TC_INT64 => DataType::I64,
        TC_BOOL => DataType::Bool,
        other => {
            return Err(CError::invalid(
                func,
                arg,
                "a dtype code TC_FLOAT16 (0) .. TC_BOOL (8)",
                other,
            ))
        }
    })
}

/// The reduce op of code `v` (`factor` completes `TC_PREMUL_SUM`).
pub(crate) fn reduce_op(func: &str, v: tc_reduce_op_t, factor: f64) -> CResult<ReduceOp> {
    Ok(match v {
        TC_SUM => ReduceOp::Sum,
        TC_PRODUCT => ReduceOp::Product,
        TC_MIN => ReduceOp::Min,
        TC_MAX => ReduceOp::Max,
        TC_BAND => ReduceOp::BAnd,
        TC_BOR => ReduceOp::BOr,
        TC_BXOR => ReduceOp::BXor,
        TC_AVG => ReduceOp::Avg,
        TC_PREMUL_SUM => ReduceOp::PremulSum { factor },
        other => {
            return Err(CError::invalid(
                func,
                "op",
                "a reduce op code TC_SUM (0) .. TC_PREMUL_SUM (8)",
                other,
            ))
        }
    })
}

/// The device `d` names.
pub(crate) fn device(func: &str, arg: &str, d: tc_device_t) -> CResult<Device> {
    match d.device_type {
        TC_DEVICE_CPU => Ok(Device::Cpu),
        TC_DEVICE_CUDA => u32::try_from(d.index)
            .map(Device::Cuda)
            .map_err(|_| CError::invalid(func, arg, "a CUDA device ordinal >= 0", d.index)),
        other => Err(CError::invalid(
            func,
            arg,
            "a device type TC_DEVICE_CPU (0) or TC_DEVICE_CUDA (1)",
            other,
        )),
    }
}

/// The device as C sees it.
pub(crate) fn device_to_c(d: Device) -> tc_device_t {
    match d {
        Device::Cpu => tc_device_t {
            device_type: TC_DEVICE_CPU,
            index: 0,
        },
        Device::Cuda(i) => tc_device_t {
            device_type: TC_DEVICE_CUDA,
            index: i32::try_from(i).unwrap_or(i32::MAX),
        },
    }
}

/// A rank argument (root, peer, rank of a split list): non-negative.
pub(crate) fn rank(func: &str, arg: &str, r: i32) -> CResult<usize> {
    usize::try_from(r).map_err(|_| CError::invalid(func, arg, "a rank >= 0", r))
}

/// A timeout in seconds where 0 means "the default".
pub(crate) fn timeout(func: &str, arg: &str, seconds: f64) -> CResult<Option<Duration>> {
    if seconds == 0.0 {
        return Ok(None);
    }
    Duration::try_from_secs_f64(seconds)
        .map(Some)
        .map_err(|_| CError::invalid(func, arg, "a finite number of seconds >= 0", seconds))
}

/// The work state as C sees it.
pub(crate) fn work_status_to_c(s: WorkStatus) -> tc_work_status_t {
    match s {
        WorkStatus::NotStarted => TC_WORK_NOT_STARTED,
        WorkStatus::InProgress => TC_WORK_IN_PROGRESS,
        WorkStatus::Completed => TC_WORK_COMPLETED,
        WorkStatus::TimedOut => TC_WORK_TIMED_OUT,
        WorkStatus::Error => TC_WORK_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_code_round_trips_and_unknown_codes_fail() {
        for (code, want) in (TC_FLOAT16..=TC_BOOL).zip(DataType::ALL) {
            assert_eq!(dtype("f", "dtype", code).unwrap(), want);
        }
        for bad in [-1, 9, 42, i32::MAX] {
            let e = dtype("tc_f", "tensor.dtype", bad).unwrap_err();
            assert!(e.message.contains("tensor.dtype") && e.message.contains(&bad.to_string()));
        }
    }

    #[test]
    fn reduce_ops_and_devices_are_checked() {
        assert_eq!(reduce_op("f", TC_MAX, 1.0).unwrap(), ReduceOp::Max);
        assert_eq!(
            reduce_op("f", TC_PREMUL_SUM, 3.0).unwrap(),
            ReduceOp::PremulSum { factor: 3.0 }
        );
        assert!(reduce_op("f", 9, 1.0).is_err());
        let cpu = tc_device_t {
            device_type: TC_DEVICE_CPU,
            index: 0,
        };
        assert_eq!(device("f", "device", cpu).unwrap(), Device::Cpu);
        assert_eq!(device_to_c(Device::Cuda(3)).index, 3);
        let bad = tc_device_t {
            device_type: TC_DEVICE_CUDA,
            index: -2,
        };
        assert!(device("f", "device", bad).is_err());
        assert!(device(
            "f",
            "device",
            tc_device_t {
                device_type: 7,
                index: 0
            }
        )
        .is_err());
    }

    #[test]
    fn timeouts_and_ranks() {
        assert_eq!(timeout("f", "t", 0.0).unwrap(), None);
        assert_eq!(
            timeout("f", "t", 1.5).unwrap(),
            Some(Duration::from_millis(1500))
        );
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            assert!(timeout("f", "t", bad).is_err());
        }
        assert_eq!(rank("f", "root", 3).unwrap(), 3);
        assert!(rank("f", "root", -1).is_err());
    }
}
