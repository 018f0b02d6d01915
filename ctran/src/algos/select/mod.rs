//! Choosing the algorithm of each collective call.
//!
//! Precedence, per call: the hint `algo` of the call (`hints={"algo": "ring"}`), else the
//! communicator's configuration (`CTRAN_ALLREDUCE_ALGO=ring` and friends, read once at creation,
//! see [`AlgoConfig`]), else `auto`: the [`CostModel`] picks the algorithm it predicts fastest
//! for the call's collective, size and rank count among those that can run it. Auto choices are
//! cached per call shape.
//!
//! Every rank must run the same algorithm for the same call. Explicit choices are the same on
//! every rank when the ranks are configured alike; auto choices depend only on what all ranks
//! agree on: the call's sizes (all ranks pass the same ones) and a cost model whose parameters
//! were agreed at creation (see [`calibrate`]). The one exception is all_to_all with per-rank
//! split sizes, where ranks cannot see each other's sizes: auto only picks between `pairwise`
//! and `direct` there, which send the same messages and so interoperate, unless the caller
//! declares that every rank passes equal blocks ([`Hints::uniform`], which `all_to_all_single`
//! can promise); then `bruck` is a candidate too.
//!
//! The names per collective ([`names`]) are what `torchcomms-perf --algo` accepts.

pub mod calibrate;
pub mod cost;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::algos::reduce_scatter::recursive_halving;
use crate::comm::op::Op;
use crate::error::{Error, Result};
pub use cost::CostModel;

/// The collectives that have algorithms to choose from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    /// all_reduce.
    AllReduce,
    /// all_gather, all_gather_single, all_gather_v.
    AllGather,
    /// reduce_scatter, reduce_scatter_single, reduce_scatter_v.
    ReduceScatter,
    /// broadcast.
    Broadcast,
    /// reduce.
    Reduce,
    /// all_to_all, all_to_all_single, all_to_all_v_single.
    AllToAll,
    /// scatter.
    Scatter,
    /// gather.
    Gather,
    /// barrier.
    Barrier,
}

