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
python3 - <<'PY'
import json, glob, os, statistics as st
out = os.environ["OUT"]
for n in (2, 4, 8):
    res = {}
    for b in (0, 2000):
        ts = [json.load(open(f))[0]["time_us"] for f in sorted(glob.glob(f"{out}/r_n{n}_b{b}_*.json"))]
        res[b] = ts
        if ts:
            print(f"n={n} buffer={b}: runs={len(ts)} median={st.median(ts):.3f} us mean={st.mean(ts):.3f} min={min(ts):.3f} max={max(ts):.3f}")
    if res[0] and res[2000]:
        print(f"n={n} overhead: median {100*(st.median(res[2000])/st.median(res[0])-1):+.2f}%  mean {100*(st.mean(res[2000])/st.mean(res[0])-1):+.2f}%  min {100*(min(res[2000])/min(res[0])-1):+.2f}%")
PY
if [ -x "$B" ]; then
  "$B" --bench --warm-up-time 1 --measurement-time 3 2>&1 | grep -E "record|now_ns|time:"
fi
