#!/usr/bin/env python3
"""Markdown tables of `torchcomms-perf --algo all` runs (tools/bench-algos.sh).

    algos_report.py DIR N [N ...]

reads DIR/small-N.json and DIR/large-N.json for every rank count N (and the engine's log of its
auto choices, DIR/*-N.err) and prints, per (ranks, op), the time of every algorithm and of auto at
every size, then where auto is within 10% of the best single algorithm: as measured, and by the
algorithm it picked (that algorithm's own measurement, which takes the noise of the auto run
itself out of the comparison).

Rounds time every algorithm in turn, so round k of two algorithms saw about the same background
load. "A within 10% of the best" means: for every algorithm B, the median over rounds of A's
time over B's in the same round is at most 1.10 (rows without `rounds_us`, from one round,
compare their single times).

Where A is beyond 10%, a bootstrap over the rounds says whether the rounds' spread explains it:
the rounds are drawn again with replacement (the same draw for every algorithm, which keeps them
paired) and the largest median ratio recomputed; if its 5th percentile is still above 1.10, A is
beyond 10% with 95% confidence. On 2 ranks the algorithms of broadcast, scatter and gather send
the same messages, so how often they differ by more than 10% shows what the noise alone does in
the run.
"""

import json
import os
import random
import re
import statistics
import sys

TOLERANCE = 1.10
# Bootstrap draws per point; the bound moves by about 0.01 between seeds at 2000.
DRAWS = 2000
# Ops whose algorithms all send the same messages on 2 ranks: tree, chain and direct broadcast
# each send the root's buffer, in the same staging-chunk pieces, to the one other rank; tree and
# direct scatter and gather one block between the root and the other rank, in place.
SAME_ON_TWO_RANKS = ("broadcast", "scatter", "gather")


def size(b):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def ratios(a, b):
    """Row a's time over row b's, round by round."""
    ra, rb = a.get("rounds_us") or [a["time_us"]], b.get("rounds_us") or [b["time_us"]]
    return [x / y for x, y in zip(ra, rb) if y > 0]


def paired(a, b):
    """How much slower row a is than row b: the median of their per-round ratios."""
    r = ratios(a, b)
    return statistics.median(r) if r else 1.0


