#!/bin/bash
# What colltrace adds to the 8 B all_reduce latency of torchcomms-perf, measured within one run
# per rank count (`--trace-ab`): on one communicator, blocks of BLOCK iterations alternate
# between recording paused and on (groups of four: off on on off, then on off off on), all ranks
# switching at the same iterations; rank 0 prints the median of the block means per setting and
# the median of the groups' paired on/off ratios with a bootstrap 95% interval. Unlike
# overhead.sh (separate processes per setting), process-to-process differences cancel.
# Results: docs/perf/colltrace.md.
#
#   cargo build --release -p torchcomms-perf
#   PERF=target/release/torchcomms-perf OUT=/tmp/overhead-ab colltrace/benches/overhead_ab.sh
#
# NS (rank counts, default "2 4 8"), BLOCK (iterations per block, default 1000), NGROUPS (groups
# of four blocks per run, default 25) and RUNS (runs per rank count, default 1) tune it.
set -u
D=$(dirname "$0")
P=${PERF:-$D/torchcomms-perf}
OUT=${OUT:-$(mktemp -d)}
BLOCK=${BLOCK:-1000}
NGROUPS=${NGROUPS:-25}
mkdir -p "$OUT"
nproc; lscpu | grep "Model name"
git -C "$D" rev-parse --short HEAD 2>/dev/null
for n in ${NS:-2 4 8}; do
  for r in $(seq 1 "${RUNS:-1}"); do
    echo "n=$n run=$r start: $(uptime)"
    log="$OUT/ab_n${n}_$r.txt"
    TORCHCOMMS_TRACE_BUFFER_SIZE=${TORCHCOMMS_TRACE_BUFFER_SIZE:-2000} "$P" -n "$n" \
      --op all_reduce -b 8 -e 8 -w 1000 -i $((4 * BLOCK * NGROUPS)) -c 0 \
      --trace-ab --ab-block "$BLOCK" > "$log" 2>&1 || echo "run failed n=$n run=$r (see $log)"
    grep -E "^trace-ab|records taken" "$log"
    echo "n=$n run=$r end: $(uptime)"
  done
done
