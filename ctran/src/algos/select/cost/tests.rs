use super::counts::log2_ceil;
use super::*;
use crate::algos::pipe::pow2_floor;
use crate::algos::select::Collective;

const CHUNK: usize = 1 << 20;

/// A call of `c` moving `bytes` in all on `n` ranks, in equal blocks where it has blocks.
fn shape(c: Collective, bytes: usize, n: usize) -> Shape {
    let blocks = matches!(
        c,
        Collective::AllGather
            | Collective::ReduceScatter
            | Collective::AllToAll
            | Collective::Scatter
            | Collective::Gather
    );
    let elem = if matches!(
        c,
        Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
    ) {
        4
    } else {
        1
    };
    Shape {
        collective: c,
        bytes,
        max_block: if blocks { bytes / n } else { bytes },
        equal: true,
        elem,
        uniform: true,
    }
}

/// Values of the order measured on TCP loopback, `q` ranks on a host of 2 cores.
fn model(q: usize) -> CostModel {
    CostModel {
        alpha: 15e-6,
        mu: 4e-6,
        beta: 1.0 / 1.5e9,
        gamma: 1.0 / 8e9,
        send_share: None,
        ranks_per_host: q,
        cores_per_host: 2,
        measured: false,
    }
}

/// Models that `tools/bench-algos.sh` measured on a 2-core machine, for 4 and 8 ranks, alpha
/// halved: it was measured as a one-way latency, of which a hop costs half. Beta here is the
/// maximum over ranks; the mean that ranks agree on is lower (1.4-2.6 ns/B on 8 ranks), and the
/// picks tested here stay the same with it.
fn measured(q: usize) -> CostModel {
    let (alpha, mu, beta, gamma) = match q {
        4 => (4.8e-6, 10.9e-6, 1.71e-9, 4.94e-11),
        8 => (14e-6, 10.6e-6, 5.45e-9, 4.96e-11),
        _ => unreachable!("measured for 4 and 8 ranks"),
    };
    CostModel {
        alpha,
        mu,
        beta,
        gamma,
        send_share: Some(LOOPBACK_SEND_SHARE),
        ranks_per_host: q,
        cores_per_host: 2,
        measured: true,
    }
}

fn pick(m: &CostModel, c: Collective, bytes: usize, n: usize) -> Algo {
    crate::algos::select::cheapest(m, &shape(c, bytes, n), n, CHUNK)
        .expect("some algorithm applies")
}

#[test]
fn logarithmic_algorithms_count_every_step() {
    for n in [2, 3, 4, 5, 6, 7, 8, 9, 16] {
        let lp = log2_ceil(pow2_floor(n));
        let folded = if pow2_floor(n) < n { 2.0 } else { 0.0 };
        for (algo, c, least) in [
            (
                Algo::AllReduceHalvingDoubling,
                Collective::AllReduce,
                2.0 * lp + folded,
            ),
            (
                Algo::AllGatherRecursiveDoubling,
                Collective::AllGather,
                lp + folded,
            ),
            (
                Algo::ReduceScatterRecursiveHalving,
                Collective::ReduceScatter,
                lp + folded,
            ),
            (Algo::AllGatherBruck, Collective::AllGather, log2_ceil(n)),
            (
                Algo::AllReduceTree,
                Collective::AllReduce,
                2.0 * log2_ceil(n),
            ),
        ] {
            let f = profile(algo, &shape(c, 8 * n, n), n, CHUNK);
            assert!(f.hops >= least, "{algo} on {n} ranks: {} hops", f.hops);
        }
    }
}

#[test]
fn every_algorithm_sends_and_grows_with_size() {
    let m = model(8);
    for n in [2, 3, 5, 8, 16] {
        for c in Collective::ALL {
            for &a in c.algos() {
                let small = profile(a, &shape(c, 64 * n, n), n, CHUNK);
                assert!(small.hops >= 1.0, "{a} on {n} ranks: no hop");
                assert!(
                    small.messages >= (n - 1) as f64,
                    "{a} on {n} ranks: {} messages",
                    small.messages
                );
                let mut last = 0.0;
                for k in 3..27 {
                    let t = m.cost(a, &shape(c, (1 << k) * n, n), n, CHUNK);
                    assert!(t > 0.0 && t >= last, "{a} on {n} ranks: {t} < {last}");
                    last = t;
                }
            }
        }
    }
    assert_eq!(
        profile(
            Algo::AllReduceRing,
            &shape(Collective::AllReduce, 64, 1),
            1,
            CHUNK
        ),
        Profile::default()
    );
}

