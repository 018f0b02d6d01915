#!/usr/bin/env bash
# Builds the Python wheel (abi3) with the CUDA kernels compiled ahead of time, so that a first
# communicator on a fresh machine compiles nothing (NVRTC at run time is then needed only on
# GPUs of other architectures). Needs no GPU: NVRTC runs on the CPU.
#
#   scripts/build-gpu-wheel.sh                 # wheel into target/wheels, sm_80 sm_90 sm_100
#   ARCHS="90" OUT=dist scripts/build-gpu-wheel.sh
#
# NVRTC comes from TORCHCOMMS_NVRTC_LIB, else the `nvidia-cuda-nvrtc` wheel from PyPI, unpacked
# into target/nvrtc. Other Rust binaries (torchcomms-perf, the GPU tests) embed the same
# kernels when built with TORCHCOMMS_PREBUILT_KERNELS=target/prebuilt-kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
OUT=${OUT:-target/wheels}
ARCHS=${ARCHS:-"80 90 100"}
PYTHON=${PYTHON:-python3}

if [[ -z "${TORCHCOMMS_NVRTC_LIB:-}" ]]; then
    lib=$(find target/nvrtc -name 'libnvrtc.so.*' ! -name '*builtins*' 2>/dev/null | head -1 || true)
    if [[ -z "$lib" ]]; then
        echo "== fetching NVRTC (nvidia-cuda-nvrtc from PyPI)"
        mkdir -p target/nvrtc
        "$PYTHON" -m pip download --quiet --no-deps -d target/nvrtc nvidia-cuda-nvrtc
        "$PYTHON" -m zipfile -e target/nvrtc/nvidia_cuda_nvrtc-*.whl target/nvrtc/unpacked
        lib=$(find target/nvrtc -name 'libnvrtc.so.*' ! -name '*builtins*' | head -1)
    fi
    export TORCHCOMMS_NVRTC_LIB="$root/$lib"
fi
# NVRTC loads its builtins library from beside itself by name.
export LD_LIBRARY_PATH="$(dirname "$TORCHCOMMS_NVRTC_LIB")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== compiling the kernels for: $ARCHS"
cargo build --quiet --release -p torchcomms-tools --bin torchcomms-prebuild-kernels
kernels="$root/target/prebuilt-kernels"
rm -rf "$kernels"
arch_args=()
for a in $ARCHS; do arch_args+=(--arch "$a"); done
target/release/torchcomms-prebuild-kernels --out "$kernels" "${arch_args[@]}"

echo "== building the wheel into $OUT"
TORCHCOMMS_PREBUILT_KERNELS="$kernels" "$PYTHON" -m pip wheel --quiet --no-deps -w "$OUT" ./bindings/python
ls -l "$OUT"/*.whl
