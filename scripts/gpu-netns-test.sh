#!/usr/bin/env bash
# CUDA tensors between two "hosts": two network namespaces joined by veths, PER_HOST GPUs and
# ranks in each (the engine treats each namespace as its own host). With one GPU per host, ctran
# carries device buffers over TCP through its GPU progress engine; with two, it mixes NVLink
# inside each host with TCP between them (ctran/src/mixed/).
#
#   PER_HOST=1|2 scripts/gpu-netns-test.sh OUT_DIR
# 1. The Python CUDA suite (bindings/python/gpu_tests, ctran backend) under torchrun --nnodes 2.
# 2. torchcomms-perf correctness on CUDA across the two hosts: every op x dtype x reduce op.
# 3. PER_HOST=1: busbw at 64 MB, device tensors against host tensors, same run, both over TCP:
#    across the two hosts, and between two local ranks with CTRAN_BACKENDS=socket (loopback).
#    PER_HOST=2: busbw of all_reduce, all_gather and broadcast, mixed NVLink+TCP against TCP
#    alone (CTRAN_BACKENDS=socket,shm).
# Env: BIN (torchcomms-perf), PYTHON, PYTHONPATH (where torchcomms and pytest import from),
# IP_DIR (a folder holding `ip`, for machines without iproute2). Needs root and 2 x PER_HOST GPUs.
# Exit status: 0 passed, 1 a failure, 77 skipped (not root, or no iproute2): nothing tested.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?output directory}
BIN=${BIN:-.gpu/bin}
PYTHON=${PYTHON:-python3}
PERF=$BIN/torchcomms-perf
P=${PER_HOST:-1}
[ -n "${IP_DIR:-}" ] && export PATH="$IP_DIR:$PATH"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCHCOMM_ABORT_ON_ERROR=0 TORCHCOMM_TIMEOUT_SECONDS=120
if [ "$(id -u)" != 0 ] || ! ip netns list >/dev/null 2>&1; then
    echo "SKIP: two-host GPU test needs root and iproute2 (exit status 77)"
    exit 77
fi
mkdir -p "$OUT"
trap 'scripts/netns-hosts.sh down' EXIT
scripts/netns-hosts.sh up 2
PORT=29620
status=0
# One torchrun agent per host, host h on GPUs hP .. hP+P-1; node 0's agent serves the store.
two_hosts() {
    local tag=$1
    shift
    local pids=()
    for h in 0 1; do
        local gpus
        gpus=$(seq -s, $((h * P)) $((h * P + P - 1)))
        scripts/netns-hosts.sh exec "$h" env CUDA_VISIBLE_DEVICES="$gpus" \
            timeout -k 10 "${STEP_TIMEOUT:-900}" "$PYTHON" -m torch.distributed.run --nnodes 2 \
            --node_rank "$h" --nproc_per_node "$P" --master_addr 10.77.0.1 --master_port "$PORT" \
            "$@" >"$OUT/netns-$tag-h$h.log" 2>&1 &
        pids+=($!)
    done
    PORT=$((PORT + 1))
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}

echo "-- python suite, ctran, 2 hosts x $P GPU(s)"
TORCHCOMMS_TEST_BACKEND=ctran two_hosts python -m pytest bindings/python/gpu_tests -q -rs \
    -p no:cacheprovider || status=1
grep -hE "passed|failed" "$OUT"/netns-python-h*.log || true

echo "-- correctness, ctran, 2 hosts x $P GPU(s)"
RUST_LOG=warn,ctran::mixed=info two_hosts correctness --no-python "$PERF" --device cuda --backend ctran --op all -d all -o all \
    -b 1 -e 1M -f 32 -w 1 -i 1 -c 1 || status=1
grep -hE "error|wrong" "$OUT"/netns-correctness-h*.log | grep -v "#wrong" | head || true
grep -hcE "^ +[0-9]+ " "$OUT/netns-correctness-h0.log" | sed 's/^/rows checked: /'

if [ "$P" -ge 2 ]; then
    # The engine says which path it took; both must agree with the layout.
    grep -hq "mixed NVLink+TCP: on" "$OUT"/netns-correctness-h*.log ||
        { echo "mixed NVLink+TCP was not used"; status=1; }
    echo "-- busbw, mixed NVLink+TCP vs TCP alone, 2 hosts x $P GPUs"
    AR=(--op all_reduce,all_gather,broadcast -b 1M -e 256M -f 4 -w 3 -i 10 -c 0)
    two_hosts bw-mixed --no-python "$PERF" --device cuda --backend ctran "${AR[@]}" \
        --json "$OUT/netns-bw-mixed.json" || status=1
    CTRAN_BACKENDS=socket,shm two_hosts bw-tcp --no-python "$PERF" --device cuda --backend ctran \
        "${AR[@]}" --json "$OUT/netns-bw-tcp.json" || status=1
    "$PYTHON" - "$OUT" <<'PY' || status=1
import json, sys
out = sys.argv[1]
rows = {k: {(r["op"], r["bytes"]): r["busbw_gbps"]
            for r in json.load(open(f"{out}/netns-bw-{k}.json"))}
        for k in ("mixed", "tcp")}
print("| op | size | mixed busbw (GB/s) | TCP only busbw (GB/s) | mixed/TCP |")
print("|---|---:|---:|---:|---:|")
for (op, b), m in sorted(rows["mixed"].items()):
    t = rows["tcp"].get((op, b), 0.0)
    print(f"| {op} | {b >> 20} MB | {m:.3f} | {t:.3f} | {m / t if t else 0:.2f} |")
PY
    echo "gpu-netns-test: $( [ $status = 0 ] && echo PASSED || echo FAILED )"
    exit $status
fi

echo "-- busbw at 64 MB over TCP, device vs host tensors"
SIZES=(--op all_reduce,all_gather,reduce_scatter -b 64M -e 64M -w 3 -i 10 -c 0)
for dev in cuda cpu; do
    two_hosts "bw-$dev" --no-python "$PERF" --device "$dev" --backend ctran "${SIZES[@]}" \
        --json "$OUT/netns-bw-$dev.json" || status=1
    CTRAN_BACKENDS=socket timeout -k 10 300 "$PERF" -n 2 --device "$dev" --backend ctran \
        "${SIZES[@]}" --json "$OUT/loopback-bw-$dev.json" >"$OUT/loopback-bw-$dev.log" 2>&1 || status=1
done
"$PYTHON" - "$OUT" <<'PY' || status=1
import json, sys
out = sys.argv[1]
print("| path | op | cuda busbw (GB/s) | cpu busbw (GB/s) | cuda/cpu |")
print("|---|---|---:|---:|---:|")
for path in ("netns", "loopback"):
    try:
        rows = {d: {r["op"]: r["busbw_gbps"] for r in json.load(open(f"{out}/{path}-bw-{d}.json"))}
                for d in ("cuda", "cpu")}
    except (OSError, ValueError) as e:
        print(f"| {path} | missing: {e} | | | |")
        continue
    for op, cpu in rows["cpu"].items():
        gpu = rows["cuda"].get(op, 0.0)
        print(f"| {path} | {op} | {gpu:.3f} | {cpu:.3f} | {gpu / cpu:.2f} |")
PY
echo "gpu-netns-test: $( [ $status = 0 ] && echo PASSED || echo FAILED )"
exit $status