impl Collective {
    /// Every collective, in a stable order.
    pub const ALL: [Collective; 9] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
        Collective::Scatter,
        Collective::Gather,
        Collective::Barrier,
    ];

    /// The operation name (`all_reduce`, ...), as in [`Op::name`].
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "all_to_all",
            Collective::Scatter => "scatter",
            Collective::Gather => "gather",
            Collective::Barrier => "barrier",
        }
    }

    /// The collective named `name` (`all_reduce` or `allreduce`; the `_single`, `_v` and
    /// `_v_single` variants map to their collective).
    pub fn from_name(name: &str) -> Option<Collective> {
        let base = name.trim().to_ascii_lowercase().replace('_', "");
        let base = base
            .strip_suffix("vsingle")
            .or_else(|| base.strip_suffix("single"))
            .or_else(|| base.strip_suffix('v').filter(|b| b.len() > 4))
            .unwrap_or(&base);
        Collective::ALL
            .into_iter()
            .find(|c| c.name().replace('_', "") == base)
    }

    /// The collective of `op`; `None` for point-to-point operations.
    pub fn of(op: &Op) -> Option<Collective> {
        Some(match op {
            Op::AllReduce { .. } => Collective::AllReduce,
            Op::AllGather { .. } => Collective::AllGather,
            Op::ReduceScatter { .. } => Collective::ReduceScatter,
            Op::Broadcast { .. } => Collective::Broadcast,
            Op::Reduce { .. } => Collective::Reduce,
            Op::AllToAll { .. } => Collective::AllToAll,
            Op::Scatter { .. } => Collective::Scatter,
            Op::Gather { .. } => Collective::Gather,
            Op::Barrier => Collective::Barrier,
            _ => return None,
        })
    }

    /// The configuration variable that fixes this collective's algorithm.
    pub const fn env_var(self) -> &'static str {
        match self {
            Collective::AllReduce => "CTRAN_ALLREDUCE_ALGO",
            Collective::AllGather => "CTRAN_ALLGATHER_ALGO",
            Collective::ReduceScatter => "CTRAN_REDUCESCATTER_ALGO",
            Collective::Broadcast => "CTRAN_BROADCAST_ALGO",
            Collective::Reduce => "CTRAN_REDUCE_ALGO",
            Collective::AllToAll => "CTRAN_ALLTOALL_ALGO",
            Collective::Scatter => "CTRAN_SCATTER_ALGO",
            Collective::Gather => "CTRAN_GATHER_ALGO",
            Collective::Barrier => "CTRAN_BARRIER_ALGO",
        }
    }

    /// The algorithms of this collective.
    pub const fn algos(self) -> &'static [Algo] {
        use Algo::*;
        match self {
            Collective::AllReduce => &[
                AllReduceRing,
                AllReduceHalvingDoubling,
                AllReduceDirect,
                AllReduceTree,
            ],
            Collective::AllGather => &[
                AllGatherRing,
                AllGatherRecursiveDoubling,
                AllGatherBruck,
                AllGatherDirect,
            ],
            Collective::ReduceScatter => &[
                ReduceScatterRing,
                ReduceScatterRecursiveHalving,
                ReduceScatterDirect,
            ],
            Collective::Broadcast => &[BroadcastTree, BroadcastChain, BroadcastDirect],
            Collective::Reduce => &[ReduceTree, ReduceDirect],
            Collective::AllToAll => &[AllToAllPairwise, AllToAllDirect, AllToAllBruck],
            Collective::Scatter => &[ScatterTree, ScatterDirect],
            Collective::Gather => &[GatherTree, GatherDirect],
            Collective::Barrier => &[BarrierDissemination],
        }
    }

    /// The algorithm of this collective named `name` (`auto` is not one).
    pub fn algo(self, name: &str) -> Option<Algo> {
        let name = name.trim().to_ascii_lowercase();
        self.algos().iter().copied().find(|a| a.name() == name)
    }

    /// `auto, ring, ...`: the accepted values, for error messages.
    fn listing(self) -> String {
        let mut s = String::from("auto");
        for a in self.algos() {
            s.push_str(", ");
            s.push_str(a.name());
        }
        s
    }

    fn index(self) -> usize {
        Collective::ALL
            .iter()
            .position(|&c| c == self)
            .expect("every collective is in ALL")
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Every algorithm of every collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algo {
    /// all_reduce: pipelined ring (reduce-scatter + all-gather).
    AllReduceRing,
    /// all_reduce: recursive halving-doubling (Rabenseifner).
    AllReduceHalvingDoubling,
    /// all_reduce: one-shot, every rank reduces everything.
    AllReduceDirect,
    /// all_reduce: binomial reduce + broadcast.
    AllReduceTree,
    /// all_gather: pipelined ring.
    AllGatherRing,
    /// all_gather: recursive doubling.
    AllGatherRecursiveDoubling,
    /// all_gather: Bruck.
    AllGatherBruck,
    /// all_gather: everything to everyone at once.
    AllGatherDirect,
    /// reduce_scatter: pipelined ring.
    ReduceScatterRing,
    /// reduce_scatter: recursive halving.
    ReduceScatterRecursiveHalving,
    /// reduce_scatter: everything to its owner at once.
    ReduceScatterDirect,
    /// broadcast: binomial tree.
    BroadcastTree,
    /// broadcast: pipelined chain.
    BroadcastChain,
    /// broadcast: root to everyone.
    BroadcastDirect,
    /// reduce: binomial tree.
    ReduceTree,
    /// reduce: everyone to the root.
    ReduceDirect,
    /// all_to_all: pairwise exchange.
    AllToAllPairwise,
    /// all_to_all: everything in flight at once.
    AllToAllDirect,
    /// all_to_all: Bruck (small equal blocks).
    AllToAllBruck,
    /// scatter: binomial tree.
    ScatterTree,
    /// scatter: root to everyone.
    ScatterDirect,
    /// gather: binomial tree.
    GatherTree,
    /// gather: everyone to the root.
    GatherDirect,
    /// barrier: dissemination.
    BarrierDissemination,
}

impl Algo {
    /// The name accepted by hints and configuration (unique within its collective).
    pub const fn name(self) -> &'static str {
        use Algo::*;
        match self {
            AllReduceRing | AllGatherRing | ReduceScatterRing => "ring",
            AllReduceHalvingDoubling => "halving_doubling",
            AllGatherRecursiveDoubling => "recursive_doubling",
            ReduceScatterRecursiveHalving => "recursive_halving",
            AllGatherBruck | AllToAllBruck => "bruck",
            AllReduceDirect | AllGatherDirect | ReduceScatterDirect | BroadcastDirect
            | ReduceDirect | AllToAllDirect | ScatterDirect | GatherDirect => "direct",
            AllReduceTree | BroadcastTree | ReduceTree | ScatterTree | GatherTree => "tree",
            BroadcastChain => "chain",
            AllToAllPairwise => "pairwise",
            BarrierDissemination => "dissemination",
        }
    }

    /// The collective this algorithm implements.
    pub fn collective(self) -> Collective {
        Collective::ALL
            .into_iter()
            .find(|c| c.algos().contains(&self))
            .expect("every algorithm belongs to a collective")
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.collective(), self.name())
    }
}

