#!/usr/bin/env bash
# The engine's HIP code paths on NVIDIA GPUs, through the model of HIP over CUDA
# (hip-on-cuda/, docs/amd.md "HIP over CUDA"): TORCHCOMMS_GPU_PLATFORM=hip with
# libtorchcomms_hip_on_cuda.so standing in for libamdhip64 and hiprtc.
#
#   scripts/gpu-hip-model.sh --build DIR     # here: copies torchcomms-perf and the model into DIR
#   scripts/gpu-hip-model.sh [--bin DIR] [--wheel DIR] [--out DIR]   # on the GPU machine
#
# 1. torchcomms-perf on every GPU, every op x dtype x reduce op checked, over IPC and through
#    the GPU progress engine (CTRAN_BACKENDS=socket,shm).
# 2. The Python CUDA suites of ctran (collectives, DDP/FSDP2, windows, MoE, transport) under
#    torchrun on every GPU, uncaptured so the model's one line per process shows it was loaded.
#
# Exit status: 0 all passed and every run went through the model; 1 a failure; 2 usage;
# 77 no NVIDIA GPU here (nothing ran: never read as a pass).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --build ]; then
    mkdir -p "$2"
    cp target/release/torchcomms-perf target/release/libtorchcomms_hip_on_cuda.so "$2"/
    exit 0
fi
BIN=.gpu/bin WHEEL=.gpu/wheel OUT=${OUT:-/tmp/hip-model}
while [ $# -gt 0 ]; do
    case $1 in
        --bin) BIN=$2; shift 2 ;;
        --wheel) WHEEL=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "SKIPPED: no NVIDIA GPU"; exit 77; }
[ -x "$BIN/torchcomms-perf" ] && [ -f "$BIN/libtorchcomms_hip_on_cuda.so" ] || { echo "missing binaries in $BIN" >&2; exit 2; }
mkdir -p "$OUT"
NGPU=$(nvidia-smi -L | wc -l)
SO=$(realpath "$BIN/libtorchcomms_hip_on_cuda.so")
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCHCOMMS_GPU_PLATFORM=hip TORCHCOMMS_HIP_ARCH=gfx90a TORCHCOMMS_HIP_LIB=$SO TORCHCOMMS_HIPRTC_LIB=$SO
fail=0
announced() { grep -c 'hip-on-cuda: the HIP runtime' "$1"; }
for path in ipc gpe; do
    f=$OUT/perf_$path.txt
    if [ $path = gpe ]; then export CTRAN_BACKENDS=socket,shm; else unset CTRAN_BACKENDS; fi
    "$BIN/torchcomms-perf" -n "$NGPU" --device cuda -d all -o all -b 8 -e 16M -f 16 -w 1 -i 2 -c 1 > "$f" 2>&1
    rc=$?
    rows=$(grep -vE '^#|^$' "$f" | awk '$NF ~ /^[0-9]+$/' | wc -l)
    wrong=$(grep -vE '^#|^$' "$f" | awk '$NF ~ /^[0-9]+$/ && $NF != 0' | wc -l)
    echo "perf $path: rc=$rc rows=$rows wrong_rows=$wrong processes_through_the_model=$(announced "$f")"
    [ $rc = 0 ] && [ "$rows" -gt 0 ] && [ "$wrong" = 0 ] && [ "$(announced "$f")" -gt 0 ] || fail=1
done
unset CTRAN_BACKENDS
python3 -m pip install --quiet --no-deps --target "$OUT/site" "$WHEEL"/*.whl || exit 1
f=$OUT/python.txt
PYTHONPATH=$OUT/site TORCHCOMMS_TEST_BACKEND=ctran torchrun --standalone --nproc_per_node "$NGPU" \
    -m pytest -s -q -rfs --tb=short -p no:cacheprovider \
    bindings/python/gpu_tests/test_cuda.py bindings/python/gpu_tests/test_dist_cuda.py \
    bindings/python/gpu_tests/test_window_cuda.py bindings/python/gpu_tests/test_moe_cuda.py \
    bindings/python/gpu_tests/test_device_alltoallv_cuda.py bindings/python/gpu_tests/test_transport_cuda.py \
    > "$f" 2>&1
rc=$?
echo "python: rc=$rc processes_through_the_model=$(announced "$f")"; grep -E " passed| failed" "$f"
[ $rc = 0 ] && [ "$(announced "$f")" -gt 0 ] || fail=1
[ $fail = 0 ] && echo "PASS: the engine's HIP paths through the model" || echo "FAIL (logs in $OUT)"
exit $fail
