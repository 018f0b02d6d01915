//! The two futex calls the shared-memory transport sleeps and wakes with. Shared (not
//! `FUTEX_PRIVATE`) because waiters and wakers are different processes mapping the same page.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `word` still holds `expected`, for at most `timeout` (spurious wake-ups are
/// fine: callers re-check their condition).
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call (it lives in a mapping
    // that outlives every user); the kernel only reads it and the timespec.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every process sleeping on `word`.
pub(crate) fn wake_all(word: &AtomicU32) {
    // SAFETY: as in `wait`; FUTEX_WAKE does not dereference anything but the address.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}
