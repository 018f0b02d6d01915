"""Shared fixtures of the torchcomms test suite.

Every rank of a ``torchrun`` job runs the same pytest session: tests run in the same order on
all ranks and issue the same collectives, and any decision to skip depends only on values all
ranks share (the world size), so ranks never wait on a peer that skipped. Run it through
``run_tests.py`` (see there).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Callable

import pytest
import torch

import torchcomms

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
# Per-operation timeout of the test communicators: long enough for a slow, shared CI machine,
# short enough that a bug fails the run instead of hanging it.
TIMEOUT = timedelta(seconds=float(os.environ.get("TORCHCOMMS_TEST_TIMEOUT", "120")))

CPU = torch.device("cpu")

FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INT_DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64]
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + [torch.bool]


def need_ranks(k: int) -> None:
    """Skips (with the reason printed) when the job has fewer than ``k`` ranks. The decision
    is the same on every rank."""
    if WORLD < k:
        pytest.skip(f"needs at least {k} ranks; this job has {WORLD}")


def dtype_id(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


@pytest.fixture(scope="session")
def world() -> Any:
    """The communicator over every rank, shared by the tests (finalized at the end)."""
    comm = torchcomms.new_comm(
        "ctran",
        CPU,
        "pytest_world",
        abort_process_on_timeout_or_error=False,
        timeout=TIMEOUT,
    )
    assert comm.get_rank() == RANK and comm.get_size() == WORLD
    yield comm
    comm.finalize()


_split_count = [0]


@pytest.fixture
def fresh(world: Any) -> Callable[..., Any]:
    """Makes a communicator over every rank, split from ``world`` (cheap: no store), with its
    own hooks; each is finalized after the test."""
    made: list[Any] = []

    def make(name: str = "fresh", **kw: Any) -> Any:
        _split_count[0] += 1
        comm = world.split(list(range(WORLD)), f"{name}{_split_count[0]}", **kw)
        assert comm is not None
        made.append(comm)
        return comm

    yield make
    for c in made:
        c.finalize()