def lower_bound(series, seed):
    """The 5th percentile, over bootstrap draws of the rounds, of the largest median among the
    per-round ratio `series` (all of one point's rounds, so one draw serves every series): the
    bound that the largest ratio exceeds with 95% confidence. None with fewer than 3 rounds."""
    rounds = min((len(s) for s in series), default=0)
    if rounds < 3:
        return None
    rng = random.Random(seed)
    tops = []
    for _ in range(DRAWS):
        draw = [rng.randrange(rounds) for _ in range(rounds)]
        tops.append(max(statistics.median([s[i] for i in draw]) for s in series))
    tops.sort()
    return tops[DRAWS // 20]


def surely_beyond(series, seed):
    """Whether the largest median among the per-round ratio `series` is above 1.10 with 95%
    confidence (None: too few rounds to say)."""
    low = lower_bound(series, seed)
    return None if low is None else low > TOLERANCE


def trails_clearly(a, others, seed):
    """Whether row a trails some row of `others` by more than 10% with 95% confidence."""
    return surely_beyond([ratios(a, r) for r in others.values()], seed)


def noise_floor(rows):
    """(sizes, beyond 10%, beyond with 95% confidence) of the algorithms of one op that send the
    same messages: any two of them differing by more than 10% is noise."""
    by = {}
    for r in rows:
        if r["algo"] != "auto":
            by.setdefault(r["bytes"], {})[r["algo"]] = r
    sizes = beyond = clear = 0
    for s, algos in sorted(by.items()):
        if len(algos) < 2:
            continue
        series = [ratios(a, b) for a in algos.values() for b in algos.values() if a is not b]
        sizes += 1
        if max(statistics.median(x) for x in series if x) > TOLERANCE:
            beyond += 1
            clear += bool(surely_beyond(series, f"noise {s}"))
    return sizes, beyond, clear


def worst(a, others):
    """(name, ratio) of the algorithm row a trails most, by paired ratio."""
    return max(((k, paired(a, r)) for k, r in others.items()), key=lambda x: x[1], default=(None, None))


def fmt(t):
    if t is None:
        return "n/a"
    return f"{t:.0f}" if t >= 100 else f"{t:.1f}"


PICK = re.compile(r"auto choice shape=Shape \{ collective: (\w+), bytes: (\d+),.*?\} algo=\w+:(\w+)")


def picks(d, n):
    """(op, bytes) -> the algorithm auto picked, from the engine's debug log."""
    out = {}
    for part in ("small", "large"):
        path = os.path.join(d, f"{part}-{n}.err")
        if not os.path.exists(path):
            continue
        for line in open(path, errors="replace"):
            m = PICK.search(line)
            if m:
                op = re.sub(r"(?<!^)([A-Z])", r"_\1", m.group(1)).lower()
                out[(op, int(m.group(2)))] = m.group(3)
    return out


def main():
    d, ns = sys.argv[1], [int(x) for x in sys.argv[2:]]
    total = within = picked_ok = picked_cnt = 0
    # Points beyond 10% (auto as measured, the pick) and those beyond with 95% confidence.
    beyond = {"auto": 0, "pick": 0}
    clearly = {"auto": 0, "pick": 0}
    floors = []
    misses = []
    summary = []
    tables = []
    for n in ns:
        chosen = picks(d, n)
        rows = []
        for part in ("small", "large"):
            path = os.path.join(d, f"{part}-{n}.json")
            if os.path.exists(path):
                rows += json.load(open(path))
        wrong = sum(r["wrong"] or 0 for r in rows)
        if wrong:
            sys.exit(f"{n} ranks: {wrong} wrong elements")
        ops = []
        for r in rows:
            if r["op"] not in ops:
                ops.append(r["op"])
        for op in ops:
            mine = [r for r in rows if r["op"] == op]
            if n == 2 and op in SAME_ON_TWO_RANKS:
                floors.append((op, *noise_floor(mine)))
            algos = []
            for r in mine:
                if r["algo"] not in algos:
                    algos.append(r["algo"])
            algos = [a for a in algos if a != "auto"]
            by = {(r["bytes"], r["algo"]): r["time_us"] for r in mine}
            row = {(r["bytes"], r["algo"]): r for r in mine}
            sizes = sorted({r["bytes"] for r in mine})
            t = [f"#### {op}, {n} ranks", "",
                 "| size | " + " | ".join(algos) + " | auto | auto picks | auto/best | pick/best |",
                 "|---:|" + "---:|" * (len(algos) + 1) + ":---|---:|---:|"]
            ok_op = cnt_op = pick_op = pcnt_op = 0
            for s in sizes:
                times = {a: by.get((s, a)) for a in algos}
                have = {a: x for a, x in times.items() if x is not None}
                auto = by.get((s, "auto"))
                cells = []
                best = min(have, key=have.get) if have else None
                for a in algos:
                    c = fmt(times[a])
                    cells.append(f"**{c}**" if a == best else c)
                ratio = pratio = ""
                pick = chosen.get((op, s))
                if best is not None and auto is not None and have[best] > 0:
                    others = {a: row[(s, a)] for a in have}
                    best, q = worst(row[(s, "auto")], others)
                    ratio = f"{q:.2f}"
                    cnt_op += 1
                    seed = f"{n} {op} {s}"
                    sure = psure = None
                    if q <= TOLERANCE:
                        ok_op += 1
                    else:
                        ratio += " ✗"
                        beyond["auto"] += 1
                        sure = trails_clearly(row[(s, "auto")], others, seed)
                        clearly["auto"] += bool(sure)
                    pq = worst(others[pick], others)[1] if pick in have else None
                    if pq is not None:
                        pcnt_op += 1
                        pratio = f"{pq:.2f}"
                        if pq <= TOLERANCE:
                            pick_op += 1
                        else:
                            pratio += " ✗"
                            beyond["pick"] += 1
                            psure = trails_clearly(others[pick], others, seed)
                            clearly["pick"] += bool(psure)
                    if q > TOLERANCE or (pq or 0) > TOLERANCE:
                        misses.append((n, op, s, best, have[best], auto, q, sure, pick, pq, psure))
                t.append(f"| {size(s)} | " + " | ".join(cells)
                         + f" | {fmt(auto)} | {pick or '?'} | {ratio} | {pratio} |")
            total += cnt_op
            within += ok_op
            picked_ok += pick_op
            picked_cnt += pcnt_op
            summary.append((n, op, ok_op, cnt_op, f"{pick_op}/{pcnt_op}"))
            tables.append("\n".join(t))
    print(f"auto is within 10% of the best single algorithm at **{within} of {total}** "
          f"(ranks, op, size) points as measured; the algorithm auto picks is within 10% of the "
          f"best (by its own measurement) at **{picked_ok} of {picked_cnt}**"
          f"{'' if picked_cnt == total else ' where the pick is known'}.")
    print()
    print(f"Beyond 10% with 95% confidence (a bootstrap over the rounds; the other misses are "
          f"within what the rounds' spread allows): auto as measured at **{clearly['auto']}** of "
          f"its {beyond['auto']} misses, the pick at **{clearly['pick']}** of its "
          f"{beyond['pick']}.")
    print()
    for op, sizes, far, sure in floors:
        print(f"Noise floor: on 2 ranks the {op} algorithms send the same messages, yet one is "
              f"more than 10% behind another at {far} of {sizes} sizes ({sure} of them with 95% "
              f"confidence).")
        print()
    print("Per rank count and op: sizes where auto as measured is within 10% of the best, of all "
          "sizes; then sizes where the algorithm it picks is, of the sizes where the pick is known "
          "(an empty all_gather, reduce_scatter, scatter or gather, below one element per rank, "
          "never reaches the selector).")
    print()
    ops = []
    for _, op, _, _, _ in summary:
        if op not in ops:
            ops.append(op)
    print("| ranks | " + " | ".join(ops) + " |")
    print("|---:|" + "---:|" * len(ops))
    for n in ns:
        cells = []
        for op in ops:
            hit = [f"{a}/{b}, {p}" for m, o, a, b, p in summary if m == n and o == op]
            cells.append(hit[0] if hit else "-")
        print(f"| {n} | " + " | ".join(cells) + " |")
    print()
    if misses:
        print("Where auto as measured or its pick is more than 10% slower than the best algorithm "
              "(sure: beyond 10% with 95% confidence):")
        print()
        print("| ranks | op | size | best | best (us) | auto (us) | auto/best | sure | auto picks "
              "| pick/best | sure |")
        print("|---:|---|---:|---|---:|---:|---:|:---|---|---:|:---|")
        yes = {True: "yes", False: "no", None: ""}
        for n, op, s, best, bt, at, q, sure, pick, pq, psure in misses:
            pq = "?" if pq is None else f"{pq:.2f}"
            print(f"| {n} | {op} | {size(s)} | {best} | {fmt(bt)} | {fmt(at)} | {q:.2f} "
                  f"| {yes[sure]} | {pick or '?'} | {pq} | {yes[psure]} |")
        print()
    print("Times in microseconds (the best round; each round the average over the iterations "
          "of the slowest rank); **bold**: the algorithm with the best round; n/a: the algorithm "
          "cannot run that call; auto picks: the algorithm auto ran (from the engine's log); "
          "auto/best: the median over rounds of auto's time over another algorithm's in the same "
          "round, for the algorithm where it is largest; pick/best: the same for the picked "
          "algorithm's own runs.")
    print()
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
