//! Replays recorded benchmark runs through the cost model: where would auto's pick be within
//! 10% of the best algorithm? Tunes the model without running the benchmark again.
//!
//! Reads the directories that `KEEP=DIR tools/bench-algos.sh` leaves: per rank count `N`,
//! `small-N.json` and `large-N.json` (every algorithm's time in every round) and `small-N.err`
//! and `large-N.err` (the engine's log: the model calibrated in that run, and the shape of each
//! call). For every (ranks, op, size) it asks this build's model for its pick, with the run's own
//! parameters, and compares the pick's rounds with every other algorithm's, round by round, as
//! `tools/algos_report.py` does (the median of same-round ratios). Prints the points
//! beyond 10% (with `--all`, every point) and a count per directory; `--explain` adds, under each
//! point printed, every algorithm's predicted time and its best measured round. Given several
//! directories, it also counts by each point's median over them: one run's noise moves a few
//! points across the 10% line, a point beyond it in most runs is the model's doing. And it
//! counts, for each run, where the algorithm best by the median of the other runs would be
//! within 10%: the most that any fixed choice per call shape can expect of one run.
//!
//! `--latency N=ALPHA_US:MU_US` (repeatable) replaces the calibrated alpha and mu of the runs of
//! `N` ranks: how much do the picks depend on what a calibration measured?
//!
//! ```text
//! cargo run --release -p torchcomms-tools --bin replay_cost_model -- /tmp/run1 /tmp/run2
//! cargo run --release -p torchcomms-tools --bin replay_cost_model -- --latency 4=15:14 /tmp/run1
//! ```

use std::collections::BTreeMap;

use ctran::algos::select::cost::{self, profile};
use ctran::algos::select::{calibrate, cheapest, Collective, CostModel, Shape};

/// Staging chunk of the recorded runs (`CTRAN_CHUNK_BYTES`, default).
const CHUNK: usize = 1 << 20;
/// "Within 10%".
const WITHIN: f64 = 1.10;

/// Times of every round, per algorithm, per (op, bytes).
type Rounds = BTreeMap<(String, usize), BTreeMap<String, Vec<f64>>>;

/// The text after `key` up to the next separator.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let rest = &line[line.find(key)? + key.len()..];
    let end = rest.find([',', ' ', '}', ']', ')']).unwrap_or(rest.len());
    Some(&rest[..end])
}

fn number<T: std::str::FromStr>(line: &str, key: &str) -> Result<T, String> {
    field(line, key)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no {key:?} in {line:?}"))
}

/// The model rank 0 agreed on, from the engine's log. Runs recorded before alpha was fitted to
/// probes (their log line has no `probe_secs`) measured alpha as a one-way latency, of which a
/// hop cost half.
fn model_of(log: &str) -> Result<CostModel, String> {
    let line = log
        .lines()
        .find(|l| l.contains("cost model agreed") && l.contains("rank=0 "))
        .ok_or("no \"cost model agreed\" line of rank 0 (RUST_LOG must include debug)")?;
    let per_hop = if line.contains("probe_secs=") {
        1.0
    } else {
        0.5
    };
    let ranks_per_host = number(line, "ranks_per_host: ")?;
    // Runs recorded before the share was agreed ran over TCP only (tools/bench-algos.sh).
    let send_share = match field(line, "send_share: ") {
        Some(v) if v.starts_with("Some(") => Some(number(v, "Some(")?),
        Some(_) => None,
        None => (ranks_per_host > 1).then_some(cost::LOOPBACK_SEND_SHARE),
    };
    Ok(CostModel {
        alpha: per_hop * number::<f64>(line, "alpha: ")?,
        mu: number(line, "mu: ")?,
        beta: number(line, "beta: ")?,
        gamma: number(line, "gamma: ")?,
        send_share,
        ranks_per_host,
        cores_per_host: number(line, "cores_per_host: ")?,
        measured: true,
    })
}

/// The shape of every call auto chose for, by (op name, bytes).
fn shapes_of(log: &str) -> Result<BTreeMap<(String, usize), Shape>, String> {
    let mut shapes = BTreeMap::new();
    for line in log.lines().filter(|l| l.contains("auto choice shape=")) {
        let name = field(line, "collective: ").unwrap_or_default();
        let Some(collective) = Collective::ALL
            .into_iter()
            .find(|c| format!("{c:?}") == name)
        else {
            return Err(format!("unknown collective in {line:?}"));
        };
        let shape = Shape {
            collective,
            bytes: number(line, "bytes: ")?,
            max_block: number(line, "max_block: ")?,
            equal: number(line, "equal: ")?,
            elem: number(line, "elem: ")?,
            uniform: number(line, "uniform: ")?,
        };
        shapes.insert((collective.name().to_string(), shape.bytes), shape);
    }
    Ok(shapes)
}