/// The algorithm names of `collective` (without `auto`), for `--algo all` and documentation.
pub fn names(collective: Collective) -> Vec<&'static str> {
    collective.algos().iter().map(|a| a.name()).collect()
}

/// The algorithm names of the collective called `op` (`all_reduce`, `all_gather_single`, ...);
/// `None` when `op` is not a collective with algorithms.
pub fn names_for(op: &str) -> Option<Vec<&'static str>> {
    Collective::from_name(op).map(names)
}

/// An explicit algorithm or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Choice {
    /// Let the cost model pick.
    #[default]
    Auto,
    /// This algorithm.
    Fixed(Algo),
}

/// What a caller says about one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hints<'a> {
    /// The algorithm to run (`auto` or a name of the call's collective); `None` defers to the
    /// configuration.
    pub algo: Option<&'a str>,
    /// The caller guarantees that every rank passes blocks of one and the same size (as
    /// `all_to_all_single` does). Ranks of an all_to_all cannot see each other's sizes, so
    /// without this auto never picks an algorithm that needs equal blocks everywhere (Bruck).
    pub uniform: bool,
}

impl<'a> From<Option<&'a str>> for Hints<'a> {
    fn from(algo: Option<&'a str>) -> Hints<'a> {
        Hints {
            algo,
            uniform: false,
        }
    }
}

/// The choice for one queued call, resolved when it runs ([`Selector::resolve`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pick {
    /// Explicit algorithm or auto.
    pub choice: Choice,
    /// The caller declared uniform blocks ([`Hints::uniform`]).
    pub uniform: bool,
}

impl Choice {
    /// Parses `auto` or an algorithm name of `collective`; `arg` names the source in errors.
    pub fn parse(collective: Collective, name: &str, arg: &str) -> Result<Choice> {
        if name.trim().eq_ignore_ascii_case("auto") {
            return Ok(Choice::Auto);
        }
        collective.algo(name).map(Choice::Fixed).ok_or_else(|| {
            Error::invalid(
                arg,
                format!(
                    "one of {} (the algorithms of {collective})",
                    collective.listing()
                ),
                name,
            )
        })
    }
}

/// What the selector needs to know about a call. Every field is the same on every rank for the
/// same call (except for all_to_all with per-rank split sizes, see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// The collective.
    pub collective: Collective,
    /// Bytes of the whole operation: the buffer (all_reduce, reduce, broadcast), the gathered
    /// output (all_gather, gather), the input (reduce_scatter, scatter), what this rank sends
    /// (all_to_all).
    pub bytes: usize,
    /// Largest block of a collective made of blocks (the buffer otherwise).
    pub max_block: usize,
    /// All blocks have one size.
    pub equal: bool,
    /// Element size of reductions (1 otherwise).
    pub elem: usize,
    /// Every rank passes equal blocks of this size: known for every collective but all_to_all,
    /// where the caller must declare it ([`Hints::uniform`]).
    pub uniform: bool,
}

