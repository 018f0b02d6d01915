"""Joins torch.distributed+NCCL rows and torchcomms-perf (nccl backend) rows into a markdown
table: time and busbw of each, and ours/torch busbw; with --ctran, a column for our own engine
(torchcomms-perf --backend ctran) and its ratio to torch. With several files per side (rounds run
alternately), each side's best round per row is shown. Rows from --lo to --hi bytes below
1 - --tol are flagged; the exit status is 0 either way (the table says)."""

import argparse
import json


def load(paths):
    best = {}
    for path in paths:
        with open(path) as fh:
            for r in json.load(fh):
                key = (r["op"], int(r["bytes"]))
                if key not in best or r["busbw_gbps"] > best[key]["busbw_gbps"]:
                    best[key] = r
    return best


def human(b: int) -> str:
    for unit, k in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--torch", nargs="+", required=True, help="nccl_bench.py JSON files")
    p.add_argument("--ours", nargs="+", required=True, help="torchcomms-perf --json files")
    p.add_argument("--ctran", nargs="*", default=[], help="torchcomms-perf --backend ctran JSON files")
    p.add_argument("--lo", type=int, default=1 << 20)
    p.add_argument("--hi", type=int, default=1 << 30)
    p.add_argument("--tol", type=float, default=0.03)
    a = p.parse_args()
    torch_rows, ours, ctran = load(a.torch), load(a.ours), load(a.ctran)
    with_ctran = bool(ctran)
    ops = sorted({k[0] for k in torch_rows})
    worst = {}
    for op in ops:
        print(f"\n#### {op}\n")
        extra_h = " ctran us | ctran busbw GB/s | ctran/torch |" if with_ctran else ""
        extra_s = "---:|---:|---:|" if with_ctran else ""
        print("| size | torch us | ours us | torch busbw GB/s | ours busbw GB/s | ours/torch |" + extra_h)
        print("|---:|---:|---:|---:|---:|---:|" + extra_s)
        for key in sorted(k for k in torch_rows if k[0] == op):
            t, o = torch_rows[key], ours.get(key)
            if o is None:
                print(f"| {human(key[1])} | {t['time_us']:.1f} | - | {t['busbw_gbps']:.2f} | - | - |")
                continue
            ratio = o["busbw_gbps"] / t["busbw_gbps"] if t["busbw_gbps"] > 0 else float("nan")
            flag = ""
            if a.lo <= key[1] <= a.hi:
                worst[op] = min(worst.get(op, 9.9), ratio)
                if ratio < 1 - a.tol:
                    flag = " **<**"
            extra = ""
            if with_ctran:
                c = ctran.get(key)
                if c is None:
                    extra = " - | - | - |"
                else:
                    cr = c["busbw_gbps"] / t["busbw_gbps"] if t["busbw_gbps"] > 0 else float("nan")
                    extra = f" {c['time_us']:.1f} | {c['busbw_gbps']:.2f} | {cr:.3f} |"
            print(f"| {human(key[1])} | {t['time_us']:.1f} | {o['time_us']:.1f} | "
                  f"{t['busbw_gbps']:.2f} | {o['busbw_gbps']:.2f} | {ratio:.3f}{flag} |" + extra)
    print(f"\nLowest ours/torch busbw from {human(a.lo)} to {human(a.hi)} (target >= {1 - a.tol:.2f}): "
          + ", ".join(f"{op} {r:.3f}" for op, r in worst.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
