#!/usr/bin/env bash
# Runs every test of the project: formatting, lints, Rust unit/integration/multi-process tests
# (real processes over real sockets), the C API (its header against cbindgen, and C and C++
# programs compiled and run as ranks: bindings/c/tests, part of `cargo test`), the interop tests
# against real PyTorch, and the Python package (scripts/test-python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# The store interop tests talk to torch.distributed.TCPStore: torch must be importable, and a
# missing torch is a failure here, not a skip.
export TORCHCOMMS_REQUIRE_TORCH="${TORCHCOMMS_REQUIRE_TORCH:-1}"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "== installing PyTorch from PyPI (needed by the interop tests)"
    "$PYTHON" -m pip install --quiet torch
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace --all-targets
echo "== doctests"
cargo test --workspace --doc

# The fuzz targets' regression tests (corpus and past crashes) ran under cargo test above.
# libFuzzer itself when TORCHCOMMS_FUZZ_SECS is set (CI sets it): installing cargo-fuzz and
# building the instrumented targets takes several minutes (docs/fuzzing.md).
if [ -n "${TORCHCOMMS_FUZZ_SECS:-}" ]; then
    echo "== scripts/fuzz.sh $TORCHCOMMS_FUZZ_SECS"
    scripts/fuzz.sh "$TORCHCOMMS_FUZZ_SECS"
else
    echo "== fuzzing: NOT RUN (set TORCHCOMMS_FUZZ_SECS=10 to run each target briefly)"
fi

# Ranks on several "hosts" (network namespaces, TCP between them, shared memory inside), launched
# by torchrun. Creating namespaces needs root: CI runs as root; elsewhere this is reported.
if [ "$(id -u)" = 0 ]; then
    echo "== multi-host (network namespaces)"
    cargo build -q -p torchcomms-tests --bin tc-worker
    scripts/multihost-test.sh 2 2
else
    echo "== multi-host (network namespaces): NOT RUN - needs root (CI runs it)"
fi

# The C tests ran above under cargo test (bindings/c/tests); Python's suite needs its own build.
echo "== scripts/test-python.sh"
scripts/test-python.sh
