//! The registration cache of user buffers for the NVLink transport's direct mode.
//!
//! A rank exports the allocation behind each buffer it exposes (cached by allocation start and
//! buffer id), and maps the allocations peers expose (cached by peer, start and buffer id).
//! The buffer id changes when an address is freed and allocated again, so a stale mapping is
//! never used: it is closed when the same peer and start show up with a new id.

use std::collections::HashMap;
use std::sync::Arc;

use crate::cuda::ipc::{self, Exported, Mapped, HANDLE_BYTES};
use crate::cuda::{Context, CudaError};

/// Smallest allocation exported: below it the driver sub-allocates (PyTorch's caching
/// allocator hands out slices of segments of at least this size, so tensors qualify).
pub const MIN_EXPORT_BYTES: u64 = 2 << 20;

/// Bytes of one [`Record`] on the wire.
pub const RECORD_BYTES: usize = HANDLE_BYTES + 4 * 8;

/// One exposed buffer as peers receive it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Handle of the allocation holding the buffer (zero for an empty buffer).
    pub handle: [u8; HANDLE_BYTES],
    /// The allocation's start in the exporter's address space.
    pub base: u64,
    /// The allocation's buffer id.
    pub buffer_id: u64,
    /// Offset of the buffer in the allocation.
    pub offset: u64,
    /// Bytes of the buffer.
    pub len: u64,
}

impl Default for Record {
    fn default() -> Record {
        Record {
            handle: [0; HANDLE_BYTES],
            base: 0,
            buffer_id: 0,
            offset: 0,
            len: 0,
        }
    }
}
impl Record {
    /// Appends the wire form to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.handle);
        for v in [self.base, self.buffer_id, self.offset, self.len] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// Reads the wire form (`bytes` holds at least [`RECORD_BYTES`]).
    pub fn read(bytes: &[u8]) -> Record {
        let mut handle = [0u8; HANDLE_BYTES];
        handle.copy_from_slice(&bytes[..HANDLE_BYTES]);
        let word = |i: usize| {
            let at = HANDLE_BYTES + 8 * i;
            u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
        };
        Record {
            handle,
            base: word(0),
            buffer_id: word(1),
            offset: word(2),
            len: word(3),
        }
    }
}

/// Exports of this rank and mappings of peers' buffers.
#[derive(Debug)]
pub struct Registry {
    ctx: Arc<Context>,
    exported: HashMap<(u64, u64), Exported>,
    mapped: HashMap<(usize, u64), (u64, Mapped)>,
}

impl Registry {
    /// An empty cache on device `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Registry {
        Registry {
            ctx: Arc::clone(ctx),
            exported: HashMap::new(),
            mapped: HashMap::new(),
        }
    }

    /// The record peers need to reach `len` bytes at device address `ptr`.
    pub fn expose(&mut self, ptr: u64, len: usize) -> Result<Record, CudaError> {
        if len == 0 {
            return Ok(Record::default());
        }
        let (base, size, id) = ipc::allocation_of(&self.ctx, ptr)?;
        if size < MIN_EXPORT_BYTES {
            // The driver packs small allocations into shared blocks and exports the block:
            // a second allocation of it would map twice (CUDA_ERROR_ALREADY_MAPPED).
            return Err(CudaError::BadArgument {
                call: "cuIpcGetMemHandle",
                detail: format!(
                    "an allocation of {size} bytes (CUDA IPC exports allocations of at least {MIN_EXPORT_BYTES})"
                ),
            });
        }
        let e = match self.exported.get(&(base, id)) {
            Some(e) => *e,
            None => {
                let e = ipc::export(&self.ctx, ptr)?;
                self.exported.retain(|&(b, _), _| b != base);
                self.exported.insert((base, id), e);
                e
            }
        };
        Ok(Record {
            handle: e.handle,
            base,
            buffer_id: id,
            offset: ptr - base,
            len: len as u64,
        })
    }

    /// Closes every mapping of `peer`'s memory: a mapping of an allocation the peer has freed
    /// can overlap a new one and make opening that fail.
    pub fn forget(&mut self, peer: usize) {
        self.mapped.retain(|&(q, _), _| q != peer);
    }

    /// The address in this process of the buffer `peer` exposed as `r` (0 when empty).
    pub fn resolve(&mut self, peer: usize, r: &Record) -> Result<u64, CudaError> {
        if r.len == 0 {
            return Ok(0);
        }
        let key = (peer, r.base);
        if let Some((id, m)) = self.mapped.get(&key) {
            if *id == r.buffer_id {
                return Ok(m.ptr() + r.offset);
            }
        }
        // A new allocation at this address (or the first use): drop the stale mapping first.
        self.mapped.remove(&key);
        let m = Mapped::open(&self.ctx, &r.handle)?;
        let addr = m.ptr() + r.offset;
        self.mapped.insert(key, (r.buffer_id, m));
        Ok(addr)
    }
}