impl Shape {
    /// The shape of `op` on `n` ranks; `None` for point-to-point operations.
    pub fn of(op: &Op, n: usize) -> Option<Shape> {
        let collective = Collective::of(op)?;
        let blocks = |spans: &mut dyn Iterator<Item = usize>| {
            let (mut total, mut max, mut min) = (0, 0, usize::MAX);
            for l in spans {
                total += l;
                max = max.max(l);
                min = min.min(l);
            }
            (total, max, min == max || min == usize::MAX)
        };
        let whole = |bytes: usize, elem: usize| (bytes, bytes, true, elem);
        let (bytes, max_block, equal, elem) = match op {
            Op::AllReduce { buf, dtype, .. } | Op::Reduce { buf, dtype, .. } => {
                whole(buf.len(), dtype.size_bytes())
            }
            Op::Broadcast { buf, .. } => whole(buf.len(), 1),
            Op::AllGather { outputs, .. } => {
                let (t, m, e) = blocks(&mut outputs.iter().map(|s| s.len()));
                (t, m, e, 1)
            }
            Op::ReduceScatter { inputs, dtype, .. } => {
                let (t, m, e) = blocks(&mut inputs.iter().map(|s| s.len()));
                (t, m, e, dtype.size_bytes())
            }
            Op::AllToAll { inputs, outputs } => {
                let (_, m, e) = blocks(&mut inputs.iter().chain(outputs).map(|s| s.len()));
                (inputs.iter().map(|s| s.len()).sum(), m, e, 1)
            }
            Op::Scatter { output, .. } => (n * output.len(), output.len(), true, 1),
            Op::Gather { input, .. } => (n * input.len(), input.len(), true, 1),
            _ => (0, 0, true, 1),
        };
        Some(Shape {
            collective,
            bytes,
            max_block,
            equal,
            elem,
            uniform: equal && collective != Collective::AllToAll,
        })
    }
}

/// Why `algo` cannot run a call of `shape` on `n` ranks with staging chunks of `chunk_bytes`;
/// `None` when it can.
pub fn inapplicable(algo: Algo, shape: &Shape, n: usize, chunk_bytes: usize) -> Option<String> {
    match algo {
        // Ranks of an all_to_all cannot see each other's sizes: equal blocks here prove nothing
        // about another rank's, which might refuse Bruck while this one runs it.
        Algo::AllToAllBruck if !shape.uniform => Some(
            "bruck needs equal blocks on every rank, declared by the caller (all_to_all_single \
             declares them; all_to_all and all_to_all_v_single cannot)"
                .into(),
        ),
        Algo::AllToAllBruck if n.saturating_mul(shape.max_block) > chunk_bytes => Some(format!(
            "bruck needs all {n} blocks to fit one staging chunk ({chunk_bytes} bytes)"
        )),
        Algo::ScatterTree | Algo::GatherTree if n.saturating_mul(shape.max_block) > chunk_bytes => {
            Some(format!(
                "tree needs all {n} blocks to fit one staging chunk ({chunk_bytes} bytes)"
            ))
        }
        Algo::ReduceScatterRecursiveHalving
            if recursive_halving::round_bytes(chunk_bytes, n, shape.elem) == 0 =>
        {
            Some(format!(
                "recursive_halving needs chunk_bytes >= {n} x {} bytes",
                shape.elem
            ))
        }
        _ => None,
    }
}

/// The algorithm that `model` predicts fastest for a call of `shape` on `n` ranks with staging
/// chunks of `chunk_bytes`, among those that can run it (the first of equals, in
/// [`Collective::algos`] order); `None` when none can.
pub fn cheapest(model: &CostModel, shape: &Shape, n: usize, chunk_bytes: usize) -> Option<Algo> {
    // Ranks of an all_to_all_v may see different sizes: unless the caller declared uniform
    // blocks, Bruck is inapplicable and the rest send the same messages.
    let mut best: Option<(f64, Algo)> = None;
    for &a in shape.collective.algos() {
        if inapplicable(a, shape, n, chunk_bytes).is_some() {
            continue;
        }
        let t = model.cost(a, shape, n, chunk_bytes);
        if best.is_none_or(|(bt, _)| t < bt) {
            best = Some((t, a));
        }
    }
    best.map(|(_, a)| a)
}

