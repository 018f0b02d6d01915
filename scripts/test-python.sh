#!/usr/bin/env bash
# Builds and installs the Python package (bindings/python) and runs its test suite under torchrun
# for 1, 2, 3 and 4 ranks, then the examples (all-reduce, DDP, FSDP2). Needs Rust, Python >= 3.9
# with pip, and network access to PyPI the first time (maturin, pytest, and torch when missing).
#
#   scripts/test-python.sh               # into the current python3 (PYTHON=... to pick another)
#   VENV=.venv scripts/test-python.sh    # into a virtualenv (created if missing; it sees the
#                                        # system's packages, so an installed torch is reused)
#
# TORCH_PIP_ARGS overrides how torch is installed when missing (default: `torch` from PyPI), e.g.
# TORCH_PIP_ARGS="torch --index-url https://download.pytorch.org/whl/cpu".
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

PYTHON="${PYTHON:-python3}"
if [[ -n "${VENV:-}" ]]; then
    if [[ ! -x "$VENV/bin/python" ]]; then
        echo "== creating virtualenv $VENV"
        "$PYTHON" -m venv --system-site-packages "$VENV"
    fi
    PYTHON="$VENV/bin/python"
fi

if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "== installing PyTorch (${TORCH_PIP_ARGS:-torch})"
    # shellcheck disable=SC2086 # word splitting of the pip arguments is intended
    "$PYTHON" -m pip install --quiet ${TORCH_PIP_ARGS:-torch}
fi
if ! "$PYTHON" -c "import pytest" 2>/dev/null; then
    echo "== installing pytest"
    "$PYTHON" -m pip install --quiet pytest
fi

echo "== pip install ./bindings/python"
"$PYTHON" -m pip install --quiet --no-deps ./bindings/python
"$PYTHON" -c "import torchcomms, torch; print('torchcomms', torchcomms._comms.__version__, 'with torch', torch.__version__)"

# torchrun's default OMP_NUM_THREADS warning is noise here; --standalone picks a free port, so
# this can run beside other jobs.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
torchrun=("$PYTHON" -m torch.distributed.run --standalone)

for n in 1 2 3 4; do
    # The fault tests and the torch.distributed jobs (test_z_dist_jobs.py) launch jobs of their
    # own: once is enough (in the 1-rank run).
    jobs=0
    [[ $n == 1 ]] && jobs=1
    echo "== pytest under torchrun --nproc_per_node $n"
    TORCHCOMMS_TEST_FAULTS=$jobs TORCHCOMMS_TEST_JOBS=$jobs "${torchrun[@]}" --nproc_per_node "$n" \
        bindings/python/tests/run_tests.py "$@"
done

for example in allreduce ddp fsdp moe; do
    echo "== example: torchrun --nproc_per_node 4 examples/python/$example.py"
    "${torchrun[@]}" --nproc_per_node 4 "examples/python/$example.py"
done

echo "== python tests passed in $(($(date +%s) - start)) s"
