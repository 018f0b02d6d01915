"""torchcomms.objcol (§16): object collectives over a communicator."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from conftest import RANK, WORLD, need_ranks
from torchcomms import objcol


def obj(rank: int) -> Any:
    # Different sizes per rank; types torch.load(weights_only=True) accepts.
    return {"rank": rank, "name": "r" * (rank + 1), "vals": list(range(rank * 3)), "t": torch.arange(rank + 2)}


def same(a: Any, b: Any) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


def test_all_gather_object(world: Any) -> None:
    out: list[Any] = [None] * WORLD
    objcol.all_gather_object(world, out, obj(RANK))
    assert all(same(out[q], obj(q)) for q in range(WORLD))


def test_gather_object(world: Any) -> None:
    root = WORLD - 1
    out: list[Any] | None = [None] * WORLD if RANK == root else None
    objcol.gather_object(world, obj(RANK), root, out)
    if RANK == root:
        assert out is not None and all(same(out[q], obj(q)) for q in range(WORLD))


def test_broadcast_object_list(world: Any) -> None:
    root = 0
    lst: list[Any] = [obj(root), "second", 3] if RANK == root else [None, None, None]
    objcol.broadcast_object_list(world, lst, root)
    assert same(lst[0], obj(root)) and lst[1:] == ["second", 3]


def test_scatter_object_list(world: Any) -> None:
    root = WORLD // 2
    out: list[Any] = [None]
    inputs = [obj(q) for q in range(WORLD)] if RANK == root else None
    objcol.scatter_object_list(world, root, out, inputs)
    assert same(out[0], obj(RANK))


def test_send_recv_object_list(world: Any) -> None:
    need_ranks(2)
    if RANK == 0:
        objcol.send_object_list(world, [obj(0), "x" * 1000], dst=1)
    elif RANK == 1:
        got: list[Any] = [None, None]
        objcol.recv_object_list(world, got, src=0)
        assert same(got[0], obj(0)) and got[1] == "x" * 1000
    world.barrier(async_op=False)


class _Custom:
    def __init__(self, v: int) -> None:
        self.v = v


def test_weights_only_false_allows_custom_objects(world: Any) -> None:
    out: list[Any] = [None] * WORLD
    objcol.all_gather_object(world, out, _Custom(RANK), weights_only=False)
    assert [o.v for o in out] == list(range(WORLD))


def test_weights_only_true_refuses_custom_objects(world: Any) -> None:
    out: list[Any] = [None] * WORLD
    with pytest.raises(Exception, match="(?i)weights_only|unsupported|global"):
        objcol.all_gather_object(world, out, _Custom(RANK))
