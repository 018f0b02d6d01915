//! `--trace-ab`: the schedule of blocks with tracing paused and on, and the statistics of the
//! block times.
//!
//! Separate processes differ by a few percent in latency (placement, caches, what else runs),
//! which hides a 1% effect; blocks of one run on one communicator do not. Blocks come in groups
//! of four, off on on off, then on off off on: within a group a drift that is linear in time
//! weighs both settings alike (positions 0 + 3 against 1 + 2), and alternating the order
//! cancels what the first block after a switch might pay. Each group gives one paired ratio.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Blocks per group.
pub(crate) const GROUP: usize = 4;

/// Whether tracing records during block `k` (0-based) of the run.
pub(crate) fn is_on(k: usize) -> bool {
    let first_off = [false, true, true, false];
    let on = first_off[k % GROUP];
    // Odd groups swap the settings: on off off on.
    if (k / GROUP) % 2 == 1 {
        !on
    } else {
        on
    }
}

/// The middle value of `v` (the mean of the two middle values for an even count); `NaN` for
/// an empty slice.
pub(crate) fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    ctran::algos::select::calibrate::median(&mut v.to_vec())
}

/// Resamples drawn for the bootstrap interval.
const RESAMPLES: usize = 10_000;

/// Bootstrap 95% interval of the median of `v`: the 2.5th and 97.5th percentiles of the
/// medians of resamples of `v` (with replacement). The seed is fixed, so that the report of a
/// run does not change from one computation to the next.
pub(crate) fn median_ci(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mut rng = StdRng::seed_from_u64(0x007a_ceab);
    let mut sample = vec![0.0; v.len()];
    let mut meds: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            for x in sample.iter_mut() {
                *x = v[rng.random_range(0..v.len())];
            }
            median(&sample)
        })
        .collect();
    meds.sort_by(f64::total_cmp);
    let at = |q: f64| meds[((q * RESAMPLES as f64) as usize).min(RESAMPLES - 1)];
    (at(0.025), at(0.975))
}

/// What a run of blocks measured.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Summary {
    /// Median of the mean latencies of the blocks with tracing paused, seconds.
    pub(crate) off: f64,
    /// The same with tracing on.
    pub(crate) on: f64,
    /// Median over the groups of (on time / off time - 1) within the group.
    pub(crate) ratio: f64,
    /// Bootstrap 95% interval of `ratio`.
    pub(crate) ci: (f64, f64),
    /// Groups (paired ratios).
    pub(crate) groups: usize,
}

/// The summary of `times`, the mean latency of every block in run order (whole groups).
pub(crate) fn summarize(times: &[f64]) -> Summary {
    let pick = |on: bool| -> Vec<f64> {
        (0..times.len())
            .filter(|&k| is_on(k) == on)
            .map(|k| times[k])
            .collect()
    };
    let ratios: Vec<f64> = times
        .chunks_exact(GROUP)
        .enumerate()
        .map(|(g, block)| {
            let (mut on, mut off) = (0.0, 0.0);
            for (i, t) in block.iter().enumerate() {
                if is_on(g * GROUP + i) {
                    on += t;
                } else {
                    off += t;
                }
            }
            on / off - 1.0
        })
        .collect();
    Summary {
        off: median(&pick(false)),
        on: median(&pick(true)),
        ratio: median(&ratios),
        ci: median_ci(&ratios),
        groups: ratios.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_balance_the_settings_and_their_positions() {
        for g in 0..6 {
            let on: Vec<usize> = (0..GROUP).filter(|&i| is_on(g * GROUP + i)).collect();
            assert_eq!(on.len(), 2, "group {g}");
            // Positions 1 + 2 against 0 + 3: a linear drift weighs both settings alike.
            assert_eq!(on.iter().sum::<usize>(), 3, "group {g}");
        }
        assert_ne!(
            is_on(0),
            is_on(GROUP),
            "consecutive groups start differently"
        );
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn the_interval_holds_the_median_and_shrinks_to_a_constant() {
        let v: Vec<f64> = (1..=21).map(f64::from).collect();
        let (lo, hi) = median_ci(&v);
        assert!(lo < 11.0 && 11.0 < hi, "{lo} {hi}");
        assert!(lo >= 1.0 && hi <= 21.0, "{lo} {hi}");
        assert_eq!(median_ci(&[0.5; 9]), (0.5, 0.5));
    }

    #[test]
    fn a_drift_cancels_and_an_effect_shows() {
        // Latency that grows by 1% per block, with tracing adding 2% on top.
        let times: Vec<f64> = (0..40)
            .map(|k| {
                let drift = 1.0 + 0.01 * k as f64;
                if is_on(k) {
                    drift * 1.02
                } else {
                    drift
                }
            })
            .collect();
        let s = summarize(&times);
        assert_eq!(s.groups, 10);
        assert!((s.ratio - 0.02).abs() < 0.001, "{s:?}");
        assert!(s.ci.0 > 0.015 && s.ci.1 < 0.025, "{s:?}");
        // Without an effect, the same drift gives a ratio near 0.
        let flat: Vec<f64> = (0..40).map(|k| 1.0 + 0.01 * k as f64).collect();
        assert!(summarize(&flat).ratio.abs() < 0.001);
    }
}
