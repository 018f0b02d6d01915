"""Joins two sets of benchmark JSON files (Gloo against torchcomms-perf by default, or two
builds of torchcomms-perf) and prints the ratio per row.

    compare.py LABEL GLOO_JSON[,GLOO_JSON...] OURS_JSON[,OURS_JSON...] [NAME_A,NAME_B]

Several files per side are rounds of the same measurement (the bench script interleaves them);
each row keeps its best (shortest) time over the rounds, so a burst of load from elsewhere on
the machine during one round does not decide the comparison.
"""

import json
import sys


def load(paths):
    best = {}
    for path in paths.split(","):
        with open(path) as fh:
            rows = json.load(fh)
        for r in rows:
            key = (r["op"], int(r["bytes"]))
            if key not in best or r["time_us"] < best[key]["time_us"]:
                best[key] = r
    return best


def main() -> int:
    label, gloo_paths, ours_paths = sys.argv[1], sys.argv[2], sys.argv[3]
    a, b = (sys.argv[4] if len(sys.argv) > 4 else "gloo,ours").split(",")
    gloo, ours = load(gloo_paths), load(ours_paths)
    print(f"\n### {label}\n")
    print(f"| op | bytes | {a} us | {b} us | {a} busbw GB/s | {b} busbw GB/s | speedup (time) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    missing = 0
    slower = []
    for key in sorted(gloo, key=lambda k: (k[0], k[1])):
        g = gloo[key]
        o = ours.get(key)
        if o is None:
            missing += 1
            continue
        ratio = g["time_us"] / o["time_us"]
        if ratio < 1.0:
            slower.append(f"{key[0]} {key[1]} B ({ratio:.2f}x)")
        print(f"| {key[0]} | {key[1]} | {g['time_us']:.1f} | {o['time_us']:.1f} | {g['busbw_gbps']:.3f} | "
              f"{o['busbw_gbps']:.3f} | {ratio:.2f}x |")
    if missing:
        print(f"\n({missing} {a} rows had no matching {b} row)")
    print(f"\nRows where {b} is slower than {a}: {', '.join(slower) if slower else 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
