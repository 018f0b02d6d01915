#!/usr/bin/env bash
# Runs the multi-process suite and torchcomms-perf across "hosts" made of network namespaces:
# HOSTS namespaces x PER_HOST ranks, launched by torchrun (--nnodes, --node_rank, rendezvous on a
# veth address), so TCP between hosts and shared memory inside a host run in one job; then the
# suite again over TCP alone (CTRAN_BACKENDS=socket).
#
#   scripts/multihost-test.sh [HOSTS] [PER_HOST]      (defaults 2 2)
# Env: WORKER (tc-worker binary), PERF (torchcomms-perf binary; skipped if unset/missing).
set -euo pipefail
cd "$(dirname "$0")/.."
HOSTS=${1:-2}
PER_HOST=${2:-2}
WORKER=${WORKER:-target/debug/tc-worker}
PERF=${PERF:-}
PYTHON=${PYTHON:-python3}
MASTER=10.77.0.1
PORT=${PORT:-29555}

if [ "$(id -u)" != 0 ] || ! ip netns list >/dev/null 2>&1; then
    echo "multihost-test: needs root and iproute2 (network namespaces); CI runs it as root" >&2
    exit 1
fi
[ -x "$WORKER" ] || { echo "multihost-test: $WORKER not built (cargo build -p torchcomms-tests)" >&2; exit 1; }
trap 'scripts/netns-hosts.sh down' EXIT
scripts/netns-hosts.sh up "$HOSTS"

# One torchrun agent per host; node 0's agent serves the store on MASTER:PORT.
run_job() {
    local tag=$1
    shift
    local pids=() logs=()
    for ((h = 0; h < HOSTS; h++)); do
        local log
        log=$(mktemp "/tmp/multihost-$tag-h$h.XXXX")
        logs+=("$log")
        scripts/netns-hosts.sh exec "$h" env TORCHCOMM_ABORT_ON_ERROR=0 TORCHCOMM_TIMEOUT_SECONDS=60 \
            "$PYTHON" -m torch.distributed.run --nnodes "$HOSTS" --node_rank "$h" \
            --nproc_per_node "$PER_HOST" --master_addr "$MASTER" --master_port "$PORT" \
            --no-python "$@" >"$log" 2>&1 &
        pids+=($!)
    done
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    for ((h = 0; h < HOSTS; h++)); do
        echo "---- $tag host $h"
        cat "${logs[$h]}"
    done
    PORT=$((PORT + 1))
    return $rc
}

ranks=$((HOSTS * PER_HOST))
run_job suite "$WORKER" suite --large 1048576
n_ok=$(cat /tmp/multihost-suite-h*.* | grep -c "SUITE OK" || true)
rm -f /tmp/multihost-suite-h*.*
[ "$n_ok" = "$ranks" ] || { echo "multihost-test: $n_ok of $ranks ranks reported SUITE OK" >&2; exit 1; }
# TCP alone: the same suite with shared memory off, so ranks of one host use sockets too.
run_job suite-tcp env CTRAN_BACKENDS=socket "$WORKER" suite --large 1048576
n_ok=$(cat /tmp/multihost-suite-tcp-h*.* | grep -c "SUITE OK" || true)
rm -f /tmp/multihost-suite-tcp-h*.*
[ "$n_ok" = "$ranks" ] || { echo "multihost-test: TCP only: $n_ok of $ranks ranks reported SUITE OK" >&2; exit 1; }
# One-sided windows (and the persistent all-gather on them) between hosts and within one.
run_job window "$WORKER" window --iters 300
rm -f /tmp/multihost-window-h*.*
# The RDMA transfer API between hosts (TCP payloads) and within one (cross-memory attach).
run_job rdma "$WORKER" rdma
n_ok=$(cat /tmp/multihost-rdma-h*.* | grep -c "RDMA OK" || true)
rm -f /tmp/multihost-rdma-h*.*
[ "$n_ok" = $((2 * ranks)) ] || { echo "multihost-test: rdma: $n_ok of $((2 * ranks)) pairings OK" >&2; exit 1; }
run_job b2b "$WORKER" back-to-back --count 3
rm -f /tmp/multihost-b2b-h*.*
if [ -n "$PERF" ] && [ -x "$PERF" ]; then
    run_job perf "$PERF" -b 8 -e 4M -f 4 -w 2 -i 5
    rm -f /tmp/multihost-perf-h*.*
fi
echo "multihost-test: OK ($HOSTS hosts x $PER_HOST ranks)"
