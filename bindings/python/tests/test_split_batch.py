"""split (upstream §7) and batched point-to-point operations (§9)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch

import torchcomms
from conftest import RANK, WORLD, need_ranks
from torchcomms import BatchP2POptions, BatchSendRecv, P2POp, ReduceOp
from torchcomms._comms import P2POpType


def test_split_all_ranks(world: Any) -> None:
    child = world.split(list(range(WORLD)), "split_all")
    assert child is not None
    assert child.get_rank() == RANK and child.get_size() == WORLD
    assert child.get_name() == "split_all"
    assert child.get_backend() == "ctran"
    t = torch.ones(3)
    child.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert torch.all(t == WORLD)
    child.finalize()


def test_split_parity_groups(world: Any) -> None:
    """Every rank joins the group of its parity; the child rank is the index in the list."""
    mine = [q for q in range(WORLD) if q % 2 == RANK % 2]
    child = world.split(mine, f"parity{RANK % 2}")
    assert child is not None
    assert child.get_size() == len(mine)
    assert child.get_rank() == mine.index(RANK)
    t = torch.tensor([float(RANK)])
    child.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert t.item() == float(sum(mine))
    child.finalize()


def test_split_reversed_order_sets_rank(world: Any) -> None:
    ranks = list(reversed(range(WORLD)))
    child = world.split(ranks, "reversed")
    assert child.get_rank() == ranks.index(RANK)
    out = torch.empty(WORLD, dtype=torch.int64)
    child.all_gather_single(out, torch.tensor([RANK]), async_op=False)
    assert out.tolist() == ranks
    child.finalize()


def test_split_excluded_ranks_get_none(world: Any) -> None:
    need_ranks(2)
    ranks = [0] if RANK == 0 else []
    child = world.split(ranks, "only0")
    if RANK == 0:
        assert child is not None and child.get_size() == 1 and child.get_rank() == 0
        child.barrier(async_op=False)
        child.finalize()
    else:
        assert child is None


def test_split_nested(world: Any) -> None:
    a = world.split(list(range(WORLD)), "nest_a")
    b = a.split(list(range(WORLD)), "nest_b")
    t = torch.ones(2)
    b.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert torch.all(t == WORLD)
    b.finalize()
    a.finalize()


def test_split_child_gets_fresh_options(world: Any) -> None:
    """The child gets fresh default options plus the given hints/timeout (§7)."""
    child = world.split(list(range(WORLD)), "fresh_opts", hints={"k": "v"}, timeout=timedelta(seconds=77))
    o = child.get_options()
    assert o.hints == {"k": "v"}
    assert o.timeout == timedelta(seconds=77)
    # The parent was created with abort_process_on_timeout_or_error=False; the child is not.
    assert world.get_options().abort_process_on_timeout_or_error is False
    assert o.abort_process_on_timeout_or_error is torchcomms.CommOptions().abort_process_on_timeout_or_error
    child.finalize()


def test_split_rejects_bad_lists(world: Any) -> None:
    need_ranks(2)
    other = (RANK + 1) % WORLD
    # Omits this rank: every rank raises before any communication.
    with pytest.raises(ValueError, match="contains this rank"):
        world.split([other], "bad_omit")
    with pytest.raises(ValueError, match="duplicates"):
        world.split([RANK, RANK], "bad_dup")
    with pytest.raises(ValueError, match="ranks"):
        world.split([WORLD], "bad_range")
    with pytest.raises(ValueError, match="ranks"):
        world.split([-1], "bad_negative")
    # The parent still works.
    world.barrier(async_op=False)


def test_batch_ring_both_directions(world: Any) -> None:
    need_ranks(2)
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    for async_op in (False, True):
        got_prev = torch.empty(5)
        got_next = torch.empty(5)
        batch = world.batch_op_create()
        assert isinstance(batch, BatchSendRecv)
        batch.send(torch.full((5,), float(RANK)), nxt)
        batch.recv(got_prev, prv)
        batch.send(torch.full((5,), float(RANK) + 0.5), prv)
        batch.recv(got_next, nxt)
        assert len(batch.ops) == 4
        work = batch.issue(async_op)
        work.wait()
        assert torch.all(got_prev == prv) and torch.all(got_next == nxt + 0.5)


def test_batch_ops_are_read_write(world: Any) -> None:
    need_ranks(2)
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    batch = world.batch_op_create()
    got = torch.zeros(3, dtype=torch.int64)
    send = P2POp(P2POpType.SEND, torch.full((3,), RANK, dtype=torch.int64), 0)
    send.peer = nxt  # attributes are writable
    assert send.type == P2POpType.SEND and send.peer == nxt
    recv = P2POp(P2POpType.RECV, torch.empty(1), prv)
    recv.tensor = got
    batch.ops = [send, recv]
    opts = BatchP2POptions()
    assert opts.timeout == timedelta(0)
    opts.timeout = timedelta(seconds=60)
    opts.hints = {"a": "b"}
    batch.issue(async_op=False, options=opts)
    assert got.tolist() == [prv] * 3


def test_batch_empty_is_rejected(world: Any) -> None:
    with pytest.raises(ValueError, match="empty batch"):
        world.batch_op_create().issue(False)


def test_batch_with_self_on_one_rank(world: Any) -> None:
    """A batch whose peer is this rank is refused (no send/recv to self), on every rank."""
    batch = world.batch_op_create()
    batch.send(torch.ones(1), RANK)
    with pytest.raises(ValueError, match="peer"):
        batch.issue(False)
