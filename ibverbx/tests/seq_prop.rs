//! Property tests of DQPLB sequence tracking: chunks of many puts, spread over QPs and
//! arriving in any order (within the window the outstanding limit allows), give in-order
//! notifications, across wraparound of the sequence bits.

use ibverbx::virt::seq::{SeqSender, SeqTracker};
use proptest::prelude::*;

/// Expected: after each arrival, the notifications delivered so far are those of notified
/// puts whose last chunk lies before the first chunk not yet arrived.
fn check(bits: u32, puts: &[(u8, bool)], order: &[usize]) -> Result<(), TestCaseError> {
    let mut tx = SeqSender::new(bits);
    let mut imms = Vec::new();
    let mut notify_at = Vec::new(); // chunk index of each notified put's last chunk
    for &(chunks, notify) in puts {
        for c in 0..chunks {
            let last = c + 1 == chunks;
            if last && notify {
                notify_at.push(imms.len());
            }
            imms.push(tx.next_imm(last && notify));
        }
    }
    let mut rx = SeqTracker::new(bits);
    let mut arrived = vec![false; imms.len()];
    let mut delivered = 0usize;
    for &i in order {
        delivered += rx
            .receive(imms[i])
            .map_err(|e| TestCaseError::fail(e.to_string()))? as usize;
        arrived[i] = true;
        let prefix = arrived.iter().position(|a| !a).unwrap_or(arrived.len());
        let expect = notify_at.iter().filter(|&&k| k < prefix).count();
        prop_assert_eq!(delivered, expect, "after chunk {}", i);
    }
    prop_assert_eq!(delivered, notify_at.len());
    prop_assert_eq!(rx.pending(), 0);
    Ok(())
}

fn puts() -> impl Strategy<Value = Vec<(u8, bool)>> {
    prop::collection::vec((1u8..6, any::<bool>()), 1..60)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// 24 bits: any permutation at all of up to ~300 chunks.
    #[test]
    fn any_permutation_gives_in_order_notifications(puts in puts(), seed in any::<u64>()) {
        let n: usize = puts.iter().map(|p| p.0 as usize).sum();
        let mut order: Vec<usize> = (0..n).collect();
        let mut s = seed;
        for i in (1..n).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            order.swap(i, (s >> 33) as usize % (i + 1));
        }
        check(24, &puts, &order)?;
    }

    /// Few bits: arrivals displaced by less than half the sequence space (what the
    /// per-QP outstanding limit guarantees), wrapping many times.
    #[test]
    fn bounded_reordering_across_wraparound(
        puts in puts(),
        bits in 2u32..8,
        keys in prop::collection::vec(any::<u16>(), 300),
    ) {
        let n: usize = puts.iter().map(|p| p.0 as usize).sum();
        let window = (1usize << (bits - 1)) - 1;
        // Sort by index + a displacement in 0..=window: no chunk overtakes one more than
        // `window` places before it, so nothing arrives half the space ahead.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| (i + keys[i % keys.len()] as usize % (window + 1), i));
        // Keep only orders the sender could produce: each chunk arrives at most `window`
        // numbers ahead of the first one still missing.
        let mut seen = vec![false; n];
        let mut next = 0usize;
        let mut max_ahead = 0usize;
        for &i in &order {
            max_ahead = max_ahead.max(i - next.min(i));
            seen[i] = true;
            while next < n && seen[next] {
                next += 1;
            }
        }
        prop_assume!(max_ahead <= window);
        check(bits, &puts, &order)?;
    }
}

#[test]
fn a_duplicate_or_far_future_number_is_refused() {
    let mut rx = SeqTracker::new(4);
    assert_eq!(rx.receive(0).unwrap(), 0);
    assert!(rx.receive(0).is_err(), "duplicate behind the window");
    assert!(rx.receive(9).is_err(), "more than half the space ahead");
}
