//! Rank and size discovery from launcher environment variables.
//!
//! The order follows torchcomms' `query_ranksize()`: an explicit `TORCHCOMM_RANK` /
//! `TORCHCOMM_SIZE` pair always wins; then, as allowed by
//! `TORCHCOMM_BOOTSTRAP_RANKSIZE_QUERY_METHOD` (`auto`, the default, tries them all in this
//! order):
//!
//! | method     | launcher  | rank / size                                    | local rank / size                                  |
//! |------------|-----------|------------------------------------------------|----------------------------------------------------|
//! | `mpi`      | Open MPI  | `OMPI_COMM_WORLD_RANK` / `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` / `..._LOCAL_SIZE`   |
//! | `mpi`      | MPICH/PMI | `PMI_RANK` / `PMI_SIZE`                         | `MPI_LOCALRANKID` / `MPI_LOCALNRANKS`              |
//! | `pals`     | PALS      | `PALS_RANKID` / first of `PALS_SIZE`, `PMI_SIZE`, `OMPI_COMM_WORLD_SIZE`, `WORLD_SIZE`, else lines of `PBS_NODEFILE` × `PALS_LOCAL_SIZE` | `PALS_LOCAL_RANKID` / `PALS_LOCAL_SIZE` |
//! | `torchrun` | torchrun  | `RANK` / `WORLD_SIZE`                           | `LOCAL_RANK` / `LOCAL_WORLD_SIZE`                  |
//! | `slurm`    | SLURM     | `SLURM_PROCID` / `SLURM_NTASKS`                 | `SLURM_LOCALID` / `SLURM_NTASKS_PER_NODE` if a plain number |
//!
//! SLURM comes last because `srun` often starts torchrun or MPI, whose variables are the
//! precise ones, and because a batch script run without `srun` also sees `SLURM_PROCID=0`.
//! The method `env` disables every launcher: only `TORCHCOMM_RANK`/`TORCHCOMM_SIZE` count.
//!
//! A launcher counts only when both its rank and size variables are set (torchcomms skips a
//! half-set pair too); a set variable that does not parse, or a rank not below the size, is an
//! error naming the variable, never silently skipped.

use crate::error::{Error, Result};

/// Environment variable that restricts which launchers are consulted.
pub const QUERY_METHOD_VAR: &str = "TORCHCOMM_BOOTSTRAP_RANKSIZE_QUERY_METHOD";

/// Where this process sits in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    /// Global rank, `< size`.
    pub rank: usize,
    /// Number of ranks in the job.
    pub size: usize,
    /// Rank among the processes on this host, when the launcher says.
    pub local_rank: Option<usize>,
    /// Number of ranks on this host, when the launcher says.
    pub local_size: Option<usize>,
    /// Which launcher the values came from: `"torchcomm"`, `"openmpi"`, `"pmi"`, `"pals"`,
    /// `"torchrun"` or `"slurm"`.
    pub source: &'static str,
}

/// The values of [`QUERY_METHOD_VAR`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueryMethod {
    /// Try every launcher in order (default).
    Auto,
    /// torchrun only.
    Torchrun,
    /// Open MPI and MPICH/PMI only.
    Mpi,
    /// PALS only.
    Pals,
    /// SLURM only.
    Slurm,
    /// None: only `TORCHCOMM_RANK`/`TORCHCOMM_SIZE`.
    Env,
}

impl QueryMethod {
    /// Parses a method name, case-insensitively.
    pub fn parse(value: &str) -> Result<Self> {
        Ok(match value.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => QueryMethod::Auto,
            "torchrun" => QueryMethod::Torchrun,
            "mpi" => QueryMethod::Mpi,
            "pals" => QueryMethod::Pals,
            "slurm" => QueryMethod::Slurm,
            "env" | "manual" => QueryMethod::Env,
            _ => {
                return Err(Error::invalid(
                    QUERY_METHOD_VAR,
                    "one of auto, torchrun, mpi, pals, slurm, env",
                    value,
                ))
            }
        })
    }

    fn allows(self, launcher: Kind) -> bool {
        match self {
            QueryMethod::Auto => true,
            QueryMethod::Torchrun => launcher == Kind::Torchrun,
            QueryMethod::Mpi => launcher == Kind::Mpi,
            QueryMethod::Pals => launcher == Kind::Pals,
            QueryMethod::Slurm => launcher == Kind::Slurm,
            QueryMethod::Env => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mpi,
    Pals,
    Torchrun,
    Slurm,
}

/// One launcher's variables.
struct Launcher {
    source: &'static str,
    kind: Option<Kind>,
    rank: &'static str,
    /// Candidates for the size, first set one wins.
    size: &'static [&'static str],
    local_rank: Option<&'static str>,
    local_size: Option<&'static str>,
}

