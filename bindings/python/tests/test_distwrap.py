"""torchcomms.distwrap (upstream's torch.distributed look-alike): with ``use_torchcomms=True``
every collective runs on the group's TorchComm objects, global ranks translated to group ranks;
without it, calls pass through to torch.distributed."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import torch
import torch.distributed as dist

from conftest import RANK, TIMEOUT, WORLD, need_ranks
from torchcomms import distwrap
from torchcomms.distwrap import pginfo


@pytest.fixture(scope="module", autouse=True)
def world() -> Iterator[Any]:
    assert not dist.is_initialized()
    distwrap.init_process_group("ctran", timeout=TIMEOUT, use_torchcomms=True)
    assert distwrap.torchcomms_is_enabled()
    yield dist.group.WORLD
    if dist.is_initialized():
        distwrap.destroy_process_group()


def test_parse_backend_string() -> None:
    assert distwrap.parse_backend_string("gloo") == {"cpu": "gloo"}
    assert distwrap.parse_backend_string("ncclx") == {"cuda": "ncclx"}
    assert distwrap.parse_backend_string("cpu:ctran,cuda:nccl") == {"cpu": "ctran", "cuda": "nccl"}
    with pytest.raises(ValueError, match="Unknown backend"):
        distwrap.parse_backend_string("carrier-pigeon")
    with pytest.raises(ValueError, match="Duplicate device type"):
        distwrap.parse_backend_string("cpu:gloo,cpu:ctran")
    with pytest.raises(ValueError, match="backend must be specified"):
        distwrap.init_process_group(None)


def test_world_has_a_communicator(world: Any) -> None:
    comms = pginfo.pg_info_get_data(world, "torchcomms")
    assert comms["cpu"].get_rank() == RANK and comms["cpu"].get_size() == WORLD
    assert pginfo.pg_info_get_global_ranks(world) == list(range(WORLD))


def test_collectives_on_the_communicator() -> None:
    t = torch.full((4,), float(RANK + 1))
    distwrap.all_reduce(t)
    assert torch.all(t == WORLD * (WORLD + 1) / 2)
    t = torch.full((4,), float(RANK + 1))
    distwrap.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).wait()
    assert torch.all(t == WORLD)
    b = torch.full((2,), float(RANK))
    distwrap.broadcast(b, src=WORLD - 1)
    assert torch.all(b == WORLD - 1)
    r = torch.full((2,), float(RANK + 1))
    distwrap.reduce(r, dst=0, op=dist._make_nccl_premul_sum(2.0))
    if RANK == 0:
        assert torch.all(r == WORLD * (WORLD + 1))
    out = [torch.empty(r_ + 1) for r_ in range(WORLD)]  # unequal sizes: all_gather_v
    distwrap.all_gather(out, torch.full((RANK + 1,), float(RANK)))
    assert all(torch.all(out[i] == i) for i in range(WORLD))
    flat = torch.empty(2 * WORLD)
    distwrap.all_gather_into_tensor(flat, torch.full((2,), float(RANK)))
    assert flat.tolist() == [float(i) for i in range(WORLD) for _ in range(2)]
    rs = torch.empty(3)
    distwrap.reduce_scatter_tensor(rs, torch.ones(3 * WORLD))
    assert torch.all(rs == WORLD)
    outs = [torch.empty(1) for _ in range(WORLD)]
    distwrap.all_to_all(outs, [torch.full((1,), float(RANK * 10 + d)) for d in range(WORLD)])
    assert [o.item() for o in outs] == [float(s * 10 + RANK) for s in range(WORLD)]
    y = torch.empty(sum(s + 1 for s in range(WORLD)))
    x = torch.cat([torch.full((RANK + 1,), float(RANK)) for _ in range(WORLD)])
    distwrap.all_to_all_single(y, x, [s + 1 for s in range(WORLD)], [RANK + 1] * WORLD)
    assert y.tolist() == [float(s) for s in range(WORLD) for _ in range(s + 1)]
    g = [torch.empty(1) for _ in range(WORLD)] if RANK == 0 else None
    distwrap.gather(torch.full((1,), float(RANK)), g, dst=0)
    if RANK == 0:
        assert [x.item() for x in g] == [float(i) for i in range(WORLD)]
    s = torch.empty(1)
    distwrap.scatter(
        s, [torch.full((1,), float(i * 3)) for i in range(WORLD)] if RANK == 0 else None, src=0
    )
    assert s.item() == RANK * 3
    distwrap.barrier()
    with pytest.raises(ValueError, match="both src and group_src"):
        distwrap.broadcast(b, src=0, group_src=0)


def test_point_to_point_and_batches() -> None:
    need_ranks(2)
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    got = torch.empty(2)
    if RANK % 2 == 0:
        distwrap.send(torch.full((2,), float(RANK)), dst=nxt)
        assert distwrap.recv(got, src=prv) == prv
    else:
        assert distwrap.recv(got, src=prv) == prv
        distwrap.send(torch.full((2,), float(RANK)), dst=nxt)
    assert torch.all(got == prv)
    a, b = torch.empty(3), torch.empty(3)
    ops = [
        distwrap.P2POp(distwrap.isend, torch.full((3,), float(RANK)), nxt),
        distwrap.P2POp(distwrap.isend, torch.full((3,), float(RANK + 100)), prv),
        distwrap.P2POp(distwrap.irecv, a, prv),
        distwrap.P2POp(distwrap.irecv, b, nxt),
    ]
    works = distwrap.batch_isend_irecv(ops)
    assert len(works) == len(ops)
    for w in works:
        w.wait()
    assert torch.all(a == prv) and torch.all(b == nxt + 100)
    with pytest.raises(ValueError, match="wildcard"):
        distwrap.recv(torch.empty(1))


def test_object_collectives() -> None:
    objs: list[Any] = [None] * WORLD
    distwrap.all_gather_object(objs, {"rank": RANK})
    assert objs == [{"rank": i} for i in range(WORLD)]
    lst = [f"from {RANK}", RANK] if RANK == 0 else [None, None]
    distwrap.broadcast_object_list(lst, src=0)
    assert lst == ["from 0", 0]


def test_split_group_splits_the_communicators() -> None:
    halves = [
        h for h in (list(range(0, (WORLD + 1) // 2)), list(range((WORLD + 1) // 2, WORLD))) if h
    ]
    mine = next(h for h in halves if RANK in h)
    pg = distwrap.split_group(split_ranks=halves, group_desc="halves")
    assert pg is not None and dist.get_process_group_ranks(pg) == mine
    comm = pginfo.pg_info_get_data(pg, "torchcomms")["cpu"]
    assert comm.get_size() == len(mine) and comm.get_rank() == mine.index(RANK)
    t = torch.full((2,), float(RANK))
    distwrap.broadcast(t, src=mine[-1], group=pg)  # a global rank, translated
    assert torch.all(t == mine[-1])
    distwrap.all_reduce(t, group=pg)
    assert torch.all(t == mine[-1] * len(mine))
    with pytest.raises(AssertionError, match="new_group is not supported with torchcomms"):
        distwrap.new_group([0], backend="ctran")
    distwrap.destroy_process_group(pg)


def test_without_torchcomms_calls_pass_through() -> None:
    distwrap.destroy_process_group()
    assert not dist.is_initialized()
    distwrap.init_process_group("ctran", timeout=TIMEOUT)
    assert not distwrap.torchcomms_is_enabled()
    t = torch.full((3,), float(RANK + 1))
    distwrap.all_reduce(t)
    assert torch.all(t == WORLD * (WORLD + 1) / 2)
    g = distwrap.new_group(list(range(WORLD)), backend="ctran")
    distwrap.all_reduce(t, group=g)
    assert torch.all(t == WORLD * WORLD * (WORLD + 1) / 2)
    distwrap.destroy_process_group()
