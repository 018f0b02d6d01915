#!/usr/bin/env bash
# Runs every test of the project: formatting, lints, Rust unit/integration/multi-process tests
# (real processes over real sockets), and the interop tests against real PyTorch.
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
