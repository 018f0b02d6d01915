#!/usr/bin/env bash
# GPU suite of torchcomms-rs, for a machine with NVIDIA GPUs, PyTorch and no Rust toolchain.
# Runs from prebuilt binaries (build them elsewhere: `scripts/gpu-test.sh --build DIR` copies
# target/release/{torchcomms-perf,torchcomms-gpu-test} into DIR, compiles the C API's CUDA
# program into DIR/c against target/release/libtorchcomms_c.so (build the torchcomms-c crate
# in release first), and copies iproute2's `ip` with its libraries into DIR/iproute for the
# two-host test).
#
#   scripts/gpu-test.sh [--bin DIR] [--out DIR] [--max BYTES] [--iters N] [--rounds N] [--quick] [--skip-perf] [--skip-netns]
#
# 1. torchcomms-gpu-test: environment, NVRTC reduction kernels vs the CPU kernels, and the
#    rank tests (v-ops, stream semantics, split, abort on timeout) on all GPUs.
# 3. Correctness: torchcomms-perf --device cuda --backend nccl, one process per GPU, every op x
#    dtype (f32 f16 bf16 f64 i32 i64 i8 u8 bool) x reduce op, results checked element by element.
# 4. Performance: torch.distributed+NCCL (scripts/bench/nccl_bench.py) and ours (nccl backend)
#    on the same sizes in one run, joined into one table (scripts/bench/compare_gpu.py).
#    The rank tests include CUDA graph capture (global mode) and replay with new inputs.
# 2. Python (nccl, then ctran, then ctran over TCP only): the torchcomms wheel (WHEEL_DIR, default .gpu/wheel; pytest from .gpu/pydeps when
#    the machine has none) installed into a private folder; bindings/python/gpu_tests under
#    torchrun on every GPU: CUDA tensors on the nccl backend, every op x dtype, the caller's
#    current stream, torch.cuda.graph capture and replay, PREMUL_SUM with a device factor.
#    Then two hosts made of network namespaces, one GPU each, ctran over TCP
#    (scripts/gpu-netns-test.sh: the Python suite, correctness, busbw against host tensors).
#    Then, with 2 and 3 ranks sharing the GPUs: CUDA windows over host transports
#    (test_window_cuda_staged.py) and the C API on CUDA (bindings/c/tests/c/cuda.c, which
#    --build compiles against target/release/libtorchcomms_c.so).
# --skip-perf leaves out step 4 (the tables); --skip-netns the two-host part of step 2.
#
# Exit status: 0 every step that ran passed (the last line names any part skipped, e.g. the
# two-host test without root); 1 a failure; 2 a usage error or missing binaries; 77 skipped: no
# NVIDIA GPU here, nothing was tested (the automake convention for SKIP: a skip is never read
# as a pass). torchcomms-gpu-test and scripts/gpu-netns-test.sh use the same 77; here a
# torchcomms-gpu-test that finds no usable CUDA while nvidia-smi lists GPUs is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --build ]; then
    mkdir -p "$2"
    cp target/release/torchcomms-perf target/release/torchcomms-gpu-test "$2"/
    # The C API's CUDA program, against the release library beside it.
    mkdir -p "$2/c"
    cp target/release/libtorchcomms_c.so "$2/c/"
    "${CC:-gcc}" -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror -O1 -g \
        -I bindings/c/include bindings/c/tests/c/cuda.c -o "$2/c/cuda" \
        -L "$2/c" -ltorchcomms_c -ldl -Wl,--disable-new-dtags -Wl,-rpath,'$ORIGIN'
    # iproute2's `ip` and its libraries, for GPU machines without it (the two-host test).
    if ip=$(command -v ip); then
        mkdir -p "$2/iproute/lib"
        cp "$ip" "$2/iproute/ip.real"
        ldd "$ip" | awk '$3 ~ /^\// && $1 !~ /^(libc|libz)\./ {print $3}' |
            xargs -r -I{} cp -L {} "$2/iproute/lib/"
        cat >"$2/iproute/ip" <<'WRAP'
#!/bin/sh
# `ip` with its own libraries; `netns exec` goes through nsenter, so the command it runs does
# not inherit this LD_LIBRARY_PATH.
d=$(dirname "$(readlink -f "$0")")
if [ "$1" = netns ] && [ "$2" = exec ]; then ns=$3; shift 3; exec nsenter --net=/run/netns/"$ns" "$@"; fi
LD_LIBRARY_PATH="$d/lib" exec "$d/ip.real" "$@"
WRAP
        chmod +x "$2/iproute/ip"
    fi
    exit 0