const LAUNCHERS: &[Launcher] = &[
    Launcher {
        source: "torchcomm",
        kind: None,
        rank: "TORCHCOMM_RANK",
        size: &["TORCHCOMM_SIZE"],
        local_rank: None,
        local_size: None,
    },
    Launcher {
        source: "openmpi",
        kind: Some(Kind::Mpi),
        rank: "OMPI_COMM_WORLD_RANK",
        size: &["OMPI_COMM_WORLD_SIZE"],
        local_rank: Some("OMPI_COMM_WORLD_LOCAL_RANK"),
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    Launcher {
        source: "pmi",
        kind: Some(Kind::Mpi),
        rank: "PMI_RANK",
        size: &["PMI_SIZE"],
        local_rank: Some("MPI_LOCALRANKID"),
        local_size: Some("MPI_LOCALNRANKS"),
    },
    Launcher {
        source: "pals",
        kind: Some(Kind::Pals),
        rank: "PALS_RANKID",
        size: &[
            "PALS_SIZE",
            "PMI_SIZE",
            "OMPI_COMM_WORLD_SIZE",
            "WORLD_SIZE",
        ],
        local_rank: Some("PALS_LOCAL_RANKID"),
        local_size: Some("PALS_LOCAL_SIZE"),
    },
    Launcher {
        source: "torchrun",
        kind: Some(Kind::Torchrun),
        rank: "RANK",
        size: &["WORLD_SIZE"],
        local_rank: Some("LOCAL_RANK"),
        local_size: Some("LOCAL_WORLD_SIZE"),
    },
    Launcher {
        source: "slurm",
        kind: Some(Kind::Slurm),
        rank: "SLURM_PROCID",
        size: &["SLURM_NTASKS"],
        local_rank: Some("SLURM_LOCALID"),
        local_size: None,
    },
];

/// Discovers rank and size from the process environment. `Ok(None)` when no launcher
/// variables are set (a single process started by hand).
pub fn discover() -> Result<Option<RankInfo>> {
    // Launcher-provided inputs (torchrun, SLURM, Open MPI, PMI: see `LAUNCHERS`), not tunables,
    // so read directly and not declared as cvars.
    discover_from(|name| std::env::var(name).ok())
}

/// [`discover`] over any variable lookup, so callers and tests need not touch the process
/// environment. `PBS_NODEFILE`, when consulted for PALS, is read from the file system.
pub fn discover_from(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<RankInfo>> {
    let method = match lookup(QUERY_METHOD_VAR) {
        Some(v) => QueryMethod::parse(&v)?,
        None => QueryMethod::Auto,
    };
    for l in LAUNCHERS {
        if let Some(kind) = l.kind {
            if !method.allows(kind) {
                continue;
            }
        }
        if let Some(info) = try_launcher(l, &lookup)? {
            tracing::debug!(?info, "rank and size from the environment");
            return Ok(Some(info));
        }
    }
    Ok(None)
}

fn try_launcher(
    l: &Launcher,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<Option<RankInfo>> {
    let Some(rank_text) = lookup(l.rank) else {
        return Ok(None);
    };
    let size = match l.size.iter().find_map(|var| lookup(var).map(|v| (*var, v))) {
        Some((var, text)) => Some((var, parse_count(var, &text)?)),
        None if l.kind == Some(Kind::Pals) => pbs_size(lookup)?,
        None => None,
    };
    let Some((size_var, size)) = size else {
        tracing::debug!(
            rank_var = l.rank,
            "rank variable set without a size; skipping launcher"
        );
        return Ok(None);
    };
    let rank = parse_index(l.rank, &rank_text)?;
    if size == 0 {
        return Err(Error::invalid(size_var, "a size of at least 1", size));
    }
    if rank >= size {
        return Err(Error::invalid(
            l.rank,
            format!("a rank below {size_var}={size}"),
            rank_text,
        ));
    }
    let local_rank = l.local_rank.and_then(|v| lookup(v).map(|t| (v, t)));
    let local_rank = local_rank.map(|(v, t)| parse_index(v, &t)).transpose()?;
    let local_size = match (l.source, l.local_size) {
        // SLURM_NTASKS_PER_NODE may be "4(x2)" on heterogeneous layouts: only a plain number
        // is a local size.
        ("slurm", _) => lookup("SLURM_NTASKS_PER_NODE").and_then(|t| t.trim().parse().ok()),
        (_, Some(var)) => lookup(var).map(|t| parse_count(var, &t)).transpose()?,
        (_, None) => None,
    };
    if let (Some(lr), Some(ls)) = (local_rank, local_size) {
        if lr >= ls {
            let var = l.local_rank.unwrap_or("local rank");
            return Err(Error::invalid(
                var,
                format!("a local rank below the local size {ls}"),
                lr,
            ));
        }
    }
    if let Some(ls) = local_size {
        if ls > size {
            let var = l.local_size.unwrap_or("SLURM_NTASKS_PER_NODE");
            return Err(Error::invalid(
                var,
                format!("a local size at most {size_var}={size}"),
                ls,
            ));
        }
    }
    Ok(Some(RankInfo {
        rank,
        size,
        local_rank,
        local_size,
        source: l.source,
    }))
}

/// PALS under PBS without a size variable: nodes in `PBS_NODEFILE` × `PALS_LOCAL_SIZE` (every
/// node runs the same number of ranks).
fn pbs_size(lookup: &impl Fn(&str) -> Option<String>) -> Result<Option<(&'static str, usize)>> {
    let (Some(path), Some(per_node)) = (lookup("PBS_NODEFILE"), lookup("PALS_LOCAL_SIZE")) else {
        return Ok(None);
    };
    let per_node = parse_count("PALS_LOCAL_SIZE", &per_node)?;
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::io(format!("reading PBS_NODEFILE {path}"), e))?;
    let nodes = text.lines().filter(|l| !l.trim().is_empty()).count();
    Ok((nodes > 0).then_some(("PBS_NODEFILE", nodes * per_node)))
}

fn parse_index(var: &str, text: &str) -> Result<usize> {
    text.trim()
        .parse()
        .map_err(|_| Error::invalid(var, "a non-negative integer", text))
}

fn parse_count(var: &str, text: &str) -> Result<usize> {
    let n = parse_index(var, text)?;
    if n == 0 {
        return Err(Error::invalid(var, "a positive integer", text));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn found(pairs: &[(&str, &str)]) -> RankInfo {
        discover_from(env(pairs))
            .unwrap()
            .expect("a launcher should match")
    }

    fn invalid_var(pairs: &[(&str, &str)]) -> String {
        match discover_from(env(pairs)) {
            Err(Error::InvalidArgument { arg, .. }) => arg,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn nothing_set_is_none() {
        assert_eq!(discover_from(env(&[])).unwrap(), None);
        // A lone rank without a size is not a launcher.
        assert_eq!(discover_from(env(&[("RANK", "1")])).unwrap(), None);
    }

    #[test]
    fn each_launcher_alone() {
        let t = found(&[("TORCHCOMM_RANK", "2"), ("TORCHCOMM_SIZE", "4")]);
        assert_eq!(
            (t.rank, t.size, t.local_rank, t.source),
            (2, 4, None, "torchcomm")
        );

        let o = found(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]);
        assert_eq!(
            o,
            RankInfo {
                rank: 3,
                size: 8,
                local_rank: Some(1),
                local_size: Some(2),
                source: "openmpi"
            }
        );

        let p = found(&[
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "5"),
            ("MPI_LOCALRANKID", "0"),
        ]);
        assert_eq!(
            (p.rank, p.size, p.local_rank, p.local_size, p.source),
            (0, 5, Some(0), None, "pmi")
        );

        let pals = found(&[
            ("PALS_RANKID", "6"),
            ("PALS_SIZE", "7"),
            ("PALS_LOCAL_RANKID", "2"),
        ]);
        assert_eq!(
            (pals.rank, pals.size, pals.local_rank, pals.source),
            (6, 7, Some(2), "pals")
        );

        let tr = found(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "3"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "3"),
        ]);
        assert_eq!(
            (tr.rank, tr.size, tr.local_rank, tr.local_size),
            (1, 3, Some(1), Some(3))
        );
        assert_eq!(tr.source, "torchrun");

        let s = found(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS_PER_NODE", "8"),
        ]);
        assert_eq!(
            (s.rank, s.size, s.local_rank, s.local_size),
            (5, 16, Some(1), Some(8))
        );
        assert_eq!(s.source, "slurm");
        let s = found(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_NTASKS_PER_NODE", "2(x2)"),
        ]);
        assert_eq!(
            s.local_size, None,
            "a SLURM task layout is not a plain local size"
        );
    }

    #[test]
    fn pals_size_fallbacks() {
        let p = found(&[("PALS_RANKID", "1"), ("PMI_SIZE", "4")]);
        // PMI_RANK is absent, so this is PALS (not PMI) with its size from PMI_SIZE.
        assert_eq!((p.rank, p.size, p.source), (1, 4, "pals"));
        let p = found(&[("PALS_RANKID", "1"), ("WORLD_SIZE", "2")]);
        assert_eq!((p.size, p.source), (2, "pals"));

        let dir = std::env::temp_dir().join(format!("torchcomms-pbs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let nodefile = dir.join("nodes");
        std::fs::write(&nodefile, "node1\nnode2\n\nnode3\n").unwrap();
        let p = found(&[
            ("PALS_RANKID", "11"),
            ("PALS_LOCAL_SIZE", "4"),
            ("PBS_NODEFILE", nodefile.to_str().unwrap()),
        ]);
        assert_eq!((p.rank, p.size, p.local_size), (11, 12, Some(4)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn precedence_follows_torchcomms() {
        let all = [
            ("TORCHCOMM_RANK", "0"),
            ("TORCHCOMM_SIZE", "1"),
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("PMI_RANK", "2"),
            ("PMI_SIZE", "3"),
            ("PALS_RANKID", "3"),
            ("PALS_SIZE", "4"),
            ("RANK", "4"),
            ("WORLD_SIZE", "5"),
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "6"),
        ];
        let order = ["torchcomm", "openmpi", "pmi", "pals", "torchrun", "slurm"];
        for (skip, expect) in order.iter().enumerate() {
            let pairs: Vec<_> = all[skip * 2..].to_vec();
            let got = found(&pairs);
            assert_eq!(got.source, *expect);
            assert_eq!(got.rank, skip);
        }
    }

    #[test]
    fn query_method_restricts_the_launchers() {
        let base = [
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("PALS_RANKID", "3"),
            ("PALS_SIZE", "4"),
            ("RANK", "4"),
            ("WORLD_SIZE", "5"),
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "6"),
        ];
        let with = |m: &str| {
            let mut v = base.to_vec();
            v.push((QUERY_METHOD_VAR, m));
            discover_from(env(&v)).unwrap().map(|i| i.source)
        };
        assert_eq!(with("auto"), Some("openmpi"));
        assert_eq!(with("TorchRun"), Some("torchrun"));
        assert_eq!(with("mpi"), Some("openmpi"));
        assert_eq!(with("pals"), Some("pals"));
        assert_eq!(with("slurm"), Some("slurm"));
        assert_eq!(with("env"), None);
        // TORCHCOMM_RANK/SIZE win whatever the method.
        let v = [
            ("TORCHCOMM_RANK", "0"),
            ("TORCHCOMM_SIZE", "1"),
            (QUERY_METHOD_VAR, "torchrun"),
        ];
        assert_eq!(found(&v).source, "torchcomm");
        assert_eq!(
            invalid_var(&[(QUERY_METHOD_VAR, "carrier-pigeon")]),
            QUERY_METHOD_VAR
        );
    }

    #[test]
    fn invalid_values_name_the_variable() {
        assert_eq!(invalid_var(&[("RANK", "one"), ("WORLD_SIZE", "2")]), "RANK");
        assert_eq!(invalid_var(&[("RANK", "-1"), ("WORLD_SIZE", "2")]), "RANK");
        assert_eq!(
            invalid_var(&[("RANK", "0"), ("WORLD_SIZE", "2x")]),
            "WORLD_SIZE"
        );
        assert_eq!(
            invalid_var(&[("RANK", "0"), ("WORLD_SIZE", "0")]),
            "WORLD_SIZE"
        );
        assert_eq!(invalid_var(&[("RANK", "2"), ("WORLD_SIZE", "2")]), "RANK");
        assert_eq!(
            invalid_var(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "x")]),
            "LOCAL_RANK"
        );
        assert_eq!(
            invalid_var(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("LOCAL_RANK", "2"),
                ("LOCAL_WORLD_SIZE", "2")
            ]),
            "LOCAL_RANK"
        );
        assert_eq!(
            invalid_var(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("LOCAL_WORLD_SIZE", "3")
            ]),
            "LOCAL_WORLD_SIZE"
        );
        // The message carries the bad value.
        let err = discover_from(env(&[("TORCHCOMM_RANK", "7"), ("TORCHCOMM_SIZE", "4")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("TORCHCOMM_RANK") && err.contains('7'), "{err}");
    }

    #[test]
    fn whitespace_around_numbers_is_accepted() {
        let t = found(&[("RANK", " 1\n"), ("WORLD_SIZE", "2 ")]);
        assert_eq!((t.rank, t.size), (1, 2));
    }
}
