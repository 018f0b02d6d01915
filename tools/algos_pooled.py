#!/usr/bin/env python3
"""Where is auto within 10% of the best single algorithm by the median over several runs?

    algos_pooled.py DIR [DIR ...]

reads the directories that `KEEP=DIR tools/bench-algos.sh` leaves (DIR/small-N.json and
DIR/large-N.json for every rank count N found) and counts, per (ranks, op, size), auto's ratio to
each algorithm as one run measures it (the median over rounds of same-round ratios, as
algos_report.py does), then the median of that ratio over the runs. Auto is within 10% at a point
when that median is at most 1.10 against every algorithm.

Why: on a shared 2-core VM one run's rounds are too few to tell 10% apart at every size: from
1 MiB up (10 rounds of a few iterations), even algorithms that send the very same messages on 2
ranks come out more than 10% apart at some sizes, with a random sign. A median over runs takes
that out; a miss that stays is the pick's doing. Runs may differ in what auto
picks (each calibrates its own cost model): the count is of auto as it ran.

Prints the count, the points beyond 10% with every run's ratio, and the same median for the
2-rank noise floor (algorithms that send the same messages, algos_report.SAME_ON_TWO_RANKS).

Then what any fixed choice could reach, auto aside (auto's choice for a (ranks, op, size) is
fixed once made): the points where no single algorithm is within 10% of the best in every run,
so that whatever is chosen there misses in some run; and, each run left out in turn, how many
of its points the choice made from the other runs alone gets within 10% (the algorithm within
10% in most of them, then the one with the smallest median ratio to the best).
"""

import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from algos_report import SAME_ON_TWO_RANKS, TOLERANCE, paired, size, worst  # noqa: E402


def rows_of(d):
    """(ranks, op, bytes) -> {algo: row} of one run directory."""
    out = {}
    for name in sorted(os.listdir(d)):
        stem, ext = os.path.splitext(name)
        part, _, n = stem.partition("-")
        if ext != ".json" or part not in ("small", "large") or not n.isdigit():
            continue
        for r in json.load(open(os.path.join(d, name))):
            out.setdefault((int(n), r["op"], r["bytes"]), {})[r["algo"]] = r
    return out


def algorithms_at(runs, key):
    """The algorithms (auto aside) that some run timed at `key`."""
    return sorted({a for rows in runs for a in rows.get(key, {}) if a != "auto"})


def pooled(runs, key, a, b):
    """Row a's paired ratio to row b at `key` in every run that has both, and their median."""
    each = [paired(rows[key][a], rows[key][b]) for rows in runs
            if a in rows.get(key, {}) and b in rows.get(key, {})]
    return each, (statistics.median(each) if each else None)


def trails(rows, a):
    """How much slower algorithm `a` is than the best of the others in one run's `rows` at a
    point (below 1 where it is the fastest)."""
    ratio = worst(rows[a], {b: r for b, r in rows.items() if b not in (a, "auto")})[1]
    return 1.0 if ratio is None else ratio


def fixed_choice(runs, keys):
    """Prints what a choice of one algorithm per point, the same in every run, could reach."""
    # (ranks, op, size) -> {algorithm timed in every run: how much it trails, run by run}
    table = {}
    for key in keys:
        if all(key in rows for rows in runs):
            algos = [a for a in algorithms_at(runs, key) if all(a in rows[key] for rows in runs)]
            table[key] = {a: [trails(rows[key], a) for rows in runs] for a in algos}
    none_fits = []
    for key, each in table.items():
        if each and not any(max(w) <= TOLERANCE for w in each.values()):
            best = min(each, key=lambda a: max(each[a]))
            none_fits.append((key, best, each[best]))
    print(f"A fixed choice: at {len(none_fits)} of {len(table)} points no algorithm is within "
          f"10% of the best in every run (the one closest in its worst run, and its ratio in "
          f"each run):")
    print()
    for (n, op, s), a, each in none_fits:
        print(f"- {n} ranks, {op}, {size(s)}: {a} " + " ".join(f"{x:.2f}" for x in each))
    print()
    if len(runs) < 2:
        return
    hits = []
    for i in range(len(runs)):
        hit = 0
        for each in table.values():
            if not each:
                continue

            def merit(a):
                others = each[a][:i] + each[a][i + 1:]
                return (sum(w <= TOLERANCE for w in others), -statistics.median(others))

            hit += each[max(each, key=merit)][i] <= TOLERANCE
        hits.append(hit)
    print("Each run left out in turn, the choice made from the other runs is within 10% at "
          + ", ".join(f"{h}" for h in hits) + f" of {len(table)} points.")
    print()


def main():
    dirs = sys.argv[1:]
    if not dirs:
        sys.exit(__doc__)
    runs = [rows_of(d) for d in dirs]
    keys = sorted({k for rows in runs for k in rows})
    total = within = 0
    misses = []
    for key in keys:
        algos = algorithms_at(runs, key)
        worst = None
        for b in algos:
            each, med = pooled(runs, key, "auto", b)
            if med is not None and (worst is None or med > worst[1]):
                worst = (b, med, each)
        if worst is None:
            continue
        total += 1
        if worst[1] <= TOLERANCE:
            within += 1
        else:
            misses.append((key, *worst))
    print(f"Over {len(dirs)} runs ({', '.join(os.path.basename(d.rstrip('/')) for d in dirs)}): "
          f"auto is within 10% of the best single algorithm at **{within} of {total}** "
          f"(ranks, op, size) points by the median over runs of its same-round ratio.")
    print()
    if misses:
        print("| ranks | op | size | trails | median | every run |")
        print("|---:|---|---:|---|---:|---|")
        for (n, op, s), b, med, each in misses:
            print(f"| {n} | {op} | {size(s)} | {b} | {med:.2f} | "
                  + " ".join(f"{x:.2f}" for x in each) + " |")
        print()
    for op in SAME_ON_TWO_RANKS:
        sizes = beyond = 0
        for key in keys:
            if key[:2] != (2, op):
                continue
            algos = algorithms_at(runs, key)
            meds = [pooled(runs, key, a, b)[1] for a in algos for b in algos if a != b]
            meds = [m for m in meds if m is not None]
            if not meds:
                continue
            sizes += 1
            beyond += max(meds) > TOLERANCE
        if sizes:
            print(f"Noise floor by the same median: on 2 ranks the {op} algorithms, which send "
                  f"the same messages, are more than 10% apart at {beyond} of {sizes} sizes.")
            print()
    fixed_choice(runs, keys)


if __name__ == "__main__":
    main()
