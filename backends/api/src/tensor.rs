//! Tensors as the API sees them: an address, an element count, a dtype, a device, and whoever
//! owns the memory. The layer above (Python, C, a Rust caller) keeps ownership; operations hold
//! the owner until they finish.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use torchcomms_core::{DataType, Device, Span};

/// Something that keeps a tensor's memory alive (a Python tensor object, an `Arc<Vec<_>>`).
pub type Owner = Arc<dyn Any + Send + Sync>;

/// A view of `numel` elements of `dtype` at an address on `device`.
#[derive(Clone)]
pub struct Tensor {
    addr: usize,
    numel: usize,
    dtype: DataType,
    device: Device,
    contiguous: bool,
    /// Size of dimension 0 (rows), for splits counted in rows; `numel` for 1-D tensors.
    rows: usize,
    owner: Option<Owner>,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({:#x}, {} x {}, {}",
            self.addr, self.numel, self.dtype, self.device
        )?;
        if !self.contiguous {
            f.write_str(", non-contiguous")?;
        }
        f.write_str(")")
    }
}

/// Rust element types that map to a [`DataType`].
pub trait Element: Copy + Send + Sync + 'static {
    /// The matching dtype.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => { $(impl Element for $t { const DTYPE: DataType = DataType::$d; })* };
}
element!(f32 => F32, f64 => F64, i8 => I8, u8 => U8, i32 => I32, i64 => I64, bool => Bool);
element!(half::f16 => F16, half::bf16 => BF16);

impl Tensor {
    /// Describes `numel` elements of `dtype` at `ptr` on `device`.
    ///
    /// # Safety
    /// For host memory, `ptr` must be valid for reads and writes of `numel * dtype.size_bytes()`
    /// bytes for as long as any operation given this tensor runs, and nothing else may write it
    /// meanwhile. Pass an owner with [`Tensor::with_owner`] to tie that lifetime to an object.
    pub unsafe fn from_raw(ptr: *mut u8, numel: usize, dtype: DataType, device: Device) -> Tensor {
        Tensor {
            addr: ptr as usize,
            numel,
            dtype,
            device,
            contiguous: true,
            rows: numel,
            owner: None,
        }
    }

    /// A host tensor that owns `data`.
    pub fn from_vec<T: Element>(data: Vec<T>) -> Tensor {
        let numel = data.len();
        Tensor::owning(data, numel, T::DTYPE)
    }

    /// A host tensor of `numel` zeroed elements (8-byte aligned).
    pub fn zeros(dtype: DataType, numel: usize) -> Tensor {
        let words = (numel * dtype.size_bytes()).div_ceil(8);
        Tensor::owning(vec![0u64; words], numel, dtype)
    }

    fn owning<T: Send + Sync + 'static>(mut data: Vec<T>, numel: usize, dtype: DataType) -> Tensor {
        debug_assert!(numel * dtype.size_bytes() <= std::mem::size_of_val(data.as_slice()));
        let ptr = data.as_mut_ptr().cast::<u8>();
        let owner: Owner = Arc::new(OwnedVec(data));
        // SAFETY: the Vec's heap buffer does not move when the Vec moves into the Arc, and the
        // Arc (held by this tensor and every operation using it) keeps it alive; it holds at
        // least numel * dtype size bytes.
        unsafe { Tensor::from_raw(ptr, numel, dtype, Device::Cpu) }.with_owner(owner)
    }

    /// Records who keeps the memory alive; operations hold it until they finish.
    pub fn with_owner(mut self, owner: Owner) -> Tensor {
        self.owner = Some(owner);
        self
    }

    /// Marks the tensor non-contiguous (operations refuse it).
    pub fn with_contiguous(mut self, contiguous: bool) -> Tensor {
        self.contiguous = contiguous;
        self
    }

    /// Sets the size of dimension 0, for operations whose splits count rows.
    pub fn with_rows(mut self, rows: usize) -> Tensor {
        self.rows = rows;
        self
    }

    /// Element count.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Size of dimension 0.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Elements per row of dimension 0 (1 for an empty tensor).
    pub fn row_numel(&self) -> usize {
        self.numel.checked_div(self.rows).unwrap_or(1)
    }

    /// Element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Where the memory lives.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Whether the elements are dense in memory.
    pub fn is_contiguous(&self) -> bool {
        self.contiguous
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.numel * self.dtype.size_bytes()
    }

    /// Start address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// The owner, if any.
    pub fn owner(&self) -> Option<&Owner> {
        self.owner.as_ref()
    }

    /// Elements `[offset, offset + numel)` as a tensor sharing this one's owner.
    pub fn narrow(&self, offset: usize, numel: usize) -> Tensor {
        assert!(offset + numel <= self.numel, "narrow out of bounds");
        let row = self.row_numel().max(1);
        Tensor {
            addr: self.addr + offset * self.dtype.size_bytes(),
            numel,
            rows: if numel % row == 0 { numel / row } else { numel },
            ..self.clone()
        }
    }

    /// `n` consecutive views of `per` elements each, from the start (the per-rank blocks of a
    /// `_single` operation's tensor).
    pub fn blocks(&self, n: usize, per: usize) -> Vec<Tensor> {
        (0..n).map(|r| self.narrow(r * per, per)).collect()
    }

    /// Consecutive views of `rows[i]` rows of dimension 0 each (split sizes).
    pub fn split_rows(&self, rows: &[usize]) -> Vec<Tensor> {
        let row = self.row_numel();
        let mut offset = 0;
        rows.iter()
            .map(|&r| {
                let view = self.narrow(offset, r * row);
                offset += r * row;
                view
            })
            .collect()
    }

    /// The bytes as an engine span.
    pub fn span(&self) -> Span {
        // SAFETY: whoever built this tensor promised (in `from_raw`) that the memory is valid
        // while operations use it.
        unsafe { Span::from_raw(self.addr as *mut u8, self.nbytes()) }
    }

    /// Copies the elements out. Fails while an operation may still write the tensor (its owner
    /// is shared), so the read can never race with the engine.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, crate::Error> {
        if T::DTYPE != self.dtype {
            return Err(crate::Error::invalid(
                "to_vec",
                "T",
                format!("{}", self.dtype),
                T::DTYPE,
            ));
        }
        if self.device != Device::Cpu {
            return Err(crate::Error::invalid(
                "to_vec",
                "tensor",
                "a cpu tensor",
                self.device,
            ));
        }
        if let Some(o) = &self.owner {
            if Arc::strong_count(o) > 1 {
                return Err(crate::Error::invalid(
                    "to_vec",
                    "tensor",
                    "a tensor no operation holds any more (wait for the work and drop views first)",
                    "a tensor still shared",
                ));
            }
        }
        let mut out = Vec::<T>::with_capacity(self.numel);
        // SAFETY: the tensor's memory is valid for nbytes (from_raw contract); no operation
        // holds the owner, so nothing writes it; `out` has capacity for numel elements of T and
        // T has no invalid bit patterns among the Element types except bool, which the engine
        // only ever writes as 0 or 1.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.addr as *const u8,
                out.as_mut_ptr().cast::<u8>(),
                self.nbytes(),
            );
            out.set_len(self.numel);
        }
        Ok(out)
    }
}

#[derive(Debug)]
struct OwnedVec<T>(#[allow(dead_code)] Vec<T>);