/// Cost-model parameters given by configuration instead of measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CostOverrides {
    /// `CTRAN_COST_ALPHA_US`: latency of one hop of a collective, in microseconds.
    pub alpha_us: Option<f64>,
    /// `CTRAN_COST_MU_US`: CPU time of one message, in microseconds.
    pub mu_us: Option<f64>,
    /// `CTRAN_COST_BETA_GBPS`: bandwidth between two ranks, in GB/s.
    pub beta_gbps: Option<f64>,
    /// `CTRAN_COST_GAMMA_GBPS`: reduction throughput of one rank, in GB/s.
    pub gamma_gbps: Option<f64>,
}

impl CostOverrides {
    /// True when every parameter is given, so nothing needs measuring.
    pub fn complete(&self) -> bool {
        self.alpha_us.is_some()
            && self.mu_us.is_some()
            && self.beta_gbps.is_some()
            && self.gamma_gbps.is_some()
    }
}

/// Algorithm configuration of a communicator, read once at creation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AlgoConfig {
    /// The choice for each collective, in [`Collective::ALL`] order.
    choices: [Choice; 9],
    /// Cost-model parameters fixed by configuration.
    pub cost: CostOverrides,
}

impl AlgoConfig {
    /// Reads `CTRAN_<COLLECTIVE>_ALGO` for every collective (see [`Collective::env_var`];
    /// `auto` or unset: the cost model picks) and `CTRAN_COST_ALPHA_US`, `CTRAN_COST_MU_US`,
    /// `CTRAN_COST_BETA_GBPS`, `CTRAN_COST_GAMMA_GBPS`, through the cvars (environment, then the
    /// `TORCHCOMMS_CONFIG` file). An unknown name or an invalid value is an
    /// [`Error::InvalidArgument`] naming the variable and what is allowed.
    pub fn from_env() -> Result<AlgoConfig> {
        let cv = torchcomms_cvars::Cvars::load()
            .map_err(|e| Error::invalid(e.name(), e.expected(), e.value()))?;
        let mut cfg = AlgoConfig::default();
        for c in Collective::ALL {
            if let Some(e) = cv.entry(c.env_var()).filter(|e| e.is_set) {
                cfg.choices[c.index()] = Choice::parse(c, &e.value, c.env_var())?;
            }
        }
        cfg.cost = CostOverrides {
            alpha_us: cv.ctran_cost_alpha_us(),
            mu_us: cv.ctran_cost_mu_us(),
            beta_gbps: cv.ctran_cost_beta_gbps(),
            gamma_gbps: cv.ctran_cost_gamma_gbps(),
        };
        Ok(cfg)
    }

    /// The configured choice for `c`.
    pub fn choice(&self, c: Collective) -> Choice {
        self.choices[c.index()]
    }

    /// Fixes the choice for `c` (what `CTRAN_<C>_ALGO` does).
    pub fn set(&mut self, c: Collective, choice: Choice) {
        self.choices[c.index()] = choice;
    }
}

/// Most shapes whose auto choice is remembered; the cache starts over beyond.
const CACHE_LIMIT: usize = 4096;

/// The per-communicator selector: configuration, the agreed cost model, the cache of auto
/// choices.
#[derive(Debug)]
pub struct Selector {
    n: usize,
    chunk_bytes: usize,
    config: AlgoConfig,
    model: OnceLock<CostModel>,
    cache: Mutex<HashMap<Shape, Algo>>,
    /// Deadline of the calibration exchange.
    pub(crate) timeout: Duration,
}

