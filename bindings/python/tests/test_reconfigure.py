"""reconfigure() on ctran: upstream's ReconfigureTest scenarios (identity, shrink at the end and
in the middle, single to all, scale down and up, late joiners, split brain merged, after an
abort) and the errors of bad handle lists. Handles travel through torchrun's agent store, which
the communicators also bootstrap through (no store is passed)."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch.distributed import TCPStore

import torchcomms
from conftest import CPU, RANK, WORLD, need_ranks

T = timedelta(seconds=60)
_store: list[Any] = []


def store() -> Any:
    """A client of the agent store (torchrun serves MASTER_PORT)."""
    if not _store:
        _store.append(
            TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                is_master=False,
                timeout=T,
            )
        )
    return _store[0]


def collect(comm: Any, key: str) -> list[str]:
    """Every rank's init handle, in rank order of the torchrun job."""
    s = store()
    s.set(f"reconf/{key}/{RANK}", comm.get_init_handle())
    return [s.get(f"reconf/{key}/{r}").decode() for r in range(WORLD)]


def new(name: str) -> Any:
    return torchcomms.new_comm("ctran", CPU, name, enable_reconfigure=True, timeout=T)


def check_all_reduce(comm: Any, shift: int = 0) -> None:
    n, r = comm.get_size(), comm.get_rank()
    t = torch.full((1024,), float(r + 1 + shift))
    comm.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=False)
    want = float(sum(range(1 + shift, n + 1 + shift)))
    assert torch.equal(t, torch.full_like(t, want)), f"rank {r} of {n}: {t[0]} != {want}"


def reconfigured(name: str, uuid: int) -> tuple[Any, list[str]]:
    comm = new(name)
    comm.reconfigure(uuid=uuid, init_handles=collect(comm, f"{name}/init"), timeout=T).wait()
    return comm, collect(comm, f"{name}/post")


def test_a_new_reconfigurable_comm_is_alone_and_hands_out_a_stable_handle() -> None:
    comm = new("reconf_alone")
    assert (comm.get_rank(), comm.get_size()) == (0, 1)
    h = comm.get_init_handle()
    assert isinstance(h, str) and h and h == comm.get_init_handle()
    assert new("reconf_alone2").get_init_handle() != h
    check_all_reduce(comm)
    comm.finalize()


def test_reconfigure_then_collectives_in_handle_order() -> None:
    comm, handles = reconfigured("reconf_basic", 0)
    assert comm.get_size() == WORLD and comm.get_rank() == RANK
    for shift in range(3):
        check_all_reduce(comm, shift)
    t = torch.full((100,), 42.0 if RANK == 0 else 0.0)
    comm.broadcast(t, root=0, async_op=False)
    assert torch.equal(t, torch.full_like(t, 42.0))
    # Reversed handles: ranks follow the list.
    comm.reconfigure(uuid=1, init_handles=handles[::-1], timeout=T).wait()
    assert comm.get_rank() == WORLD - 1 - RANK
    check_all_reduce(comm)
    comm.finalize()


def test_a_set_of_handles_ranks_them_sorted() -> None:
    comm = new("reconf_set")
    handles = collect(comm, "reconf_set")
    comm.reconfigure(uuid=7, init_handles=set(handles), timeout=T).wait()
    assert comm.get_rank() == sorted(handles).index(comm.get_init_handle())
    check_all_reduce(comm)
    comm.finalize()


@pytest.mark.parametrize("exclude", ["last", "middle"])
def test_shrink(exclude: str) -> None:
    need_ranks(3)
    comm, handles = reconfigured(f"reconf_shrink_{exclude}", 100)
    gone = WORLD - 1 if exclude == "last" else WORLD // 2
    if RANK == gone:
        comm.finalize()
        return
    survivors = [h for i, h in enumerate(handles) if i != gone]
    comm.reconfigure(uuid=101, init_handles=survivors, timeout=T).wait()
    assert comm.get_size() == WORLD - 1
    assert comm.get_rank() == survivors.index(comm.get_init_handle())
    for shift in range(3):
        check_all_reduce(comm, shift)
    comm.finalize()


