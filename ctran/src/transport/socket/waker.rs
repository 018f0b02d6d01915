//! Wakes a progress thread that is blocked in `poll` (new work was queued for it).

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::eventfd::{EfdFlags, EventFd};

/// An eventfd plus a flag saying whether the progress thread is (about to be) asleep in `poll`,
/// so submitters only pay for the write when it is.
#[derive(Debug)]
pub struct Waker {
    fd: EventFd,
    sleeping: AtomicBool,
}

impl Waker {
    /// A new waker.
    pub fn new() -> std::io::Result<Waker> {
        let fd = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Waker {
            fd,
            sleeping: AtomicBool::new(false),
        })
    }

    /// Wakes the progress thread if it sleeps in `poll`. Called after new work was queued.
    pub fn wake(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            let _ = self.fd.write(1);
        }
    }

    /// Called by the progress thread before it checks its queue one last time and sleeps.
    pub(crate) fn set_sleeping(&self, sleeping: bool) {
        self.sleeping.store(sleeping, Ordering::SeqCst);
    }

    /// Clears a pending wake-up.
    pub(crate) fn drain(&self) {
        let _ = self.fd.read();
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
