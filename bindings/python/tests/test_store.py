"""new_comm(store=...) with every torch.distributed store (§5, §6, §19)."""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

import torchcomms
from conftest import RANK, WORLD
from torchcomms import ReduceOp

STORE_TIMEOUT = timedelta(seconds=60)


def agent_store() -> Any:
    """A client of torchrun's store (every rank reaches it at MASTER_ADDR:MASTER_PORT)."""
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        WORLD,
        is_master=False,
        timeout=STORE_TIMEOUT,
        use_libuv=True,
    )


def exercise(comm: Any) -> None:
    assert comm.get_rank() == RANK and comm.get_size() == WORLD
    t = torch.full((16,), float(RANK + 1))
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert torch.all(t == WORLD * (WORLD + 1) / 2)
    comm.finalize()


def test_tcpstore_served_by_rank0(world: Any) -> None:
    """A TCPStore that rank 0 serves on a free port (published through torchrun's store)."""
    agent = dist.PrefixStore("pytest_store_test", agent_store())
    if RANK == 0:
        store = dist.TCPStore("127.0.0.1", 0, WORLD, is_master=True, timeout=STORE_TIMEOUT, wait_for_workers=False)
        agent.set("port", str(store.port))
    else:
        port = int(agent.get("port"))
        store = dist.TCPStore("127.0.0.1", port, WORLD, is_master=False, timeout=STORE_TIMEOUT)
    exercise(torchcomms.new_comm("ctran", "cpu", "store_tcp", store=store, abort_process_on_timeout_or_error=False))
    world.barrier(async_op=False)  # rank 0 keeps serving until everyone is done


def test_prefixstore_over_torchrun_store() -> None:
    store = dist.PrefixStore("pytest_prefix", agent_store())
    exercise(torchcomms.new_comm("ctran", "cpu", "store_prefix", store=store, abort_process_on_timeout_or_error=False))


def test_two_comms_share_one_store() -> None:
    store = dist.PrefixStore("pytest_shared", agent_store())
    a = torchcomms.new_comm("ctran", "cpu", "shared_a", store=store, abort_process_on_timeout_or_error=False)
    b = torchcomms.new_comm("ctran", "cpu", "shared_b", store=store, abort_process_on_timeout_or_error=False)
    exercise(b)
    exercise(a)


def test_filestore(world: Any) -> None:
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    path = f"/tmp/torchcomms-pytest-filestore-{run_id}-{os.environ['MASTER_PORT']}-{WORLD}"
    if RANK == 0:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    world.barrier(async_op=False)  # nobody opens the file before rank 0 cleaned it
    store = dist.FileStore(path, WORLD)
    exercise(torchcomms.new_comm("ctran", "cpu", "store_file", store=store, abort_process_on_timeout_or_error=False))
    world.barrier(async_op=False)
    del store
    # torch's FileStore unlinks the file when its last user closes it, which may be another rank
    # at any moment: a file already gone is the normal outcome, not an error.
    if RANK == 0:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def test_hashstore() -> None:
    """A HashStore lives in one process, so only a one-rank job can bootstrap through it."""
    if WORLD != 1:
        pytest.skip(f"HashStore is in-process: only meaningful for a 1-rank job (this one has {WORLD})")
    exercise(torchcomms.new_comm("ctran", "cpu", "store_hash", store=dist.HashStore(), abort_process_on_timeout_or_error=False))


def test_comms_back_to_back_without_store() -> None:
    """Comms created one after the other from the environment (§6)."""
    for i in range(3):
        exercise(torchcomms.new_comm("ctran", "cpu", f"b2b{i}", abort_process_on_timeout_or_error=False))


def test_store_that_is_not_a_store() -> None:
    with pytest.raises(TypeError, match="store"):
        torchcomms.new_comm("ctran", "cpu", "bad_store", store=object())


def test_options_are_kept(world: Any) -> None:
    store = dist.PrefixStore("pytest_opts", agent_store())
    comm = torchcomms.new_comm(
        "ctran",
        torch.device("cpu"),
        "opts_comm",
        abort_process_on_timeout_or_error=False,
        timeout=timedelta(seconds=42),
        store=store,
        hints={"x": "1"},
    )
    o = comm.get_options()
    assert o.timeout == timedelta(seconds=42) and o.hints == {"x": "1"}
    assert o.abort_process_on_timeout_or_error is False
    assert o.store is store
    assert comm.get_device() == torch.device("cpu")
    comm.finalize()
