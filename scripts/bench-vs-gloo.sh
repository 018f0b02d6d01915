#!/usr/bin/env bash
# Gloo (torch.distributed) against our engine (torchcomms-perf), in one run on one machine:
# all_reduce, all_gather, reduce_scatter, broadcast and all_to_all at 2 and 4 ranks, 8 B to 64 MB,
# on one host and (as root) across two network-namespace hosts. Prints a ratio per row;
# `--out FILE` also writes the markdown tables there.
#
#   scripts/bench-vs-gloo.sh [--out docs/perf/cpu-run.md] [--max BYTES] [--no-netns]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=/dev/null
MAX=$((64 << 20))
NETNS=1
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        --max) MAX=$2; shift 2 ;;
        --no-netns) NETNS=0; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
PYTHON=${PYTHON:-python3}
OPS=all_reduce,all_gather,reduce_scatter,broadcast,all_to_all
cargo build --release -q -p torchcomms-perf
PERF=$PWD/target/release/torchcomms-perf
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"; [ "$NETNS" = 1 ] && scripts/netns-hosts.sh down >/dev/null 2>&1 || true' EXIT
PORT=29650

{
    echo "# Gloo vs torchcomms-rs (ctran), CPU"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/{print $2}') GiB"
    echo "- torch $($PYTHON -c 'import torch; print(torch.__version__)'), command: scripts/bench-vs-gloo.sh $*"
} | tee "$OUT"

for n in 2 4; do
    PORT=$((PORT + 1))
    "$PYTHON" -m torch.distributed.run --nproc_per_node "$n" --master_port "$PORT" \
        scripts/bench/gloo_bench.py -b 8 -e "$MAX" --op "$OPS" --json "$TMP/gloo-$n.json" >"$TMP/gloo-$n.log" 2>&1 \
        || { cat "$TMP/gloo-$n.log"; exit 1; }
    "$PERF" -n "$n" -b 8 -e "$MAX" --op "$OPS" -w 3 -i 10 --json "$TMP/ours-$n.json" >"$TMP/ours-$n.log" 2>&1 \
        || { cat "$TMP/ours-$n.log"; exit 1; }
    "$PYTHON" scripts/bench/compare.py "one host, $n ranks" "$TMP/gloo-$n.json" "$TMP/ours-$n.json" | tee -a "$OUT"
done

if [ "$NETNS" = 1 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "bench-vs-gloo: skipping the namespace hosts (needs root)" | tee -a "$OUT"
        exit 0
    fi
    scripts/netns-hosts.sh up 2 >/dev/null
    for per_host in 1 2; do
        n=$((2 * per_host))
        for who in gloo ours; do
            PORT=$((PORT + 1))
            pids=()
            for h in 0 1; do
                if [ "$who" = gloo ]; then
                    cmd=("$PYTHON" -m torch.distributed.run --nnodes 2 --node_rank "$h" --nproc_per_node "$per_host"
                        --master_addr 10.77.0.1 --master_port "$PORT"
                        scripts/bench/gloo_bench.py -b 8 -e "$MAX" --op "$OPS" --json "$TMP/ns-gloo-$n.json")
                else
                    cmd=("$PYTHON" -m torch.distributed.run --nnodes 2 --node_rank "$h" --nproc_per_node "$per_host"
                        --master_addr 10.77.0.1 --master_port "$PORT" --no-python
                        "$PERF" -b 8 -e "$MAX" --op "$OPS" -w 3 -i 10 --json "$TMP/ns-ours-$n.json")
                fi
                scripts/netns-hosts.sh exec "$h" env GLOO_SOCKET_IFNAME=eth0 TORCHCOMM_ABORT_ON_ERROR=0 "${cmd[@]}" \
                    >"$TMP/ns-$who-$n-h$h.log" 2>&1 &
                pids+=($!)
            done
            for p in "${pids[@]}"; do wait "$p" || { cat "$TMP"/ns-$who-$n-h*.log; exit 1; }; done
        done
        "$PYTHON" scripts/bench/compare.py "2 namespace hosts x $per_host ranks (TCP between hosts)" \
            "$TMP/ns-gloo-$n.json" "$TMP/ns-ours-$n.json" | tee -a "$OUT"
    done
fi
