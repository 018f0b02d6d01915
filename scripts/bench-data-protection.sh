#!/usr/bin/env bash
# What TORCHCOMMS_DATA_PROTECTION costs: torchcomms-perf over TCP only (CTRAN_BACKENDS=socket)
# with the modes none, integrity and encrypt run in turn, --reps times (interleaved, so a burst
# of load from elsewhere hits every mode alike), 8 B to 64 MiB, each size timed --rounds times
# per run and its best round kept (torchcomms-perf --rounds). Prints, per op and size, the
# median time of each mode over the repetitions, its spread (min-max) and its ratio to none.
#
#   scripts/bench-data-protection.sh [--nranks N] [--reps R] [--rounds K]
#                                    [--ops all_reduce,send_recv] [--out FILE]
# Env: PERF (a prebuilt torchcomms-perf; default: cargo build --release), PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
NRANKS=2
REPS=3
ROUNDS=3
OPS=all_reduce,send_recv
OUT=/dev/null
while [ $# -gt 0 ]; do
    case "$1" in
        --nranks) NRANKS=$2; shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --ops) OPS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ -z "${PERF:-}" ]; then
    cargo build --release -q -p torchcomms-perf
    PERF=$PWD/target/release/torchcomms-perf
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
MODES="none integrity encrypt"
for ((r = 0; r < REPS; r++)); do
    for mode in $MODES; do
        echo "# rep $r, $mode, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
        CTRAN_BACKENDS=socket TORCHCOMMS_DATA_PROTECTION=$mode "$PERF" -n "$NRANKS" -b 8 -e 64M \
            --op "$OPS" -d f32 --rounds "$ROUNDS" --max-iter-bytes 1G --json "$TMP/$mode-$r.json" >/dev/null
    done
done
"${PYTHON:-python3}" - "$TMP" "$REPS" "$NRANKS" <<'EOF' | tee "$OUT"
import json, statistics, sys
tmp, reps, n = sys.argv[1], int(sys.argv[2]), sys.argv[3]
modes = ["none", "integrity", "encrypt"]
t = {}  # (op, bytes) -> mode -> [time_us per rep]
for m in modes:
    for r in range(reps):
        for row in json.load(open(f"{tmp}/{m}-{r}.json")):
            if row.get("wrong"):
                sys.exit(f"{m}, rep {r}: {row['op']} {row['bytes']} B had wrong results")
            t.setdefault((row["op"], row["bytes"]), {}).setdefault(m, []).append(row["time_us"])
def size(b):
    for u, s in ((1 << 20, "MiB"), (1 << 10, "KiB")):
        if b >= u:
            return f"{b // u} {s}"
    return f"{b} B"
for op in sorted({k[0] for k in t}):
    print(f"\n{op}, {n} ranks, TCP only: median time in us of {reps} runs (min-max), x none\n")
    print("| size | none | integrity | x | encrypt | x |")
    print("|---:|---:|---:|---:|---:|---:|")
    for (o, b), per in sorted(t.items()):
        if o != op:
            continue
        med = {m: statistics.median(per[m]) for m in modes}
        cell = lambda m: f"{med[m]:.1f} ({min(per[m]):.1f}-{max(per[m]):.1f})"
        print(f"| {size(b)} | {cell('none')} | {cell('integrity')} | {med['integrity'] / med['none']:.2f} "
              f"| {cell('encrypt')} | {med['encrypt'] / med['none']:.2f} |")
EOF