fi
BIN=${BIN:-.gpu/bin}
# The two-host test needs `ip`: a machine without iproute2 uses the one --build carried.
if ! command -v ip >/dev/null && [ -x "$BIN/iproute/ip" ]; then
    export IP_DIR=${IP_DIR:-$(cd "$BIN/iproute" && pwd)}
fi
OUT=${OUT:-gpu-out}
MAX=$((1 << 30))
ITERS=100
ROUNDS=2
QUICK=0
SKIP_PERF=0
SKIP_NETNS=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) BIN=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --max) MAX=$2; shift 2 ;;
        --iters) ITERS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --skip-perf) SKIP_PERF=1; shift ;;
        --skip-netns) SKIP_NETNS=1; shift ;;
        *) echo "gpu-test: unknown argument $1" >&2; exit 2 ;;
    esac
done
# NVLink multicast (NVLS) stays off on shared machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCHCOMM_ABORT_ON_ERROR=0
PYTHON=${PYTHON:-python3}
# The Rust binaries find the NVIDIA wheels' libraries (NCCL, NVRTC) in this Python's site-packages.
TORCHCOMMS_SITE_PACKAGES=$("$PYTHON" -c 'import os, site; print(os.pathsep.join(site.getsitepackages() + [site.getusersitepackages()]))')
export TORCHCOMMS_SITE_PACKAGES
# Every step is bounded, so one hang cannot eat the machine's time.
STEP=(timeout -k 10 "${STEP_TIMEOUT:-900}")
mkdir -p "$OUT"
PERF=$BIN/torchcomms-perf
GPUTEST=$BIN/torchcomms-gpu-test
for b in "$PERF" "$GPUTEST"; do
    [ -x "$b" ] || { echo "gpu-test: $b missing (build with cargo build --release, then --build DIR)" >&2; exit 2; }
done
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${NGPU:-0}" = 0 ]; then
    echo "gpu-test: SKIPPED (exit status 77): no NVIDIA GPU (nvidia-smi lists none), nothing tested"
    exit 77
fi
{
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "- GPUs: $NGPU x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
    echo "- $($PYTHON -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))')"
    echo "- topology: $(nvidia-smi topo -m 2>/dev/null | sed -n 2p | tr -s ' \t' ' ')"
} | tee "$OUT/env.md"

status=0
# Parts that were skipped (a step that exited 77; the rank tests on one GPU): named on the
# last line, never counted as passed.
skipped=()
echo "== 1. torchcomms-gpu-test"
rc=0
"${STEP[@]}" "$GPUTEST" 2>&1 | tee "$OUT/gpu-test.log" || rc=$?
if [ "$rc" = 77 ]; then
    echo "gpu-test: torchcomms-gpu-test found no usable CUDA although nvidia-smi lists $NGPU GPU(s): a failure"
    status=1
elif [ "$rc" != 0 ]; then
    status=1
fi
# With one GPU it tests the kernels and prints "SKIP ranks" (exit status 0).
grep -q '^SKIP ranks' "$OUT/gpu-test.log" && skipped+=("rank tests of torchcomms-gpu-test (need 2 GPUs)")

