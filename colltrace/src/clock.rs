//! Timestamps, cheap enough for the hot path.
//!
//! Ranks on different hosts compare timestamps, so dumps hold wall-clock times (ns since the
//! Unix epoch), not `Instant`s. Reading the system clock costs 20 to 70 ns (vDSO; more on some
//! VMs), three times per operation, which was most of what tracing an 8 B all_reduce cost.
//! Where the CPU has an invariant TSC (`constant_tsc` and `nonstop_tsc`), records hold raw TSC
//! ticks (one `rdtsc`), and a dump converts them to wall-clock time through a scale measured
//! against the system clock over the whole life of the process (re-measured at each dump, so
//! it follows NTP; the error is far below a microsecond). Elsewhere, when `init` was not
//! called, or with `TORCHCOMMS_TRACE_TSC=0`, records hold system-clock nanoseconds.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch by the system clock (0 if the clock is before it).
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The time source of one trace, fixed when the trace is created.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Clock {
    /// System-clock nanoseconds.
    System,
    /// Raw TSC ticks, converted at dump time.
    #[cfg(target_arch = "x86_64")]
    Tsc(&'static tsc::Calib),
}

static TSC: OnceLock<Option<Clock>> = OnceLock::new();

impl Clock {
    /// The clock new traces use: the TSC once [`init`] set it up, else the system clock.
    pub(crate) fn current() -> Clock {
        TSC.get().copied().flatten().unwrap_or(Clock::System)
    }

    /// A timestamp in this clock's unit (never 0, which means "not reached").
    #[inline]
    pub(crate) fn now(self) -> u64 {
        match self {
            Clock::System => now_ns(),
            #[cfg(target_arch = "x86_64")]
            Clock::Tsc(_) => tsc::rdtsc(),
        }
    }

    /// Re-measures the scale (before converting a dump's worth of timestamps).
    pub(crate) fn refresh(self) {
        #[cfg(target_arch = "x86_64")]
        if let Clock::Tsc(c) = self {
            c.refresh();
        }
    }

    /// `t` (from [`Clock::now`]) as nanoseconds since the Unix epoch; 0 stays 0.
    pub(crate) fn to_ns(self, t: u64) -> u64 {
        match self {
            _ if t == 0 => 0,
            Clock::System => t,
            #[cfg(target_arch = "x86_64")]
            Clock::Tsc(c) => c.to_ns(t),
        }
    }
}

/// Sets up the TSC clock for traces created from now on (once per process; about 5 ms),
/// unless `tsc` is false (`TORCHCOMMS_TRACE_TSC=0`) or the CPU has no invariant TSC.
pub(crate) fn init(tsc: bool) {
    if !tsc {
        return;
    }
    TSC.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            tsc::Calib::new().map(|c| Clock::Tsc(Box::leak(Box::new(c))))
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            None
        }
    });
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod tsc {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::now_ns;

    #[inline]
    pub(crate) fn rdtsc() -> u64 {
        // SAFETY: RDTSC has no preconditions on x86_64 (it reads the time-stamp counter).
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    /// A (ticks, ns) pair taken as close together as the system clock allows.
    fn pair() -> (u64, u64) {
        let mut best = (0, 0, u64::MAX);
        for _ in 0..5 {
            let a = rdtsc();
            let ns = now_ns();
            let b = rdtsc();
            let width = b.wrapping_sub(a);
            if width < best.2 {
                best = (a + width / 2, ns, width);
            }
        }
        (best.0, best.1)
    }

    fn invariant_tsc() -> bool {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
        let has = |f: &str| flags.split_whitespace().any(|x| x == f);
        has("constant_tsc") && has("nonstop_tsc")
    }

    /// Nanoseconds per tick, fixed point with 32 fraction bits.
    fn mult(ticks: u64, ns: u64) -> Option<u64> {
        (ticks > 0 && ns > 0).then(|| ((u128::from(ns) << 32) / u128::from(ticks)) as u64)
    }

    /// Ticks to wall-clock time: `first_ns + (t - first_tsc) * mult`.
    #[derive(Debug)]
    pub(crate) struct Calib {
        first_tsc: u64,
        first_ns: u64,
        mult: AtomicU64,
    }

    impl Calib {
        pub(super) fn new() -> Option<Calib> {
            if !invariant_tsc() {
                return None;
            }
            let (t0, n0) = pair();
            std::thread::sleep(Duration::from_millis(5));
            let (t1, n1) = pair();
            let m = mult(t1.wrapping_sub(t0), n1.saturating_sub(n0))?;
            Some(Calib {
                first_tsc: t0,
                first_ns: n0,
                mult: AtomicU64::new(m),
            })
        }

        /// Measures the scale again over the whole life of the process.
        pub(super) fn refresh(&self) {
            let (t, n) = pair();
            if let Some(m) = mult(
                t.wrapping_sub(self.first_tsc),
                n.saturating_sub(self.first_ns),
            ) {
                self.mult.store(m, Ordering::Relaxed);
            }
        }

        pub(super) fn to_ns(&self, t: u64) -> u64 {
            let m = u128::from(self.mult.load(Ordering::Relaxed));
            if t >= self.first_tsc {
                self.first_ns + ((u128::from(t - self.first_tsc) * m) >> 32) as u64
            } else {
                self.first_ns
                    .saturating_sub(((u128::from(self.first_tsc - t) * m) >> 32) as u64)
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::super::{init, Clock};
        use super::*;

        #[test]
        fn ticks_convert_to_the_system_clock() {
            init(true);
            let clock = Clock::current();
            for _ in 0..5 {
                let a = now_ns();
                let t = clock.now();
                let b = now_ns();
                clock.refresh();
                let ns = clock.to_ns(t);
                assert!(ns + 200_000 >= a && ns <= b + 200_000, "{a} {ns} {b}");
                std::thread::sleep(Duration::from_millis(3));
            }
            assert_eq!(clock.to_ns(0), 0);
        }
    }
}
