"""Joins a Gloo JSON file and a torchcomms-perf JSON file and prints the ratio per row."""

import json
import sys


def load(path):
    with open(path) as fh:
        rows = json.load(fh)
    return {(r["op"], int(r["bytes"])): r for r in rows}


def main() -> int:
    label, gloo_path, ours_path = sys.argv[1], sys.argv[2], sys.argv[3]
    gloo, ours = load(gloo_path), load(ours_path)
    print(f"\n### {label}\n")
    print("| op | bytes | gloo us | ours us | gloo busbw GB/s | ours busbw GB/s | speedup (time) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    missing = 0
    for key in sorted(gloo, key=lambda k: (k[0], k[1])):
        g = gloo[key]
        o = ours.get(key)
        if o is None:
            missing += 1
            continue
        print(f"| {key[0]} | {key[1]} | {g['time_us']:.1f} | {o['time_us']:.1f} | {g['busbw_gbps']:.3f} | "
              f"{o['busbw_gbps']:.3f} | {g['time_us'] / o['time_us']:.2f}x |")
    if missing:
        print(f"\n({missing} gloo rows had no matching torchcomms-perf row)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
