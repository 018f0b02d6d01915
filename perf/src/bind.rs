//! `--bind`: each launched rank runs on its own CPUs. The launcher plans the CPU lists and hands
//! each rank its list in [`BIND_VAR`]; the rank binds itself before it starts any thread, so
//! its progress thread inherits the mask.

use anyhow::{bail, Context, Result};
use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// The CPUs (comma-separated) a launched rank binds itself to.
pub(crate) const BIND_VAR: &str = "TORCHCOMMS_PERF_CPUS";

/// The CPUs this process may run on, in increasing order.
pub(crate) fn allowed_cpus() -> Result<Vec<usize>> {
    let mask = sched_getaffinity(Pid::from_raw(0)).context("reading this process's CPU mask")?;
    Ok((0..CpuSet::count())
        .filter(|&c| mask.is_set(c).unwrap_or(false))
        .collect())
}

/// CPUs of each of `n` ranks from `allowed`: equal contiguous parts (the remainder unused), or
/// one CPU each, round robin, when there are fewer CPUs than ranks.
pub(crate) fn plan(allowed: &[usize], n: usize) -> Vec<Vec<usize>> {
    if allowed.is_empty() {
        return vec![Vec::new(); n];
    }
    let per = allowed.len() / n.max(1);
    (0..n)
        .map(|r| {
            if per == 0 {
                vec![allowed[r % allowed.len()]]
            } else {
                allowed[r * per..(r + 1) * per].to_vec()
            }
        })
        .collect()
}

/// The value of [`BIND_VAR`] for `cpus`.
pub(crate) fn encode(cpus: &[usize]) -> String {
    cpus.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Binds this process to the CPUs its launcher named in [`BIND_VAR`], if any. Call before
/// starting threads.
pub(crate) fn apply_from_env() -> Result<()> {
    // Named literally (it is BIND_VAR) so that the scan of direct environment reads sees it.
    let Ok(list) = std::env::var("TORCHCOMMS_PERF_CPUS") else {
        return Ok(());
    };
    if list.trim().is_empty() {
        bail!("{BIND_VAR} is empty: expected a comma-separated list of CPU numbers");
    }
    let mut set = CpuSet::new();
    for cpu in list.split(',') {
        let c: usize = cpu
            .trim()
            .parse()
            .with_context(|| format!("{BIND_VAR}={list:?}: {cpu:?} is not a CPU number"))?;
        set.set(c)
            .with_context(|| format!("{BIND_VAR}={list:?}: CPU {c} is out of range"))?;
    }
    sched_setaffinity(Pid::from_raw(0), &set)
        .with_context(|| format!("binding to CPUs {list} ({BIND_VAR})"))?;
    tracing::info!(cpus = ?allowed_cpus()?, "bound");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_parts_or_round_robin() {
        assert_eq!(plan(&[0, 1], 2), vec![vec![0], vec![1]]);
        assert_eq!(plan(&[0, 1, 2, 3, 4], 2), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(
            plan(&[0, 1], 4),
            vec![vec![0], vec![1], vec![0], vec![1]],
            "oversubscribed: one CPU each"
        );
        assert_eq!(plan(&[4, 6], 3), vec![vec![4], vec![6], vec![4]]);
    }

    #[test]
    fn the_variable_lists_cpus_by_comma() {
        assert_eq!(encode(&[0, 5, 12]), "0,5,12");
        assert_eq!(encode(&[3]), "3");
    }
}