fn rounds_of(json: &str) -> Result<Rounds, String> {
    let rows: Vec<serde_json::Value> = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let mut out = Rounds::new();
    for r in &rows {
        let (Some(op), Some(algo), Some(bytes)) =
            (r["op"].as_str(), r["algo"].as_str(), r["bytes"].as_u64())
        else {
            continue;
        };
        let rounds: Vec<f64> = match r["rounds_us"].as_array() {
            Some(a) => a.iter().filter_map(|x| x.as_f64()).collect(),
            None => r["time_us"].as_f64().into_iter().collect(),
        };
        out.entry((op.to_string(), bytes as usize))
            .or_default()
            .insert(algo.to_string(), rounds);
    }
    Ok(out)
}

/// How much slower `a` is than `b`: the median of their same-round ratios.
fn paired(a: &[f64], b: &[f64]) -> f64 {
    let mut ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    calibrate::median(&mut ratios)
}

/// Alpha and mu in seconds given for runs of some rank counts (`--latency`).
type Latencies = BTreeMap<usize, (f64, f64)>;

/// `N=ALPHA_US:MU_US`.
fn parse_latency(arg: &str) -> Result<(usize, (f64, f64)), String> {
    let bad = || format!("--latency {arg:?}: expected N=ALPHA_US:MU_US, for example 4=15:14");
    let (n, values) = arg.split_once('=').ok_or_else(bad)?;
    let (alpha, mu) = values.split_once(':').ok_or_else(bad)?;
    let us = |v: &str| v.parse::<f64>().ok().filter(|x| *x >= 0.0).ok_or_else(bad);
    Ok((
        n.parse().map_err(|_| bad())?,
        (us(alpha)? * 1e-6, us(mu)? * 1e-6),
    ))
}

/// What to print besides the count.
#[derive(Clone, Copy)]
struct Show {
    /// Every point, not only those beyond 10%.
    all: bool,
    /// Under each point printed, every algorithm's predicted time next to its best round.
    explain: bool,
}

/// A (ranks, op, bytes) point.
type Point = (usize, String, usize);

/// One point of one run.
struct Replayed {
    point: Point,
    /// How much slower the pick is than the best algorithm there (the worst of its same-round
    /// medians).
    pick: f64,
    /// The same for every algorithm, by name.
    every: BTreeMap<String, f64>,
}

/// How much slower `mine` is than the best of `algos` (auto left out), and which that is.
fn worst<'a>(mine: &[f64], algos: &'a BTreeMap<String, Vec<f64>>) -> (f64, &'a str) {
    algos
        .iter()
        .filter(|(name, _)| *name != "auto")
        .map(|(name, r)| (paired(mine, r), name.as_str()))
        .fold((1.0, ""), |w, x| if x.0 > w.0 { x } else { w })
}

/// Every point of one directory replayed.
fn replay(dir: &str, show: Show, latencies: &Latencies) -> Result<Vec<Replayed>, String> {
    let mut points = Vec::new();
    for n in 1..=64 {
        for part in ["small", "large"] {
            let Ok(log) = std::fs::read_to_string(format!("{dir}/{part}-{n}.err")) else {
                continue;
            };
            let json = std::fs::read_to_string(format!("{dir}/{part}-{n}.json"))
                .map_err(|e| format!("{dir}/{part}-{n}.json: {e}"))?;
            let mut model = model_of(&log)?;
            if let Some(&(alpha, mu)) = latencies.get(&n) {
                (model.alpha, model.mu) = (alpha, mu);
            }
            let shapes = shapes_of(&log)?;
            for (key, algos) in rounds_of(&json)? {
                let Some(shape) = shapes.get(&key) else {
                    continue; // never reached the selector (an empty call)
                };
                let Some(pick) = cheapest(&model, shape, n, CHUNK) else {
                    continue;
                };
                let Some(mine) = algos.get(pick.name()) else {
                    continue;
                };
                let (worst_ratio, against) = worst(mine, &algos);
                let ok = worst_ratio <= WITHIN;
                let every = algos
                    .iter()
                    .filter(|(name, _)| *name != "auto")
                    .map(|(name, r)| (name.clone(), worst(r, &algos).0))
                    .collect();
                points.push(Replayed {
                    point: (n, key.0.clone(), key.1),
                    pick: worst_ratio,
                    every,
                });
                if show.all || !ok {
                    println!(
                        "{} {n} ranks {:>14} {:>10} B: picks {:<18} {worst_ratio:.2}x {against}",
                        if ok { " " } else { "X" },
                        key.0,
                        key.1,
                        pick.name()
                    );
                    if show.explain {
                        explain(&model, shape, n, &algos);
                    }
                }
            }
        }
    }
    Ok(points)
}