echo "== 2. Python: torchcomms on CUDA tensors (nccl backend)"
WHEEL_DIR=${WHEEL_DIR:-.gpu/wheel}
PYDEPS=${PYDEPS:-.gpu/pydeps}
PYTARGET="$OUT/pysite"
rm -rf "$PYTARGET"
extra=()
"$PYTHON" -c "import pytest" 2>/dev/null || extra=("$PYDEPS"/*.whl)
if "$PYTHON" -m pip install --quiet --no-deps --no-index --target "$PYTARGET" "$WHEEL_DIR"/torchcomms-*.whl "${extra[@]}"; then
    # nccl; ctran with its default transports; ctran over TCP only; ctran with every all_reduce
    # pipelined in 1 MiB chunks (graph capture of the copy-engine path included).
    for cfg in "nccl" "ctran" "ctran CTRAN_BACKENDS=socket" \
        "ctran CTRAN_NVL_ALGO=pipelined CTRAN_NVL_PIPE_CHUNK_BYTES=1M"; do
        read -r backend envs <<<"$cfg"
        echo "-- backend $backend ${envs:-}"
        first=${envs%% *}
        log="$OUT/python-cuda-$backend${envs:+-$(echo "${first#*=}" | tr , -)}.log"
        # Forcing the pipeline onto 1 MB all_reduces gives each an address exchange on the host
        # (about 150 us), which the 10 ms budget of 100 async issues does not allow for.
        select=()
        [ "$first" = CTRAN_NVL_ALGO=pipelined ] && select=(-k "not test_async_issue_does_not_block_the_host")
        # shellcheck disable=SC2086 # envs holds NAME=VALUE words
        env $envs TORCHCOMMS_TEST_BACKEND="$backend" \
            PYTHONPATH="$PYTARGET${PYTHONPATH:+:$PYTHONPATH}" "${STEP[@]}" "$PYTHON" -m torch.distributed.run \
            --standalone --nproc_per_node "$NGPU" -m pytest bindings/python/gpu_tests -q -rs -s \
            -p no:cacheprovider "${select[@]}" >"$log" 2>&1 || { status=1; grep -E "^E |Error" "$log" | head -20; }
        grep -E "passed|failed|issued in" "$log" || true
    done
    if [ "$SKIP_NETNS" = 0 ]; then
        echo "-- two hosts (network namespaces), one GPU each, ctran over TCP"
        rc=0
        PYTHONPATH="$PYTARGET${PYTHONPATH:+:$PYTHONPATH}" BIN=$BIN timeout -k 10 "${NETNS_TIMEOUT:-900}" \
            scripts/gpu-netns-test.sh "$OUT" 2>&1 | tee "$OUT/netns.log" || rc=$?
        # 77: gpu-netns-test.sh skipped (no root or no iproute2).
        case $rc in 0) ;; 77) skipped+=("two hosts") ;; *) status=1 ;; esac
        if [ "$NGPU" -ge 4 ]; then
            echo "-- two hosts, two GPUs each: NVLink inside a host, TCP between them"
            rc=0
            PER_HOST=2 PYTHONPATH="$PYTARGET${PYTHONPATH:+:$PYTHONPATH}" BIN=$BIN \
                timeout -k 10 "${NETNS_TIMEOUT:-900}" scripts/gpu-netns-test.sh "$OUT/mixed" 2>&1 |
                tee "$OUT/netns-mixed.log" || rc=$?
            case $rc in 0) ;; 77) skipped+=("two hosts of two GPUs") ;; *) status=1 ;; esac
        fi
    fi
    for n in 2 3; do
        echo "-- CUDA windows over host transports, $n ranks on $NGPU GPU(s)"
        log="$OUT/python-cuda-staged-windows-$n.log"
        PYTHONPATH="$PYTARGET${PYTHONPATH:+:$PYTHONPATH}" "${STEP[@]}" "$PYTHON" -m torch.distributed.run \
            --standalone --nproc_per_node "$n" -m pytest bindings/python/gpu_tests/test_window_cuda_staged.py \
            -q -rs -p no:cacheprovider >"$log" 2>&1 || { status=1; grep -E "^E |Error" "$log" | head -20; }
        grep -E "passed|failed" "$log" || true
    done
    rm -rf "$PYTARGET"
else
    echo "gpu-test: cannot install the wheel from $WHEEL_DIR" >&2
    status=1
fi

if [ -x "$BIN/c/cuda" ]; then
    for n in 2 3; do
        echo "-- C API on CUDA, $n ranks on $NGPU GPU(s)"
        port=$((29600 + n))
        for r in $(seq 0 $((n - 1))); do
            TORCHCOMM_RANK=$r TORCHCOMM_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
                "${STEP[@]}" "$BIN/c/cuda" >"$OUT/c-cuda-$n-$r.log" 2>&1 &
        done
        wait || true
        ok=$(cat "$OUT"/c-cuda-$n-*.log | grep -c "cuda OK" || true)
        echo "$ok of $n ranks OK"
        [ "$ok" = "$n" ] || { status=1; cat "$OUT"/c-cuda-$n-*.log | head -20; }
    done
else
    echo "gpu-test: $BIN/c/cuda missing (scripts/gpu-test.sh --build DIR compiles it)" >&2
    status=1
fi

echo "== 3. correctness: every op x dtype x reduce op on $NGPU GPUs (nccl, ctran over NVLink and over host transports)"
if [ "$QUICK" = 1 ]; then SIZES=(-b 1 -e 64K -f 256); else SIZES=(-b 1 -e 1M -f 32); fi
# ctran six ways: NVLink with the size-based choice, its low-latency all_reduce, staged where an
# op can be (direct elsewhere), direct only, pipelined, and the host transports through the GPE
# (no nvl).
# Direct mode exports user allocations over CUDA IPC, which takes allocations of 2 MiB and
# more (smaller ones go through the GPE), so its sweep starts at 4 MiB.
# The host-transport run cuts operations into 64 KiB steps, so the pipelined steps of every op
# (all_gather, reduce_scatter, all_to_all in lockstep slices) are checked at these sizes.
for cfg in "nccl" "ctran" "ctran CTRAN_NVL_ALGO=low_latency" "ctran CTRAN_NVL_ALGO=staged" "ctran CTRAN_NVL_ALGO=direct" \
    "ctran CTRAN_NVL_ALGO=pipelined CTRAN_NVL_PIPE_CHUNK_BYTES=1M" \
    "ctran CTRAN_BACKENDS=socket,shm CTRAN_GPE_CHUNK_BYTES=64K"; do
    read -r backend envs <<<"$cfg"
    first=${envs%% *}
    tag="$backend${envs:+-$(echo "${first#*=}" | tr , -)}"
    sizes=("${SIZES[@]}")
    [ "$first" = CTRAN_NVL_ALGO=direct ] && sizes=(-b 4M -e 16M -f 4)
    # The low-latency path takes all_reduce up to 256 KiB: sizes that end inside its 8-byte
    # words (and 0 elements of the wider types) up to there.
    [ "$first" = CTRAN_NVL_ALGO=low_latency ] && sizes=(-b 6 -e 256K -f 7)
    # The pipeline runs all_reduce only (other ops as auto); 1 MiB chunks over 4-16 MiB.
    [ "$first" = CTRAN_NVL_ALGO=pipelined ] && sizes=(-b 4M -e 16M -f 4)
    # shellcheck disable=SC2086 # envs holds NAME=VALUE words
    env $envs "${STEP[@]}" "$PERF" -n "$NGPU" --device cuda --backend $backend --op all -d all -o all "${sizes[@]}" \
        -w 1 -i 1 -c 1 --json "$OUT/correctness-$tag.json" >"$OUT/correctness-$tag.log" 2>&1 || status=1
    echo "-- $tag"
    grep -E "Out of bounds|error" "$OUT/correctness-$tag.log" | sort | uniq -c || true
    tail -n 3 "$OUT/correctness-$tag.log"
done

# NVLink send/recv whose last ring chunk is short, back to back over every dtype: a block used
# to write its part of a slot cut from the chunk's length, over bytes of a shorter chunk that
# another block's receiver had not read yet.
echo "-- ctran send_recv, short last chunks back to back"
"${STEP[@]}" "$PERF" -n "$NGPU" --device cuda --backend ctran --op send_recv -d all -b 28697814 -e 64M -f 2 \
    -w 1 -i 3 -c 1 --json "$OUT/correctness-ctran-p2p-tails.json" >"$OUT/correctness-ctran-p2p-tails.log" 2>&1 || status=1
tail -n 3 "$OUT/correctness-ctran-p2p-tails.log"

# The verdict, naming what did not run.
verdict() {
    local v=FAILED part
    [ "$status" = 0 ] && v=PASSED
    for part in ${skipped[@]+"${skipped[@]}"}; do v="$v; SKIPPED: $part"; done
    echo "gpu-test: $v (logs in $OUT$1)"
}
if [ "$SKIP_PERF" = 1 ]; then
    verdict "; perf skipped (--skip-perf)"
    exit $status
fi
echo "== 4. performance: torch.distributed+NCCL vs ours (nccl), f32, 8 B .. $MAX B"
OPS=all_reduce,all_gather,reduce_scatter,broadcast,all_to_all
# Rounds alternate torch and ours, so drifting clocks or a noisy neighbour hit both alike; the
# table takes each side's best round per row.
for r in $(seq 1 "$ROUNDS"); do
    "${STEP[@]}" "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NGPU" \
        scripts/bench/nccl_bench.py -b 8 -e "$MAX" -w 10 -i "$ITERS" --op "$OPS" \
        --json "$OUT/torch-$r.json" >"$OUT/torch-$r.log" 2>&1 || { cat "$OUT/torch-$r.log"; status=1; }
    "${STEP[@]}" "$PERF" -n "$NGPU" --device cuda --backend nccl --op "$OPS" -b 8 -e "$MAX" -w 10 -i "$ITERS" -c 0 \
        --json "$OUT/ours-$r.json" >"$OUT/ours-$r.log" 2>&1 || { cat "$OUT/ours-$r.log"; status=1; }
    "${STEP[@]}" "$PERF" -n "$NGPU" --device cuda --backend ctran --op "$OPS" -b 8 -e "$MAX" -w 10 -i "$ITERS" -c 0 \
        --json "$OUT/ctran-$r.json" >"$OUT/ctran-$r.log" 2>&1 || { cat "$OUT/ctran-$r.log"; status=1; }
done
if ls "$OUT"/torch-*.json "$OUT"/ours-*.json >/dev/null 2>&1; then
    "$PYTHON" scripts/bench/compare_gpu.py --torch "$OUT"/torch-*.json --ours "$OUT"/ours-*.json \
        --ctran "$OUT"/ctran-*.json | tee "$OUT/compare.md"
fi
verdict ""
exit $status
