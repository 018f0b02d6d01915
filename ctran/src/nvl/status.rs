//! The device-side words an operation synchronises on: flags, counters, and the mapped
//! status page through which kernels report a timeout and the host asks them to abort.

use std::time::Duration;

use super::kernels::Sync;
use super::Nvl;

/// Offsets in the mapped status page.
const STATUS: usize = 0;
const ABORT: usize = 64;

impl Nvl {
    pub(super) fn sync(&self, timeout: Duration) -> Sync {
        Sync {
            flags: self.flags.as_ptr(),
            peer_flags: self.peer_flags,
            counters: self.counters.as_ptr(),
            status: self.status.device_ptr() + STATUS as u64,
            abort_flag: self.status.device_ptr() + ABORT as u64,
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            rank: self.layout.rank as u32,
            nranks: self.layout.nranks as u32,
        }
    }

    /// Makes every waiting kernel of this comm give up (their operations fail as aborted).
    pub fn abort(&self) {
        // SAFETY: 4 aligned bytes of our mapped page; kernels only read this word.
        unsafe { std::ptr::write_volatile(self.status.as_ptr().add(ABORT).cast::<u32>(), 1) };
    }
}