/// Over several runs: the median of each point's ratio, and the points beyond 10% by it (a
/// point that misses in most runs is the model's, not the noise's).
fn summarize(runs: BTreeMap<Point, Vec<f64>>, count: usize) {
    let points = runs.len();
    let mut within = 0;
    let mut beyond = Vec::new();
    for (point, mut ratios) in runs {
        let m = calibrate::median(&mut ratios);
        if m <= WITHIN {
            within += 1;
        } else {
            beyond.push((point, m));
        }
    }
    println!(
        "over the {count} runs, by each point's median: the pick is within 10% at {within} of \
         {points}"
    );
    for ((n, op, bytes), m) in beyond {
        println!("  {n} ranks {op:>14} {bytes:>10} B: {m:.2}x by the median");
    }
}

/// For each run, where a fixed choice of algorithm per point, the one best by the median of the
/// other runs, would be within 10%: what the runs' own variation leaves to any model that picks
/// from call shapes alone.
fn fixed_choice(runs: &[(String, Vec<Replayed>)]) {
    // Each run's points by (ranks, op, bytes).
    let indexed: Vec<BTreeMap<&Point, &BTreeMap<String, f64>>> = runs
        .iter()
        .map(|(_, points)| points.iter().map(|q| (&q.point, &q.every)).collect())
        .collect();
    for (k, (dir, points)) in runs.iter().enumerate() {
        let mut within = 0;
        for p in points {
            let others: Vec<&BTreeMap<String, f64>> = indexed
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != k)
                .filter_map(|(_, run)| run.get(&p.point).copied())
                .collect();
            let median_of = |name: &str| {
                let mut v: Vec<f64> = others.iter().filter_map(|e| e.get(name).copied()).collect();
                if v.is_empty() {
                    f64::INFINITY
                } else {
                    calibrate::median(&mut v)
                }
            };
            let choice = p
                .every
                .keys()
                .map(|name| (median_of(name), name))
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, name)| name);
            if choice.is_some_and(|name| p.every[name] <= WITHIN) {
                within += 1;
            }
        }
        println!(
            "{dir}: the algorithm best by the other runs' median would be within 10% at {within} \
             of {}",
            points.len()
        );
    }
}

/// Every algorithm of a point: the model's prediction and the best measured round.
fn explain(model: &CostModel, shape: &Shape, n: usize, algos: &BTreeMap<String, Vec<f64>>) {
    for &a in shape.collective.algos() {
        let Some(rounds) = algos.get(a.name()) else {
            continue;
        };
        let best = rounds.iter().copied().fold(f64::INFINITY, f64::min);
        let us = model
            .terms(&profile(a, shape, n, CHUNK), n)
            .map(|t| t * 1e6);
        println!(
            "      {:<18} predicted {:>10.1} us (hops {:.1}, messages {:.1}, bytes {:.1}, \
             reduced and copied {:.1}), best round {best:>10.1} us",
            a.name(),
            us.iter().sum::<f64>(),
            us[0],
            us[1],
            us[2],
            us[3]
        );
    }
}

fn main() {
    const USAGE: &str =
        "usage: replay_cost_model [--all] [--explain] [--latency N=ALPHA_US:MU_US]... DIR...  \
                         (KEEP directories of tools/bench-algos.sh)";
    let mut show = Show {
        all: false,
        explain: false,
    };
    let mut latencies = Latencies::new();
    let mut dirs = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--all" => show.all = true,
            "--explain" => show.explain = true,
            "--latency" => match args.next().as_deref().map(parse_latency) {
                Some(Ok((n, lat))) => {
                    latencies.insert(n, lat);
                }
                Some(Err(e)) => {
                    eprintln!("{e}");
                    std::process::exit(2);
                }
                None => {
                    eprintln!("--latency needs a value\n{USAGE}");
                    std::process::exit(2);
                }
            },
            "-h" | "--help" => {
                eprintln!("{USAGE}");
                return;
            }
            _ => dirs.push(a),
        }
    }
    if dirs.is_empty() {
        eprintln!("{USAGE}");
        std::process::exit(2);
    }
    let mut runs = Vec::new();
    for dir in &dirs {
        match replay(dir, show, &latencies) {
            Ok(points) => {
                let within = points.iter().filter(|p| p.pick <= WITHIN).count();
                println!(
                    "{dir}: the pick is within 10% at {within} of {}",
                    points.len()
                );
                runs.push((dir.clone(), points));
            }
            Err(e) => {
                eprintln!("{dir}: {e}");
                std::process::exit(1);
            }
        }
    }
    if runs.len() > 1 {
        let mut by_point: BTreeMap<Point, Vec<f64>> = BTreeMap::new();
        for p in runs.iter().flat_map(|(_, points)| points) {
            by_point.entry(p.point.clone()).or_default().push(p.pick);
        }
        summarize(by_point, runs.len());
        fixed_choice(&runs);
    }
}
