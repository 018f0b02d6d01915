"""The recovery job of tests/test_z_recovery.py with CUDA communicators: 4 processes on the
machine's GPUs (process i on GPU i modulo the count), one killed at a random step, the survivors
reconfigure onto three and go on, a new process joins back. Rank 0 of the pytest job runs it::

    torchrun --nproc_per_node 1 -m pytest bindings/python/gpu_tests/test_recovery_cuda.py -q -s
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
if int(os.environ.get("RANK", "0")) != 0:
    pytest.skip("launched by rank 0 only (it starts its own processes)", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from test_z_recovery import run_recovery  # noqa: E402


def test_cuda_survivors_shrink_continue_and_grow_back() -> None:
    took = run_recovery(cuda=True)
    print(f"cuda recovery on {torch.cuda.device_count()} GPU(s): {took}")