#[test]
fn picks_follow_the_regimes() {
    for n in [4, 8] {
        let m = model(n);
        // Large: never the algorithms in which one rank sends the whole buffer to every
        // other (direct all_gather and reduce_scatter move no more than the ring).
        for c in [
            Collective::AllReduce,
            Collective::Broadcast,
            Collective::Reduce,
        ] {
            let a = pick(&m, c, 64 << 20, n);
            assert_ne!(a.name(), "direct", "{c} of 64 MiB on {n} ranks");
        }
        // Small: never the ring, whose 2(n-1) steps are all latency.
        let a = pick(&m, Collective::AllReduce, 8, n);
        assert_ne!(a, Algo::AllReduceRing, "8 B all_reduce on {n} ranks");
        let a = pick(&m, Collective::Broadcast, 8, n);
        assert_ne!(a, Algo::BroadcastChain, "8 B broadcast on {n} ranks");
    }
    // Mid sizes on 4 oversubscribed ranks: halving-doubling, which measured fastest from
    // 256 KiB to 8 MiB (docs/perf/algorithms.md): its halves move no more bytes than the ring's
    // pieces, in fewer steps.
    let a = pick(&model(4), Collective::AllReduce, 2 << 20, 4);
    assert_eq!(
        a,
        Algo::AllReduceHalvingDoubling,
        "2 MiB all_reduce on 4 ranks"
    );
    // Large reduce_scatter: direct, which folds every contribution straight into the
    // output; the ring combines each into a partial it then sends on. Direct measured 3-7%
    // faster than the ring at 256 KiB-16 MiB on 2 ranks with a core each, 10-25% from 2 MiB
    // on 4 ranks sharing 2 cores (docs/perf/algorithms.md).
    let a = pick(&model(2), Collective::ReduceScatter, 16 << 20, 2);
    assert_eq!(
        a,
        Algo::ReduceScatterDirect,
        "16 MiB reduce_scatter on 2 ranks"
    );
    let a = pick(&measured(4), Collective::ReduceScatter, 16 << 20, 4);
    assert_ne!(
        a,
        Algo::ReduceScatterRing,
        "16 MiB reduce_scatter on 4 ranks"
    );
}

#[test]
fn the_tree_all_reduce_yields_to_halving_doubling_where_it_stops_pipelining() {
    let ar = |bytes| pick(&measured(8), Collective::AllReduce, bytes, 8);
    // Small: the tree's 14 messages against halving-doubling's 48.
    assert_eq!(ar(64 << 10), Algo::AllReduceTree, "64 KiB all_reduce");
    // Below one chunk the tree moves the same bytes as halving-doubling along 6 levels in
    // turn, and measured 1.02-1.43x slower at 512 KiB and 1 MiB.
    for bytes in [512 << 10, 1 << 20] {
        assert_eq!(
            ar(bytes),
            Algo::AllReduceHalvingDoubling,
            "{bytes} B all_reduce"
        );
    }
}

#[test]
fn pieces_posted_at_once_cost_one_message_and_pipelined_ones_each() {
    let rs = shape(Collective::ReduceScatter, 4 << 20, 8);
    // Direct: blocks of 512 KiB in 4 pieces each, all posted at once.
    let direct = profile(Algo::ReduceScatterDirect, &rs, 8, CHUNK);
    assert_eq!((direct.hops, direct.messages), (4.0, 56.0));
    // Halving-doubling and recursive doubling: one transfer per rank and step.
    let ar = shape(Collective::AllReduce, 64 << 20, 8);
    let hd = profile(Algo::AllReduceHalvingDoubling, &ar, 8, CHUNK);
    assert_eq!(hd.messages, 8.0 * 2.0 * 3.0);
    // The ring: each of the 8 pieces of a block of 8 MiB waits for the step before.
    let ring = profile(Algo::AllReduceRing, &ar, 8, CHUNK);
    assert_eq!(ring.messages, 8.0 * 2.0 * 7.0 * 8.0);
    // Direct reduce_scatter measured 1.09-1.19x faster than the ring at 2-4 MiB on 8 ranks
    // of 2 cores in five of six runs (docs/perf/algorithms.md).
    assert_eq!(
        pick(&measured(8), Collective::ReduceScatter, 4 << 20, 8),
        Algo::ReduceScatterDirect
    );
}

#[test]
fn a_root_that_only_sends_pays_the_senders_share_over_loopback() {
    let loopback = measured(4);
    let duplex = CostModel {
        send_share: None,
        ..loopback
    };
    let bytes: usize = 1 << 20;
    let mb = bytes as f64;
    let bcast = profile(
        Algo::BroadcastDirect,
        &shape(Collective::Broadcast, bytes, 4),
        4,
        CHUNK,
    );
    assert_eq!(duplex.busiest(&bcast), 3.0 * mb);
    assert!((loopback.busiest(&bcast) - 2.0 * mb).abs() < 1.0);
    // A root that receives from every peer keeps its bytes: counted at the receiver's share,
    // direct reduce was picked on 4 ranks at 32-64 MiB, 1.12-1.18x slower than the tree.
    let reduce = profile(
        Algo::ReduceDirect,
        &shape(Collective::Reduce, bytes, 4),
        4,
        CHUNK,
    );
    assert_eq!(loopback.busiest(&reduce), 3.0 * mb);
    // 4 ranks of 2 cores, by the median of eight runs (docs/perf/algorithms.md): at 64 MiB the
    // tree took 0.88 of the chain's time. Counting the tree's root at its full sends picks the
    // chain.
    let pick_of = |m: &CostModel, bytes| pick(m, Collective::Broadcast, bytes, 4);
    assert_eq!(pick_of(&loopback, 64 << 20), Algo::BroadcastTree);
    assert_eq!(pick_of(&duplex, 64 << 20), Algo::BroadcastChain);
}

