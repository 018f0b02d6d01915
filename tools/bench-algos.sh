#!/usr/bin/env bash
# Every algorithm of every collective against `auto`, over TCP between local ranks: the tables of
# docs/perf/algorithms.md. For 2, 4 and 8 ranks, 8 B to 64 MB (x2 steps), it runs
# `torchcomms-perf --algo all` (each size timed with every algorithm in turn, several rounds,
# every round's time kept) and writes one markdown table per (ranks, op) with the best round of
# every algorithm and of auto, then a summary of where auto is within 10% of the best algorithm
# by the median of same-round ratios, which misses stand beyond the rounds' spread (95%
# bootstrap), and how often algorithms that send the same messages (broadcast, scatter and gather
# on 2 ranks) differ by more than 10% (tools/algos_report.py).
#
#   tools/bench-algos.sh [--out FILE]
#
# Environment: NS (rank counts, default "2 4 8"), OPS (comma-separated, default every
# collective), MAX (largest size, default 64M), ROUNDS_SMALL / ROUNDS_LARGE (rounds below and from
# 1 MiB, default 30 and 10: with half as many, auto and its own pick, the same code, come out more
# than 10% apart at about twice as many points), ITER_BYTES (most data timed per size and round
# from 1 MiB, default 128M), MIN_ITER_BYTES (least, default 64M: a round of 8 iterations of 1 MiB
# lasts about a millisecond, too short to tell 10% apart; 64 iterations halve the spread of
# same-round ratios at 1-2 MiB),
# BIND (1, default: rank counts up to the number of cores run with `--bind`, one core per rank,
# as `mpirun --bind-to core` places them; 0: the scheduler places every rank), PERF (the binary;
# default: built here). Shared memory is off (CTRAN_BACKENDS=socket), so every
# algorithm and auto run over TCP on loopback. About 18 minutes on a 2-core machine. The raw
# tables and JSON rows stay in $KEEP when it is set; then `tools/algos_pooled.py DIR...` judges
# auto by the median over several kept runs, and
# `cargo run --release -p torchcomms-tools --bin replay_cost_model -- $KEEP` replays them through
# the cost model of the build at hand (where would its picks be within 10%?).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=/dev/stdout
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        *) echo "usage: $0 [--out FILE]" >&2; exit 2 ;;
    esac
done
NS=${NS:-2 4 8}
OPS=${OPS:-all_reduce,all_gather,reduce_scatter,broadcast,all_to_all,reduce,scatter,gather}
MAX=${MAX:-64M}
ROUNDS_SMALL=${ROUNDS_SMALL:-30}
ROUNDS_LARGE=${ROUNDS_LARGE:-10}
ITER_BYTES=${ITER_BYTES:-128M}
MIN_ITER_BYTES=${MIN_ITER_BYTES:-64M}
PYTHON=${PYTHON:-python3}
if [ -z "${PERF:-}" ]; then
    cargo build --release -q -p torchcomms-perf
    PERF=$PWD/target/release/torchcomms-perf
fi
TMP=${KEEP:-$(mktemp -d)}
mkdir -p "$TMP"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$TMP"' EXIT
export CTRAN_BACKENDS=socket
# The engine logs each auto choice once per call shape: the report names auto's pick.
export RUST_LOG=warn,ctran::algos::select=debug NO_COLOR=1
START=$(date +%s)
# CPU time the hypervisor gave to other guests (steal) during the run, as a share of all CPU
# time: on a shared VM it tells a calm run from a disturbed one (with a few percent stolen, the
# rounds of one size can vary tenfold).
cpu_ticks() { awk '/^cpu /{t=0; for (i=2; i<=9; i++) t+=$i; print $9, t}' /proc/stat; }
TICKS0=$(cpu_ticks)

CORES=$(nproc)
BIND=${BIND:-1}
for n in $NS; do
    # Ranks that each have a core are bound to it: unbound, two ranks' threads can end up sharing
    # one core for a whole run, at several times their small-message latency. More ranks than
    # cores stay unbound: the cost model is fitted to the scheduler placing them.
    bind=()
    if [ "$BIND" = 1 ] && [ "$n" -le "$CORES" ]; then bind=(--bind); fi
    # Small sizes: many iterations, many rounds, results checked in the first round. Large
    # sizes: iterations raised to MIN_ITER_BYTES and capped at ITER_BYTES of data per size (at
    # 64M and 128M: 64 at 1 MiB, 8 at 8 and 16 MiB, four at 32 MiB, two at 64 MiB, after one
    # warm-up), fewer rounds, no check (ctran/tests/algorithms.rs checks every algorithm). One
    # 64 MiB transfer varies by 20-30% on 2 cores, so a round of one iteration hardly tells
    # algorithms 10% apart.
    "$PERF" -n "$n" ${bind[@]+"${bind[@]}"} --op "$OPS" -b 8 -e 512K --algo all -w 5 -i 20 --rounds "$ROUNDS_SMALL" \
        --json "$TMP/small-$n.json" >"$TMP/small-$n.txt" 2>"$TMP/small-$n.err" \
        || { cat "$TMP/small-$n.txt" "$TMP/small-$n.err" >&2; exit 1; }
    "$PERF" -n "$n" ${bind[@]+"${bind[@]}"} --op "$OPS" -b 1M -e "$MAX" --algo all -w 1 -i 8 --max-iter-bytes "$ITER_BYTES" \
        --min-iter-bytes "$MIN_ITER_BYTES" -c 0 \
        --rounds "$ROUNDS_LARGE" --json "$TMP/large-$n.json" >"$TMP/large-$n.txt" 2>"$TMP/large-$n.err" \
        || { cat "$TMP/large-$n.txt" "$TMP/large-$n.err" >&2; exit 1; }
done
SECS=$(($(date +%s) - START))
STEAL=$(echo "$TICKS0 $(cpu_ticks)" | awk '{d = $4 - $2; s = (d > 0) ? 100 * ($3 - $1) / d : 0; printf "%.1f", s}')

{
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/{print $2}') GiB, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end, ${STEAL}% of CPU time stolen by the hypervisor during the run"
    echo "- command: \`tools/bench-algos.sh\` (NS=\"$NS\", ROUNDS_SMALL=$ROUNDS_SMALL, ROUNDS_LARGE=$ROUNDS_LARGE, ITER_BYTES=$ITER_BYTES, MIN_ITER_BYTES=$MIN_ITER_BYTES, BIND=$BIND), ${SECS} s; per rank count N$([ "$BIND" = 1 ] && echo " (\`[--bind]\`: where N is at most the $CORES cores)"):"
    echo
    echo '  ```text'
    echo "  CTRAN_BACKENDS=socket torchcomms-perf -n N$([ "$BIND" = 1 ] && echo ' [--bind]') --op $OPS -b 8 -e 512K --algo all -w 5 -i 20 --rounds $ROUNDS_SMALL"
    echo "  CTRAN_BACKENDS=socket torchcomms-perf -n N$([ "$BIND" = 1 ] && echo ' [--bind]') --op $OPS -b 1M -e $MAX --algo all -w 1 -i 8 --max-iter-bytes $ITER_BYTES --min-iter-bytes $MIN_ITER_BYTES -c 0 --rounds $ROUNDS_LARGE"
    echo '  ```'
    echo
    "$PYTHON" tools/algos_report.py "$TMP" $NS
} >"$OUT"