impl Selector {
    /// A selector for `n` ranks with staging chunks of `chunk_bytes`.
    pub fn new(n: usize, chunk_bytes: usize, config: AlgoConfig, timeout: Duration) -> Selector {
        Selector {
            n,
            chunk_bytes: chunk_bytes.div_ceil(8) * 8,
            config,
            model: OnceLock::new(),
            cache: Mutex::new(HashMap::new()),
            timeout,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &AlgoConfig {
        &self.config
    }

    /// The agreed cost model, once calibration finished.
    pub fn model(&self) -> Option<CostModel> {
        self.model.get().copied()
    }

    /// Installs the agreed cost model (once; later calls are ignored).
    pub fn set_model(&self, model: CostModel) {
        let _ = self.model.set(model);
    }

    /// The explicit choice for `op` (hint over configuration), checked against the call:
    /// an unknown name, or one that cannot run this call, is an [`Error::InvalidArgument`]
    /// listing the algorithms that can. Point-to-point operations ignore the hint.
    pub fn choose(&self, op: &Op, hints: Hints<'_>) -> Result<Pick> {
        let Some(shape) = self.shape(op, hints.uniform) else {
            return Ok(Pick::default());
        };
        let c = shape.collective;
        let (choice, arg) = match hints.algo {
            Some(h) => (Choice::parse(c, h, "algo")?, "algo"),
            None => (self.config.choice(c), c.env_var()),
        };
        if let Choice::Fixed(algo) = choice {
            if let Some(why) = inapplicable(algo, &shape, self.n, self.chunk_bytes) {
                let usable: Vec<&str> = std::iter::once("auto")
                    .chain(
                        c.algos()
                            .iter()
                            .filter(|a| {
                                inapplicable(**a, &shape, self.n, self.chunk_bytes).is_none()
                            })
                            .map(|a| a.name()),
                    )
                    .collect();
                return Err(Error::invalid(
                    arg,
                    format!(
                        "an algorithm that can run this {c} ({} ranks, {} bytes): one of {} ({why})",
                        self.n,
                        shape.bytes,
                        usable.join(", ")
                    ),
                    algo.name(),
                ));
            }
        }
        Ok(Pick {
            choice,
            uniform: hints.uniform,
        })
    }

    /// The shape of a call of `op`, with equal blocks counting as uniform when the caller
    /// declared them so (`uniform`); `None` for point-to-point operations.
    fn shape(&self, op: &Op, uniform: bool) -> Option<Shape> {
        let mut shape = Shape::of(op, self.n)?;
        shape.uniform |= uniform && shape.equal;
        Some(shape)
    }

    /// The algorithm that runs `op` given `pick`; `None` for point-to-point operations.
    pub fn resolve(&self, op: &Op, pick: Pick) -> Option<Algo> {
        let shape = self.shape(op, pick.uniform)?;
        if let Choice::Fixed(a) = pick.choice {
            return Some(a);
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&a) = cache.get(&shape) {
            return Some(a);
        }
        let algo = self.auto(&shape);
        tracing::debug!(?shape, %algo, "auto choice");
        if cache.len() >= CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(shape, algo);
        Some(algo)
    }

    /// The cost model's pick for `shape` (the default model before calibration).
    fn auto(&self, shape: &Shape) -> Algo {
        let model = self.model().unwrap_or_default();
        cheapest(&model, shape, self.n, self.chunk_bytes).unwrap_or(shape.collective.algos()[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_per_collective_and_parse_back() {
        for c in Collective::ALL {
            let ns = names(c);
            assert!(!ns.is_empty());
            for (i, n) in ns.iter().enumerate() {
                assert!(!ns[..i].contains(n), "{c}: {n} twice");
                assert_eq!(
                    Choice::parse(c, n, "x").unwrap(),
                    Choice::Fixed(c.algos()[i])
                );
                assert_eq!(c.algos()[i].collective(), c);
            }
            assert_eq!(Choice::parse(c, "AUTO", "x").unwrap(), Choice::Auto);
            assert_eq!(Collective::from_name(c.name()), Some(c));
        }
        assert_eq!(
            Collective::from_name("allreduce"),
            Some(Collective::AllReduce)
        );
        assert_eq!(
            Collective::from_name("all_gather_single"),
            Some(Collective::AllGather)
        );
        assert_eq!(
            Collective::from_name("all_gather_v"),
            Some(Collective::AllGather)
        );
        assert_eq!(
            Collective::from_name("all_to_all_v_single"),
            Some(Collective::AllToAll)
        );
        assert_eq!(Collective::from_name("send_recv"), None);
        assert_eq!(names_for("reduce_scatter_v").unwrap().len(), 3);
    }

    #[test]
    fn unknown_names_list_the_valid_ones() {
        let e = Choice::parse(Collective::Broadcast, "ring", "algo").unwrap_err();
        assert!(e.is_invalid_argument());
        let msg = e.to_string();
        assert!(msg.contains("auto, tree, chain, direct"), "{msg}");
        assert!(msg.contains("broadcast") && msg.contains("ring"), "{msg}");
    }
}
