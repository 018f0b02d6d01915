//! The two futex calls the shared-memory transport sleeps and wakes with, through rustix's safe
//! futex wrappers. Shared (no `FUTEX_PRIVATE_FLAG`) because waiters and wakers are different
//! processes mapping the same page.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::thread::futex;

/// Sleeps while `word` still holds `expected`, for at most `timeout` (spurious wake-ups are
/// fine: callers re-check their condition, so the result, a wake-up, a timeout, an interruption
/// or a changed word, is not needed).
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = futex::Timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    let _ = futex::wait(word, futex::Flags::empty(), expected, Some(&ts));
}

/// Wakes every process sleeping on `word`.
pub(crate) fn wake_all(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
}