def test_single_to_all_and_back() -> None:
    comm = new("reconf_scale")
    comm.reconfigure(uuid=3, init_handles=[comm.get_init_handle()], timeout=T).wait()
    assert comm.get_size() == 1
    comm.reconfigure(uuid=4, init_handles=collect(comm, "reconf_scale"), timeout=T).wait()
    assert comm.get_size() == WORLD
    check_all_reduce(comm)
    comm.reconfigure(uuid=5, init_handles=[comm.get_init_handle()], timeout=T).wait()
    assert (comm.get_rank(), comm.get_size()) == (0, 1)
    comm.finalize()


def test_late_joiners_and_a_split_brain_merge() -> None:
    need_ranks(2)
    half = WORLD // 2
    comm = new("reconf_late")
    handles = collect(comm, "reconf_late1")
    if RANK < half:
        comm.reconfigure(uuid=4, init_handles=handles[:half], timeout=T).wait()
        check_all_reduce(comm)
    comm.reconfigure(uuid=5, init_handles=collect(comm, "reconf_late2"), timeout=T).wait()
    check_all_reduce(comm)
    # Split brain: two groups, then one.
    mine = handles[:half] if RANK < half else handles[half:]
    comm.reconfigure(uuid=6 if RANK < half else 7, init_handles=mine, timeout=T).wait()
    check_all_reduce(comm)
    comm.reconfigure(uuid=8, init_handles=handles, timeout=T).wait()
    check_all_reduce(comm)
    comm.finalize()


def test_reconfigure_after_abort() -> None:
    comm, handles = reconfigured("reconf_abort", 10)
    comm.abort()
    comm.reconfigure(uuid=11, init_handles=handles, timeout=T).wait()
    assert not comm.is_aborted()
    check_all_reduce(comm)
    comm.finalize()


def test_hooks_survive_a_reconfiguration() -> None:
    comm = new("reconf_hooks")
    seen: list[str] = []
    comm.register_pre_hook(lambda name, op_id, args: seen.append(str(name)))
    comm.reconfigure(uuid=1, init_handles=collect(comm, "reconf_hooks"), timeout=T).wait()
    check_all_reduce(comm)
    assert any("all_reduce" in s for s in seen), seen
    comm.finalize()


def test_bad_handle_lists_are_clear_errors_and_change_nothing() -> None:
    comm = new("reconf_bad")
    me = comm.get_init_handle()
    with pytest.raises(ValueError, match="init_handles.*this process's handle"):
        comm.reconfigure(uuid=1, init_handles=["someone-else"], timeout=T)
    with pytest.raises(ValueError, match="init_handles.*positions 0 and 1"):
        comm.reconfigure(uuid=1, init_handles=[me, me], timeout=T)
    with pytest.raises(ValueError, match="init_handles"):
        comm.reconfigure(uuid=1, init_handles=[], timeout=T)
    with pytest.raises(TypeError, match="init_handles"):
        comm.reconfigure(uuid=1, init_handles=(me,), timeout=T)
    with pytest.raises(TypeError, match="init_handles"):
        comm.reconfigure(uuid=1, init_handles=[me, 3], timeout=T)
    with pytest.raises(ValueError, match="uuid"):
        comm.reconfigure(uuid=-1, init_handles=[me], timeout=T)
    assert (comm.get_rank(), comm.get_size()) == (0, 1)
    check_all_reduce(comm)
    comm.finalize()


def test_a_comm_without_enable_reconfigure_refuses(world: Any) -> None:
    with pytest.raises(RuntimeError, match="reconfigure not implemented"):
        world.reconfigure(uuid=0, init_handles=["x"], timeout=T)
    with pytest.raises(RuntimeError):
        world.get_init_handle()
