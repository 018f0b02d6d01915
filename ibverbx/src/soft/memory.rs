//! Memory of the software fabric's regions: bytes the fabric owns, or the caller's own memory
//! registered in place (zero copy), host memory or memory the CPU cannot touch directly (a
//! GPU's, registered through a dma-buf as `ibv_reg_dmabuf_mr` does), which the software NIC
//! reaches through a [`DmaEngine`] the caller supplies.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use crate::error::{Error, Result};

/// How the software NIC moves bytes of memory the CPU cannot touch (a GPU's): a real NIC
/// reaches it by DMA through the dma-buf; the software one asks the memory's owner to copy.
pub trait DmaEngine: Send + Sync {
    /// Copies `len` bytes from address `src` to address `dst`; either may be host memory
    /// (with CUDA's unified addressing one copy call handles every direction).
    ///
    /// # Safety
    /// Both ranges must be valid for `len` bytes (the fabric checked them against their
    /// registrations, whose owners vouched for them).
    unsafe fn copy(&self, dst: u64, src: u64, len: usize) -> std::result::Result<(), String>;
}

/// The bytes behind a region.
pub(crate) enum Backing {
    /// Owned by the fabric (zeroed at registration).
    Owned(Vec<u8>),
    /// The caller's memory at `base` (the region's address), `len` bytes; moved by `engine`
    /// when set, else by the CPU. A dma-buf registration keeps its own duplicate of the file
    /// descriptor for the region's life, as the kernel keeps a reference to the dma-buf.
    External {
        base: u64,
        len: usize,
        engine: Option<Arc<dyn DmaEngine>>,
        _dmabuf: Option<OwnedFd>,
    },
}

impl Backing {
    pub(crate) fn len(&self) -> usize {
        match self {
            Backing::Owned(v) => v.len(),
            Backing::External { len, .. } => *len,
        }
    }

    /// The address at which byte `off` is reached (in this process).
    pub(crate) fn addr_at(&mut self, off: usize) -> u64 {
        match self {
            Backing::Owned(v) => v.as_mut_ptr() as u64 + off as u64,
            Backing::External { base, .. } => *base + off as u64,
        }
    }

    pub(crate) fn engine(&self) -> Option<&Arc<dyn DmaEngine>> {
        match self {
            Backing::Owned(_) => None,
            Backing::External { engine, .. } => engine.as_ref(),
        }
    }
}

/// Copies `len` bytes from `src` to `dst` with `engine` when one side needs it, else with the
/// CPU (overlap allowed: a write within one region).
///
/// # Safety
/// Both ranges valid for `len` bytes.
pub(crate) unsafe fn move_bytes(
    dst: u64,
    src: u64,
    len: usize,
    engine: Option<&Arc<dyn DmaEngine>>,
) -> std::result::Result<(), String> {
    match engine {
        // SAFETY: the caller's contract.
        Some(e) => unsafe { e.copy(dst, src, len) },
        None => {
            // SAFETY: the caller's contract; `copy` allows overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
            Ok(())
        }
    }
}

/// What the kernel says of a dma-buf file descriptor (`/proc/self/fdinfo`): its size, or why
/// it is not a usable one. A real `ibv_reg_dmabuf_mr` fails the same way on a descriptor that
/// is not a dma-buf or a range past its end.
pub(crate) fn check_dmabuf(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<()> {
    let path = format!("/proc/self/fdinfo/{}", fd.as_raw_fd());
    let info = std::fs::read_to_string(&path)
        .map_err(|e| Error::Soft(format!("register_dmabuf: reading {path}: {e}")))?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    if field("exp_name:").is_none() {
        return Err(Error::Soft(format!(
            "register_dmabuf: file descriptor {} is not a dma-buf (its fdinfo names no \
             exporter)",
            fd.as_raw_fd()
        )));
    }
    let size: u64 = field("size:")
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::Soft(format!("register_dmabuf: no size in {path}")))?;
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(Error::Soft(format!(
            "register_dmabuf: {len} bytes at offset {offset} pass the end of the dma-buf \
             ({size} bytes)"
        )));
    }
    Ok(())
}

/// Duplicates `fd` for the region to hold.
pub(crate) fn hold(fd: BorrowedFd<'_>) -> Result<OwnedFd> {
    fd.try_clone_to_owned()
        .map_err(|e| Error::Soft(format!("register_dmabuf: duplicating the descriptor: {e}")))
}
