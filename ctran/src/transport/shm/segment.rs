//! A POSIX shared-memory segment mapped by the ranks of one host. The lowest local rank creates
//! it under a name derived from the communicator's secret; the others open it by that name; once
//! every local rank has mapped it the creator unlinks the name, so nothing is left in /dev/shm
//! even if a rank is later killed (the memory lives until the last mapping goes away).

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::sys::mman::{mmap, munmap, shm_open, shm_unlink, MapFlags, ProtFlags};
use nix::sys::stat::{fstat, Mode};

use crate::error::{Error, Result};

/// A mapped segment.
#[derive(Debug)]
pub(crate) struct Segment {
    base: NonNull<u8>,
    len: usize,
    name: String,
    /// The creator unlinks the name (once everyone attached, or on drop at the latest).
    owner: bool,
    unlinked: bool,
    _fd: OwnedFd,
}

// SAFETY: the mapping is plain memory shared with other processes; all access goes through
// atomics or through regions the protocol hands to one writer at a time.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

fn map(fd: &OwnedFd, len: usize) -> Result<NonNull<u8>> {
    let size =
        std::num::NonZeroUsize::new(len).ok_or_else(|| Error::invalid("shm size", "> 0", 0))?;
    // SAFETY: mapping a shared-memory fd we own, of a size the file has (checked by callers);
    // no existing Rust memory is affected.
    let p = unsafe {
        mmap(
            None,
            size,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
            fd,
            0,
        )
    }
    .map_err(|e| Error::io("mmap of the shared-memory segment", e.into()))?;
    Ok(p.cast())
}

impl Segment {
    /// Creates and maps a zeroed segment of `len` bytes.
    pub(crate) fn create(name: &str, len: usize) -> Result<Segment> {
        let cname = CString::new(name).expect("segment names have no NUL");
        let fd = shm_open(
            cname.as_c_str(),
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .map_err(|e| Error::io(format!("shm_open({name}) to create"), e.into()))?;
        let truncated = nix::unistd::ftruncate(&fd, len as libc::off_t);
        let mapped = truncated
            .map_err(|e| Error::io("ftruncate of the shared-memory segment", e.into()))
            .and_then(|()| map(&fd, len));
        match mapped {
            Ok(base) => Ok(Segment {
                base,
                len,
                name: name.into(),
                owner: true,
                unlinked: false,
                _fd: fd,
            }),
            Err(e) => {
                let _ = shm_unlink(cname.as_c_str());
                Err(e)
            }
        }
    }

    /// Opens and maps a segment another rank creates, waiting until it exists at full size or
    /// `alive` reports the creator gone.
    pub(crate) fn open(
        name: &str,
        len: usize,
        deadline: Instant,
        alive: super::node::Alive<'_>,
    ) -> Result<Segment> {
        let cname = CString::new(name).expect("segment names have no NUL");
        loop {
            match shm_open(cname.as_c_str(), OFlag::O_RDWR, Mode::empty()) {
                Ok(fd) => {
                    let size = fstat(&fd)
                        .map_err(|e| Error::io("fstat of the shared-memory segment", e.into()))?
                        .st_size as usize;
                    if size == len {
                        let base = map(&fd, len)?;
                        return Ok(Segment {
                            base,
                            len,
                            name: name.into(),
                            owner: false,
                            unlinked: false,
                            _fd: fd,
                        });
                    }
                }
                Err(nix::errno::Errno::ENOENT) => {}
                Err(e) => return Err(Error::io(format!("shm_open({name})"), e.into())),
            }
            if Instant::now() >= deadline {
                return Err(Error::Bootstrap {
                    comm: String::new(),
                    reason: format!(
                        "shared-memory segment {name} did not appear before the deadline"
                    ),
                });
            }
            if let Err(e) = alive() {
                return Err(Error::Bootstrap {
                    comm: String::new(),
                    reason: format!("shared-memory segment {name} did not appear: {e}"),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Removes `name` if it exists: what a rank whose set-up failed does, so a segment whose
    /// creator died is not left behind.
    pub(crate) fn unlink_name(name: &str) {
        if let Ok(c) = CString::new(name) {
            let _ = shm_unlink(c.as_c_str());
        }
    }

    /// Removes the name (the memory stays mapped). Idempotent; only the creator does it.
    pub(crate) fn unlink(&mut self) {
        if self.owner && !self.unlinked {
            self.unlinked = true;
            if let Ok(c) = CString::new(self.name.as_str()) {
                let _ = shm_unlink(c.as_c_str());
            }
        }
    }

    /// Start of the mapping.
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Length of the mapping.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The file descriptor (for diagnostics).
    #[allow(dead_code)]
    pub(crate) fn fd(&self) -> i32 {
        self._fd.as_raw_fd()
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.unlink();
        // SAFETY: the mapping was created by `map` with this base and length, and every user of
        // it (the transport owning this segment) is gone by now.
        unsafe {
            let _ = munmap(self.base.cast(), self.len);
        }
    }
}
