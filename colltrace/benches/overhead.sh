#!/bin/bash
# What colltrace adds to the 8 B all_reduce latency of torchcomms-perf: runs it with tracing off
# (TORCHCOMMS_TRACE_BUFFER_SIZE=0) and on (2000, the default), alternating (the order swapped
# every round), for 2, 4 and 8 local ranks; prints median, mean and min per setting; then the
# per-record micro-benchmark (benches/record.rs). Results: docs/perf/colltrace.md.
#
#   cargo build --release -p torchcomms-perf && cargo bench -p colltrace --no-run
#   PERF=target/release/torchcomms-perf BENCH=target/release/deps/record-<hash> \
#       OUT=/tmp/overhead colltrace/benches/overhead.sh
#
# NS (rank counts), ROUNDS (default 15) and ITERS (default 20000) tune it. Use a machine with
# at least 2 cores per rank: oversubscribed ranks measure the scheduler, not the trace.
set -u
D=$(dirname "$0")
P=${PERF:-$D/torchcomms-perf}
B=${BENCH:-$D/colltrace-record-bench}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export OUT
nproc; lscpu | grep "Model name"
for n in ${NS:-2 4 8}; do
  for i in $(seq 1 "${ROUNDS:-15}"); do
    if [ $((i % 2)) = 0 ]; then order="0 2000"; else order="2000 0"; fi
    for b in $order; do
      TORCHCOMMS_TRACE_BUFFER_SIZE=$b "$P" -n "$n" --op all_reduce -b 8 -e 8 -w 1000 \
        -i "${ITERS:-20000}" -c 0 --json "$OUT/r_n${n}_b${b}_$i.json" > /dev/null 2>&1 \
        || echo "run failed n=$n b=$b i=$i"
    done
  done
done
NS="${NS:-2 4 8}" python3 - <<'PY'
import json, glob, os, random, statistics as st
out = os.environ["OUT"]
random.seed(1)
def load(n, b, i):
    try:
        return json.load(open(f"{out}/r_n{n}_b{b}_{i}.json"))[0]["time_us"]
    except (OSError, ValueError, IndexError, KeyError):
        return None
for n in map(int, os.environ["NS"].split()):
    rounds = sorted({int(f.rsplit("_", 1)[1][:-5]) for f in glob.glob(f"{out}/r_n{n}_b0_*.json")})
    pairs = [(load(n, 0, i), load(n, 2000, i)) for i in rounds]
    pairs = [(a, b) for a, b in pairs if a and b]
    if not pairs:
        continue
    off = [a for a, _ in pairs]
    on = [b for _, b in pairs]
    for name, ts in (("off", off), ("on", on)):
        q = st.quantiles(ts, n=4)
        print(f"n={n} tracing {name}: runs={len(ts)} median={st.median(ts):.3f} us quartiles={q[0]:.3f}..{q[2]:.3f} min={min(ts):.3f} max={max(ts):.3f}")
    # Each round ran both settings back to back: the ratio within a round cancels slow drifts.
    ratios = [b / a - 1 for a, b in pairs]
    boot = sorted(st.median(random.choices(ratios, k=len(ratios))) for _ in range(2000))
    lo, hi = boot[50], boot[1949]
    print(f"n={n} overhead: median of paired ratios {100*st.median(ratios):+.2f}% (95% CI {100*lo:+.2f}%..{100*hi:+.2f}%), ratio of medians {100*(st.median(on)/st.median(off)-1):+.2f}%, ratio of means {100*(st.mean(on)/st.mean(off)-1):+.2f}%")
PY
if [ -x "$B" ]; then
  "$B" --bench --warm-up-time 1 --measurement-time 3 2>&1 | grep -E "record|now_ns|thread|time:"
fi
