use ctran::DataType;

use super::rank::short_reason;
use super::row::{paired_ratio, Layout};
use super::*;

fn timed(rounds: &[f64]) -> Row {
    Row {
        op: "all_reduce",
        algo: None,
        dtype: "f32",
        redop: "sum",
        root: None,
        bytes: 8,
        count: 2,
        time_us: rounds.iter().copied().fold(f64::INFINITY, f64::min),
        issue_us: 0.0,
        algbw_gbps: 0.0,
        busbw_gbps: 0.0,
        wrong: None,
        nranks: 2,
        rounds_us: rounds.to_vec(),
    }
}

#[test]
fn the_paired_ratio_is_the_median_of_same_round_ratios() {
    // The best rounds alone (10 against 5) would call `a` twice as slow; round by round it
    // is twice as fast in two rounds of three.
    let (a, b) = (timed(&[10.0, 100.0, 30.0]), timed(&[20.0, 200.0, 5.0]));
    assert_eq!(paired_ratio(&a, &b), 0.5);
    assert_eq!(paired_ratio(&b, &a), 2.0);
    // One round each: the plain ratio.
    assert_eq!(paired_ratio(&timed(&[3.0]), &timed(&[2.0])), 1.5);
    assert!(!serde_json::to_string(&timed(&[3.0]))
        .unwrap()
        .contains("rounds_us"));
}

#[test]
fn layouts_follow_nccl_tests() {
    let l = layout(CollOp::AllReduce, 3, DataType::F32, 10);
    assert_eq!(l, Layout { bytes: 8, count: 2 });
    let l = layout(CollOp::AllGather, 3, DataType::F32, 100);
    assert_eq!(
        l,
        Layout {
            bytes: 96,
            count: 24
        }
    );
    let l = layout(CollOp::Scatter, 4, DataType::F64, 8);
    assert_eq!(l, Layout { bytes: 0, count: 0 });
    let l = layout(CollOp::SendRecv, 4, DataType::Bool, 7);
    assert_eq!(l, Layout { bytes: 7, count: 7 });
}

#[test]
fn refusals_keep_their_reason() {
    assert_eq!(
        short_reason("x: expected one of auto, direct (tree needs all 2 blocks to fit one staging chunk (1048576 bytes)), got tree"),
        "tree needs all 2 blocks to fit one staging chunk (1048576 bytes)"
    );
    assert_eq!(short_reason("no parentheses"), "no parentheses");
    assert_eq!(short_reason("unbalanced)"), "unbalanced)");
}

#[test]
fn bus_factors() {
    assert_eq!(CollOp::AllReduce.bus_factor(4), 1.5);
    assert_eq!(CollOp::AllGather.bus_factor(4), 0.75);
    assert_eq!(CollOp::Broadcast.bus_factor(4), 1.0);
    assert_eq!(CollOp::AllReduce.bus_factor(1), 0.0);
}
