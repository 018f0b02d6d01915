//! The memory check behind every tensor argument: the bytes an operation will touch,
//! `[data_ptr, data_ptr + numel * element size)`, must lie inside the tensor's storage. The
//! engine reads and writes raw memory, so this is what stands between a tensor (or a
//! `torch.Tensor` subclass) that misreports its size, dtype or address and a crash of every
//! rank. Pure arithmetic, no Python: `tests/extent.rs` runs the unit tests below.

use std::fmt;

/// Why a tensor's extent cannot be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ExtentError {
    /// `numel * element size` or `ptr + bytes` does not fit in the address space.
    Overflow { numel: u64, elem_size: u64 },
    /// The bytes lie (partly) outside the storage.
    OutsideStorage {
        ptr: u64,
        bytes: u64,
        storage_ptr: u64,
        storage_bytes: u64,
    },
    /// Dimension 0 does not divide the elements into whole rows.
    Rows { rows: u64, numel: u64 },
}

impl fmt::Display for ExtentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtentError::Overflow { numel, elem_size } => write!(
                f,
                "{numel} elements of {elem_size} bytes do not fit in the address space"
            ),
            ExtentError::OutsideStorage {
                ptr,
                bytes,
                storage_ptr,
                storage_bytes,
            } => write!(
                f,
                "its data [{ptr:#x}, +{bytes} bytes) lies outside its storage \
                 [{storage_ptr:#x}, +{storage_bytes} bytes)"
            ),
            ExtentError::Rows { rows, numel } => write!(
                f,
                "dimension 0 of size {rows} does not divide its {numel} elements into rows"
            ),
        }
    }
}

/// Where a tensor says its data is, as read from torch's base class.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Extent {
    pub(crate) ptr: u64,
    pub(crate) numel: u64,
    pub(crate) elem_size: u64,
    pub(crate) storage_ptr: u64,
    pub(crate) storage_bytes: u64,
}

impl Extent {
    /// The number of bytes an operation may touch, once they are known to lie in the storage.
    /// An empty tensor touches nothing, wherever it points.
    pub(crate) fn check(&self) -> Result<u64, ExtentError> {
        let overflow = ExtentError::Overflow {
            numel: self.numel,
            elem_size: self.elem_size,
        };
        let bytes = self
            .numel
            .checked_mul(self.elem_size)
            .ok_or(overflow.clone())?;
        if bytes == 0 {
            return Ok(0);
        }
        let end = self.ptr.checked_add(bytes).ok_or(overflow)?;
        let storage_end = self.storage_ptr.checked_add(self.storage_bytes);
        let inside = self.ptr >= self.storage_ptr && storage_end.is_some_and(|e| end <= e);
        if !inside {
            return Err(ExtentError::OutsideStorage {
                ptr: self.ptr,
                bytes,
                storage_ptr: self.storage_ptr,
                storage_bytes: self.storage_bytes,
            });
        }
        Ok(bytes)
    }
}

/// Size of dimension 0 for splits counted in rows: `numel` for a 0-d tensor, else `dim0`,
/// which must split the elements into whole rows (so row arithmetic never divides by zero or
/// reaches past the end).
pub(crate) fn rows(dim: u64, dim0: u64, numel: u64) -> Result<u64, ExtentError> {
    if dim == 0 {
        return Ok(numel);
    }
    let whole = match dim0 {
        0 => numel == 0,
        r => numel % r == 0,
    };
    if whole {
        Ok(dim0)
    } else {
        Err(ExtentError::Rows { rows: dim0, numel })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(ptr: u64, numel: u64, elem_size: u64, storage_ptr: u64, storage_bytes: u64) -> Extent {
        Extent {
            ptr,
            numel,
            elem_size,
            storage_ptr,
            storage_bytes,
        }
    }

    #[test]
    fn a_tensor_filling_its_storage_passes() {
        assert_eq!(ext(0x1000, 4, 4, 0x1000, 16).check(), Ok(16));
    }

    #[test]
    fn a_view_inside_the_storage_passes() {
        assert_eq!(ext(0x1008, 2, 4, 0x1000, 16).check(), Ok(8));
    }

    #[test]
    fn one_byte_past_the_end_is_refused() {
        assert!(matches!(
            ext(0x1000, 17, 1, 0x1000, 16).check(),
            Err(ExtentError::OutsideStorage { bytes: 17, .. })
        ));
        assert!(ext(0x1009, 2, 4, 0x1000, 16).check().is_err());
    }

    #[test]
    fn a_pointer_before_the_storage_is_refused() {
        assert!(ext(0xfff, 1, 1, 0x1000, 16).check().is_err());
    }

    #[test]
    fn a_lying_dtype_is_refused() {
        // 4 float32 claimed as float64: 32 bytes in a 16-byte storage.
        assert!(ext(0x1000, 4, 8, 0x1000, 16).check().is_err());
    }

    #[test]
    fn sizes_that_overflow_are_refused_not_wrapped() {
        assert!(matches!(
            ext(0x1000, u64::MAX / 2, 4, 0x1000, 16).check(),
            Err(ExtentError::Overflow { .. })
        ));
        assert!(matches!(
            ext(u64::MAX - 2, 4, 1, u64::MAX - 2, 2).check(),
            Err(ExtentError::Overflow { .. })
        ));
        // A storage whose end overflows contains nothing.
        assert!(ext(8, 1, 1, u64::MAX - 1, 16).check().is_err());
    }

    #[test]
    fn empty_tensors_touch_nothing() {
        assert_eq!(ext(0, 0, 4, 0, 0).check(), Ok(0));
        assert_eq!(ext(0xdead, 0, 8, 0x1000, 16).check(), Ok(0));
    }

    #[test]
    fn rows_must_divide_the_elements() {
        assert_eq!(rows(0, 0, 1), Ok(1));
        assert_eq!(rows(2, 3, 12), Ok(3));
        assert_eq!(rows(1, 0, 0), Ok(0));
        assert!(rows(1, 0, 5).is_err());
        assert!(rows(2, 5, 12).is_err());
        assert!(rows(1, 1 << 40, 4).is_err());
    }
}
