#!/usr/bin/env bash
# Gloo (torch.distributed) against our engine (torchcomms-perf), in one run on one machine:
# all_reduce, all_gather, reduce_scatter, broadcast and all_to_all at 2 and 4 ranks, 8 B to 64 MB,
# on one host and (as root) across two network-namespace hosts. Prints a ratio per row;
# `--out FILE` also writes the markdown tables there. Each configuration runs Gloo and ours
# alternately `--rounds` times (default 2) and keeps each row's best time, so a burst of load
# from elsewhere hits both sides alike; the load average is printed before each run.
#
#   scripts/bench-vs-gloo.sh [--out docs/perf/cpu-run.md] [--max BYTES] [--rounds R] [--no-netns]
# Env: PERF (a prebuilt torchcomms-perf; default: cargo build --release), PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
ARGS="$*"
OUT=/dev/null
MAX=$((64 << 20))
NETNS=1
ROUNDS=2
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        --max) MAX=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --no-netns) NETNS=0; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
PYTHON=${PYTHON:-python3}
OPS=all_reduce,all_gather,reduce_scatter,broadcast,all_to_all
if [ -z "${PERF:-}" ]; then
    cargo build --release -q -p torchcomms-perf
    PERF=$PWD/target/release/torchcomms-perf
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"; [ "$NETNS" = 1 ] && scripts/netns-hosts.sh down >/dev/null 2>&1 || true' EXIT
PORT=29650
load() { cut -d' ' -f1-3 /proc/loadavg; }
# Comma-separated list of the files of every round.
files() { local f=() r; for ((r = 0; r < ROUNDS; r++)); do f+=("$1-r$r.json"); done; (IFS=,; echo "${f[*]}"); }
# Peak VmHWM that torchcomms-perf printed, over every round.
peak() { grep -h "Peak memory" "$@" | sed 's/^# *//' | sort -t: -k2 -g | tail -1; }

{
    echo "# Gloo vs torchcomms-rs (ctran), CPU"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/{print $2}') GiB"
    echo "- torch $($PYTHON -c 'import torch; print(torch.__version__)'), command: scripts/bench-vs-gloo.sh $ARGS"
} | tee "$OUT"

for n in 2 4; do
    for ((r = 0; r < ROUNDS; r++)); do
        PORT=$((PORT + 1))
        echo "one host, $n ranks, round $r: gloo (load $(load))" >&2
        "$PYTHON" -m torch.distributed.run --nproc_per_node "$n" --master_port "$PORT" \
            scripts/bench/gloo_bench.py -b 8 -e "$MAX" --op "$OPS" --json "$TMP/gloo-$n-r$r.json" >"$TMP/gloo-$n.log" 2>&1 \
            || { cat "$TMP/gloo-$n.log"; exit 1; }
        echo "one host, $n ranks, round $r: ours (load $(load))" >&2
        "$PERF" -n "$n" -b 8 -e "$MAX" --op "$OPS" -w 3 -i 10 --json "$TMP/ours-$n-r$r.json" >"$TMP/ours-$n-r$r.log" 2>&1 \
            || { cat "$TMP/ours-$n-r$r.log"; exit 1; }
    done
    "$PYTHON" scripts/bench/compare.py "one host, $n ranks" "$(files "$TMP/gloo-$n")" "$(files "$TMP/ours-$n")" | tee -a "$OUT"
    echo "Ours, peak memory of a rank: $(peak "$TMP"/ours-$n-r*.log); load after: $(load)" | tee -a "$OUT"
done

if [ "$NETNS" = 1 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "bench-vs-gloo: skipping the namespace hosts (needs root)" | tee -a "$OUT"
        exit 0
    fi
    scripts/netns-hosts.sh up 2 >/dev/null
    for per_host in 1 2; do
        n=$((2 * per_host))
        for ((r = 0; r < ROUNDS; r++)); do
            for who in gloo ours; do
                PORT=$((PORT + 1))
                echo "2 namespace hosts x $per_host ranks, round $r: $who (load $(load))" >&2
                pids=()
                for h in 0 1; do
                    if [ "$who" = gloo ]; then
                        cmd=("$PYTHON" -m torch.distributed.run --nnodes 2 --node_rank "$h" --nproc_per_node "$per_host"
                            --master_addr 10.77.0.1 --master_port "$PORT"
                            scripts/bench/gloo_bench.py -b 8 -e "$MAX" --op "$OPS" --json "$TMP/ns-gloo-$n-r$r.json")
                    else
                        cmd=("$PYTHON" -m torch.distributed.run --nnodes 2 --node_rank "$h" --nproc_per_node "$per_host"
                            --master_addr 10.77.0.1 --master_port "$PORT" --no-python
                            "$PERF" -b 8 -e "$MAX" --op "$OPS" -w 3 -i 10 --json "$TMP/ns-ours-$n-r$r.json")
                    fi
                    scripts/netns-hosts.sh exec "$h" env GLOO_SOCKET_IFNAME=eth0 TORCHCOMM_ABORT_ON_ERROR=0 "${cmd[@]}" \
                        >"$TMP/ns-$who-$n-r$r-h$h.log" 2>&1 &
                    pids+=($!)
                done
                for p in "${pids[@]}"; do wait "$p" || { cat "$TMP"/ns-$who-$n-r$r-h*.log; exit 1; }; done
            done
        done
        "$PYTHON" scripts/bench/compare.py "2 namespace hosts x $per_host ranks (TCP between hosts)" \
            "$(files "$TMP/ns-gloo-$n")" "$(files "$TMP/ns-ours-$n")" | tee -a "$OUT"
        echo "Ours, peak memory of a rank: $(peak "$TMP"/ns-ours-$n-r*-h*.log); load after: $(load)" | tee -a "$OUT"
    done
fi