#[test]
fn a_pipeline_stage_over_loopback_lasts_its_senders_share() {
    let loopback = measured(4);
    let bytes: usize = 1 << 20;
    let tree = profile(
        Algo::BroadcastTree,
        &shape(Collective::Broadcast, bytes, 4),
        4,
        CHUNK,
    );
    // One piece: the root's transfer to its first child, then that child's to its own.
    assert_eq!(tree.path, 2.0 * bytes as f64);
    let direct = profile(
        Algo::BroadcastDirect,
        &shape(Collective::Broadcast, bytes, 4),
        4,
        CHUNK,
    );
    // The two transfers in turn, each at the sender's share, weigh less than the root's
    // three sends of direct, also at the sender's share.
    assert!(loopback.terms(&tree, 4)[2] < loopback.terms(&direct, 4)[2]);
    // 4 ranks of 2 cores at 512 KiB and 1 MiB (docs/perf/algorithms.md): the tree took 266 and
    // 637 us, direct 299 and 680 on an Intel Xeon; the tree 245 and 456, direct 257 and 628 on
    // an AMD EPYC. With each stage counted at its full bytes, direct was picked at both.
    for bytes in [512 << 10, 1 << 20] {
        let a = pick(&loopback, Collective::Broadcast, bytes, 4);
        assert_eq!(a, Algo::BroadcastTree, "{bytes} B broadcast on 4 ranks");
    }
}

#[test]
fn a_chain_below_one_chunk_moves_the_buffer_once_per_hop() {
    let bcast = |bytes| shape(Collective::Broadcast, bytes, 4);
    // One piece: the 3 hops of 4 ranks run in turn.
    let f = profile(Algo::BroadcastChain, &bcast(256 << 10), 4, CHUNK);
    assert_eq!(f.path, 3.0 * f64::from(256u32 << 10));
    // 64 pieces: the pipeline's fill adds 2 pieces to the buffer.
    let f = profile(Algo::BroadcastChain, &bcast(64 << 20), 4, CHUNK);
    assert_eq!(f.path, 66.0 * f64::from(1u32 << 20));
    // Below a chunk the model now ranks the tree's 2 hops ahead of the chain's 3 (measured
    // either way from run to run at 128-512 KiB on 4 ranks, docs/perf/algorithms.md).
    let a = pick(&measured(4), Collective::Broadcast, 256 << 10, 4);
    assert_ne!(a, Algo::BroadcastChain, "256 KiB broadcast on 4 ranks");
}

#[test]
fn scatter_and_gather_trees_stage_only_subtrees_of_several_blocks() {
    for (tree, direct, coll) in [
        (Algo::ScatterTree, Algo::ScatterDirect, Collective::Scatter),
        (Algo::GatherTree, Algo::GatherDirect, Collective::Gather),
    ] {
        // On 2 ranks the only child is a leaf: the tree sends what direct sends.
        let two = shape(coll, 512 << 10, 2);
        assert_eq!(
            profile(tree, &two, 2, CHUNK),
            profile(direct, &two, 2, CHUNK)
        );
        // On 8 ranks the root stages the blocks of its subtrees of 2 and 4 ranks.
        let f = profile(tree, &shape(coll, 8 << 10, 8), 8, CHUNK);
        assert_eq!(f.copied, f64::from(6u32 << 10), "{coll:?}");
    }
}

/// Bruck's copies run on every rank at once: with 8 ranks on 2 cores they cost 4 times the
/// gamma of one rank, with 2 ranks on 2 cores once; other algorithms' copies are not scaled.
#[test]
fn bruck_copies_share_the_cores() {
    let gamma_term = |algo: Algo, q: usize, n: usize| {
        let m = model(q);
        let f = profile(algo, &shape(Collective::AllToAll, 1 << 20, n), n, CHUNK);
        (m.terms(&f, n)[3], f.copied * m.gamma)
    };
    let (scaled, plain) = gamma_term(Algo::AllToAllBruck, 8, 8);
    assert!(plain > 0.0);
    assert!(
        (scaled - 4.0 * plain).abs() < 1e-12 * plain.max(1.0),
        "{scaled} vs {plain}"
    );
    let (scaled, plain) = gamma_term(Algo::AllToAllBruck, 2, 2);
    assert_eq!(scaled, plain);
    let m = model(8);
    let f = profile(
        Algo::ScatterTree,
        &shape(Collective::Scatter, 1 << 20, 8),
        8,
        CHUNK,
    );
    assert!(f.copied > 0.0);
    assert_eq!(m.terms(&f, 8)[3], (f.reduced + f.copied) * m.gamma);
}
