//! Bounded busy-waiting before a sleep: a caller waiting on its operation and a progress thread
//! waiting for the next one poll for a short window first, so that short operations never pay
//! for a wake-up (a system call and a scheduler hop, several microseconds).

use std::time::{Duration, Instant};

/// Polls `ready` until it yields a value or `window` has passed (`None`: go and sleep). Reads
/// the clock every 64 polls only: a poll costs a few nanoseconds, a clock read tens.
pub(crate) fn spin_for<T>(window: Duration, ready: impl FnMut() -> Option<T>) -> Option<T> {
    spin_marking(window, ready, || {})
}

/// Like [`spin_for`], calling `mark` every [`MARK_POLLS`] polls that found nothing (the
/// progress thread notes the time there, so that what it finds next needs no clock read).
pub(crate) fn spin_marking<T>(
    window: Duration,
    mut ready: impl FnMut() -> Option<T>,
    mut mark: impl FnMut(),
) -> Option<T> {
    if let Some(v) = ready() {
        return Some(v);
    }
    if window.is_zero() {
        return None;
    }
    let until = Instant::now() + window;
    let mut polls = 0u32;
    loop {
        if let Some(v) = ready() {
            return Some(v);
        }
        polls = polls.wrapping_add(1);
        if polls % MARK_POLLS == 0 {
            mark();
            if polls % 64 == 0 && Instant::now() >= until {
                return None;
            }
        }
        std::hint::spin_loop();
    }
}

/// Polls between two marks of [`spin_marking`]: a mark is one clock read, a poll a few ns
/// plus a pause (tens of ns), so marks cost little and stay within a few polls of any find.
const MARK_POLLS: u32 = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_what_becomes_ready_within_the_window() {
        let mut polls = 0;
        let got = spin_for(Duration::from_secs(5), || {
            polls += 1;
            (polls == 1000).then_some(polls)
        });
        assert_eq!(got, Some(1000));
    }

    #[test]
    fn gives_up_after_the_window_and_a_zero_window_polls_once() {
        let t0 = Instant::now();
        assert_eq!(spin_for(Duration::from_millis(20), || None::<()>), None);
        assert!(t0.elapsed() >= Duration::from_millis(20));
        let mut polls = 0;
        assert_eq!(
            spin_for(Duration::ZERO, || {
                polls += 1;
                None::<()>
            }),
            None
        );
        assert_eq!(polls, 1);
    }
}
