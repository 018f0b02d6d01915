"""torch.distributed on torchcomms (torchcomms/_c10d.py), in the suite's own torchrun job:
``init_process_group(backend="ctran")`` and every c10d operation real workloads call, checked
against values computed from every rank's input; works and futures; coalescing; new_group,
split_group and DeviceMesh slicing; functional collectives eager and compiled; a DDP
communication hook; bad input. Scenarios that need processes of their own (DDP against gloo,
FSDP2, a killed rank, a timeout, upstream's device_mesh) are in test_z_dist_jobs.py.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Iterator

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import torchcomms
from conftest import RANK, TIMEOUT, WORLD, need_ranks
from torchcomms import _c10d


@pytest.fixture(scope="module", autouse=True)
def world_pg() -> Iterator[Any]:
    """The default group on ctran for this module; destroyed at its end."""
    assert not dist.is_initialized()
    dist.init_process_group("ctran", timeout=TIMEOUT)
    yield dist.group.WORLD
    dist.destroy_process_group()


def vals(rank: int, n: int = 5, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.int64) * (rank + 1) % 7 + rank + 1).to(dtype)


def test_default_group_runs_on_torchcomms(world_pg: Any) -> None:
    assert isinstance(world_pg, _c10d.TorchCommsProcessGroup)
    assert dist.get_backend() == "ctran"
    assert dist.get_rank() == RANK and dist.get_world_size() == WORLD
    backend = world_pg._get_backend(torch.device("cpu"))
    comm = backend.get_comm()
    assert isinstance(comm, torchcomms.TorchComm)
    assert comm.get_rank() == RANK and comm.get_size() == WORLD and comm.get_backend() == "ctran"
    assert backend.name() == "ctran" and world_pg.name() == "ctran"
    assert torch.device("cpu") in world_pg._device_types
    # The creator read the group's device map: "ctran" alone means ctran on CPU and CUDA.
    assert world_pg._make_comm.devices == {"cpu": "ctran", "cuda": "ctran"}
    if _c10d.PYTHON_BACKENDS:
        # torch >= 2.14: the wrapper is a real c10d backend, registered with the C++ group.
        assert isinstance(backend, torch._C._distributed_c10d.Backend)
        assert torchcomms._comms._BackendWrapper is torchcomms._BackendWrapper


REDUCE = [
    ("SUM", dist.ReduceOp.SUM),
    ("AVG", dist.ReduceOp.AVG),
    ("PRODUCT", dist.ReduceOp.PRODUCT),
    ("MIN", dist.ReduceOp.MIN),
    ("MAX", dist.ReduceOp.MAX),
    ("BAND", dist.ReduceOp.BAND),
    ("BOR", dist.ReduceOp.BOR),
    ("BXOR", dist.ReduceOp.BXOR),
]


def reference(op: str, dtype: torch.dtype) -> torch.Tensor:
    xs = torch.stack([vals(r, dtype=torch.int64) for r in range(WORLD)])
    if op in ("SUM", "PREMUL_SUM"):
        out = xs.sum(0).double() * (2.5 if op == "PREMUL_SUM" else 1)
    elif op == "AVG":
        out = xs.sum(0).double() / WORLD
        if not dtype.is_floating_point:
            out = xs.sum(0) // WORLD
    elif op == "PRODUCT":
        out = xs.prod(0)
    elif op == "MIN":
        out = xs.min(0).values
    elif op == "MAX":
        out = xs.max(0).values
    else:
        out = xs[0].clone()
        for x in xs[1:]:
            out = {"BAND": out & x, "BOR": out | x, "BXOR": out ^ x}[op]
    return out.to(dtype)


# Bitwise reductions are for integers (test_bad_input_names_argument_and_rank checks floats).
REDUCE_CASES = [
    pytest.param(name, op, dtype, id=f"{name}-{tag}")
    for name, op in REDUCE
    for dtype, tag in ((torch.float32, "f32"), (torch.int64, "i64"))
    if not (dtype.is_floating_point and name in ("BAND", "BOR", "BXOR"))
]


@pytest.mark.parametrize("name,op,dtype", REDUCE_CASES)
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_all_reduce_every_op(name: str, op: Any, dtype: torch.dtype, async_op: bool) -> None:
    t = vals(RANK, dtype=dtype)
    w = dist.all_reduce(t, op=op, async_op=async_op)
    if async_op:
        w.wait()
    torch.testing.assert_close(t, reference(name, dtype), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("factor", ["float", "tensor"])
def test_all_reduce_premul_sum(factor: str) -> None:
    f = 2.5 if factor == "float" else torch.tensor([2.5])
    t = vals(RANK)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(f))
    torch.testing.assert_close(t, reference("PREMUL_SUM", torch.float32))


def test_reduce_and_broadcast() -> None:
    root = WORLD - 1
    t = vals(RANK)
    dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
    if RANK == root:
        torch.testing.assert_close(t, reference("MAX", torch.float32))
    b = vals(RANK)
    dist.broadcast(b, src=root)
    torch.testing.assert_close(b, vals(root))
    c = vals(RANK)
    dist.broadcast(c, src=0, async_op=True).wait()
    torch.testing.assert_close(c, vals(0))


def test_all_gather_forms() -> None:
    out = [torch.empty(5) for _ in range(WORLD)]
    dist.all_gather(out, vals(RANK))
    for r in range(WORLD):
        torch.testing.assert_close(out[r], vals(r))
    # Uneven sizes (all_gather_v).
    uneven = [torch.empty(r + 1) for r in range(WORLD)]
    dist.all_gather(uneven, torch.full((RANK + 1,), float(RANK)))
    for r in range(WORLD):
        assert torch.all(uneven[r] == r)
    flat = torch.empty(5 * WORLD)
    dist.all_gather_into_tensor(flat, vals(RANK))
    torch.testing.assert_close(flat, torch.cat([vals(r) for r in range(WORLD)]))
    # Into a 2-D output (one row per rank), asynchronously.
    rows = torch.empty(WORLD, 5)
    dist.all_gather_into_tensor(rows, vals(RANK), async_op=True).wait()
    torch.testing.assert_close(rows, torch.stack([vals(r) for r in range(WORLD)]))


def test_reduce_scatter_forms() -> None:
    full = reference("SUM", torch.float32)
    ins = [vals(RANK) + i for i in range(WORLD)]
    out = torch.empty(5)
    dist.reduce_scatter(out, ins)
    expected = full + WORLD * RANK
    torch.testing.assert_close(out, expected)
    big = torch.cat([vals(RANK) + i for i in range(WORLD)])
    out2 = torch.empty(5)
    dist.reduce_scatter_tensor(out2, big, op=dist.ReduceOp.AVG, async_op=True).wait()
    torch.testing.assert_close(out2, expected / WORLD)
    # Uneven sizes (reduce_scatter_v): rank r receives r + 1 elements.
    uneven_in = [torch.full((r + 1,), float(RANK + 1)) for r in range(WORLD)]
    uneven_out = torch.empty(RANK + 1)
    dist.reduce_scatter(uneven_out, uneven_in)
    assert torch.all(uneven_out == WORLD * (WORLD + 1) / 2)


def test_all_to_all_forms() -> None:
    ins = [torch.full((2,), float(RANK * 10 + d)) for d in range(WORLD)]
    outs = [torch.empty(2) for _ in range(WORLD)]
    dist.all_to_all(outs, ins)
    for s in range(WORLD):
        assert torch.all(outs[s] == s * 10 + RANK)
    x = torch.cat(ins)
    y = torch.empty_like(x)
    dist.all_to_all_single(y, x)
    torch.testing.assert_close(
        y, torch.cat([torch.full((2,), float(s * 10 + RANK)) for s in range(WORLD)])
    )
    # Split sizes: rank r sends r+1 rows to every peer and receives s+1 from peer s.
    in_splits = [RANK + 1] * WORLD
    out_splits = [s + 1 for s in range(WORLD)]
    x = torch.cat([torch.full((RANK + 1, 3), float(RANK * 10 + d)) for d in range(WORLD)])
    y = torch.empty(sum(out_splits), 3)
    dist.all_to_all_single(y, x, output_split_sizes=out_splits, input_split_sizes=in_splits)
    expected = torch.cat([torch.full((s + 1, 3), float(s * 10 + RANK)) for s in range(WORLD)])
    torch.testing.assert_close(y, expected)


def test_gather_scatter() -> None:
    root = WORLD // 2
    gl = [torch.empty(5) for _ in range(WORLD)] if RANK == root else None
    dist.gather(vals(RANK), gather_list=gl, dst=root)
    if RANK == root:
        assert gl is not None
        for r in range(WORLD):
            torch.testing.assert_close(gl[r], vals(r))
    sl = [vals(r) * 2 for r in range(WORLD)] if RANK == root else None
    out = torch.empty(5)
    dist.scatter(out, scatter_list=sl, src=root)
    torch.testing.assert_close(out, vals(RANK) * 2)


def test_send_recv_and_batch_isend_irecv() -> None:
    need_ranks(2)
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    if RANK % 2 == 0:
        dist.send(vals(RANK), nxt)
        got = torch.empty(5)
        dist.recv(got, prv)
    else:
        got = torch.empty(5)
        dist.recv(got, prv)
        dist.send(vals(RANK), nxt)
    torch.testing.assert_close(got, vals(prv))
    # Both directions at once in one batch (the coalescing manager).
    to_next, from_prev = vals(RANK) * 3, torch.empty(5)
    to_prev, from_next = vals(RANK) * 5, torch.empty(5)
    ops = [
        dist.P2POp(dist.isend, to_next, nxt),
        dist.P2POp(dist.irecv, from_prev, prv),
        dist.P2POp(dist.isend, to_prev, prv),
        dist.P2POp(dist.irecv, from_next, nxt),
    ]
    works = dist.batch_isend_irecv(ops)
    assert works
    for w in works:
        w.wait()
    torch.testing.assert_close(from_prev, vals(prv) * 3)
    torch.testing.assert_close(from_next, vals(nxt) * 5)


def test_coalescing_manager_fast_paths() -> None:
    """all_reduce, all_gather_into_tensor and reduce_scatter_tensor inside
    ``_coalescing_manager`` become allreduce_coalesced and the *_coalesced forms."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    a, b = vals(RANK), vals(RANK, 3) * 2
    with _coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    torch.testing.assert_close(a, reference("SUM", torch.float32))
    torch.testing.assert_close(b, torch.stack([vals(r, 3) * 2 for r in range(WORLD)]).sum(0))
    outs = [torch.empty(5 * WORLD), torch.empty(2 * WORLD)]
    with _coalescing_manager():
        dist.all_gather_into_tensor(outs[0], vals(RANK))
        dist.all_gather_into_tensor(outs[1], torch.full((2,), float(RANK)))
    torch.testing.assert_close(outs[0], torch.cat([vals(r) for r in range(WORLD)]))
    torch.testing.assert_close(
        outs[1], torch.cat([torch.full((2,), float(r)) for r in range(WORLD)])
    )
    rs = torch.empty(2)
    with _coalescing_manager():
        dist.reduce_scatter_tensor(rs, torch.ones(2 * WORLD))
    torch.testing.assert_close(rs, torch.full((2,), float(WORLD)))


def test_barrier_and_monitored_barrier(world_pg: Any) -> None:
    dist.barrier()
    dist.barrier(async_op=True).wait()
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=60))
    except ValueError as e:
        # torch < 2.12 lets only gloo groups through dist.monitored_barrier; the group's own
        # method (what it calls) is the same code.
        assert "GLOO" in str(e), e
        world_pg.monitored_barrier(timedelta(seconds=60))
    world_pg.monitored_barrier(timedelta(seconds=60), wait_all_ranks=True)


def test_work_and_future() -> None:
    t = vals(RANK)
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    assert w.wait()
    (value,) = fut.wait()
    torch.testing.assert_close(value, reference("SUM", torch.float32))
    assert w.is_completed() and w.is_success() and w.exception() is None
    # A future asked for before the operation finished completes from the engine's thread.
    chained = (
        dist.all_reduce(vals(RANK), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    )
    torch.testing.assert_close(chained.wait(), reference("SUM", torch.float32) * 2)


def test_per_op_timeout_reaches_the_communicator(world_pg: Any) -> None:
    backend = world_pg._get_backend(torch.device("cpu"))
    opts = dist.AllreduceOptions()
    opts.timeout = timedelta(seconds=7)
    w = world_pg.allreduce([torch.ones(2)], opts)
    w.wait()
    assert backend._verify_work_timeout(w, timedelta(seconds=7))
    w2 = world_pg.allreduce([torch.ones(2)], dist.AllreduceOptions())
    w2.wait()
    assert backend._verify_work_timeout(w2, TIMEOUT)


def test_new_group() -> None:
    need_ranks(2)
    members = list(range(0, WORLD, 2))
    g = dist.new_group(members)
    if RANK in members:
        assert isinstance(g, _c10d.TorchCommsProcessGroup) and g.size() == len(members)
        t = torch.ones(3)
        dist.all_reduce(t, group=g)
        assert torch.all(t == len(members))
        assert dist.get_process_group_ranks(g) == members
        dist.destroy_process_group(g)
    else:
        assert g == dist.GroupMember.NON_GROUP_MEMBER


def test_split_group(world_pg: Any) -> None:
    halves = [
        h for h in (list(range(0, (WORLD + 1) // 2)), list(range((WORLD + 1) // 2, WORLD))) if h
    ]
    mine = next(h for h in halves if RANK in h)
    # ProcessGroup.split_group (what dist.split_group and upstream's DeviceMesh tests call): a
    # collective over the parent; every communicator splits.
    cpu = torch.device("cpu")
    child = world_pg.split_group(
        mine, group_name="pytest_split", opts=world_pg._get_backend(cpu).options
    )
    assert child is not None and child.size() == len(mine) and child.rank() == mine.index(RANK)
    assert child.group_name == "pytest_split" and child._get_backend(cpu).name() == "ctran"
    t = torch.full((2,), float(RANK))
    child.allreduce([t]).wait()
    assert torch.all(t == sum(mine))
    child.shutdown()
    try:
        s = dist.split_group(split_ranks=halves)
    except RuntimeError as e:
        if "No device associated with the default pg" not in str(e):
            raise
        pytest.skip(f"torch {torch.__version__} splits only groups bound to an accelerator: {e}")
    assert s is not None and s.size() == len(mine)
    t = torch.full((2,), float(RANK))
    dist.all_reduce(t, group=s)
    assert torch.all(t == sum(mine))
    dist.destroy_process_group(s)


def test_device_mesh_slicing() -> None:
    from torch.distributed.device_mesh import init_device_mesh

    if WORLD % 2:
        pytest.skip(f"a 2-D mesh needs an even number of ranks; this job has {WORLD}")
    mesh = init_device_mesh("cpu", (2, WORLD // 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"], mesh["tp"]
    assert dp.size() == 2 and tp.size() == WORLD // 2
    for sub in (dp, tp):
        g = sub.get_group()
        assert isinstance(g, _c10d.TorchCommsProcessGroup)
        t = torch.full((4,), float(RANK))
        dist.all_reduce(t, group=g)
        ranks = dist.get_process_group_ranks(g)
        assert torch.all(t == sum(ranks)), (ranks, t)
        assert RANK in ranks
    # A functional collective over one mesh dimension.
    r = funcol.all_reduce(torch.ones(3), "sum", (mesh, 1))
    assert torch.all(r.wait() if hasattr(r, "wait") else r == WORLD // 2)


def test_functional_collectives_eager() -> None:
    g = dist.group.WORLD
    r = funcol.all_reduce(vals(RANK), "sum", g)
    torch.testing.assert_close(torch.as_tensor(r), reference("SUM", torch.float32))
    # torch 2.15 renamed all_gather_tensor/reduce_scatter_tensor to *_single.
    all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    reduce_scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor
    ag = all_gather(vals(RANK), 0, g)
    torch.testing.assert_close(torch.as_tensor(ag), torch.cat([vals(r) for r in range(WORLD)]))
    rs = reduce_scatter(torch.ones(2 * WORLD), "sum", 0, g)
    torch.testing.assert_close(torch.as_tensor(rs), torch.full((2,), float(WORLD)))
    a2a = funcol.all_to_all_single(
        torch.arange(WORLD, dtype=torch.float) + 10 * RANK, None, None, g
    )
    torch.testing.assert_close(
        torch.as_tensor(a2a), torch.tensor([10.0 * s + RANK for s in range(WORLD)])
    )


def test_functional_all_reduce_compiled_fullgraph() -> None:
    g = dist.group.WORLD

    # aot_eager: Dynamo traces the whole function (fullgraph) and AOTAutograd functionalizes
    # the collective; the Inductor lowering runs in test_z_dist_jobs.py (it compiles C++).
    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(x: torch.Tensor) -> torch.Tensor:
        y = funcol.all_reduce(x * 2, "sum", g)
        return y + 1

    out = step(vals(RANK))
    torch.testing.assert_close(out, reference("SUM", torch.float32) * 2 + 1)


def test_ddp_communication_hook() -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 4))
    calls = []

    # No annotations: DDP checks them against dist.GradBucket/torch.futures.Future, and this
    # module's postponed annotations would be strings.
    def hook(state, bucket):  # type: ignore[no-untyped-def]
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(None, hook)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(RANK))
    model(x).sum().backward()
    assert calls, "the communication hook never ran"
    for p in model.parameters():
        assert p.grad is not None
        g = p.grad.clone()
        dist.broadcast(g, src=0)
        torch.testing.assert_close(p.grad, g)  # every rank ends with the same averaged gradient


def _expect(exc: type, *needles: str) -> Any:
    return pytest.raises(exc, match=".*".join(needles))


def test_bad_input_names_argument_and_rank() -> None:
    with _expect(ValueError, f"rank {RANK}", "all_gather_single|output"):
        dist.all_gather_into_tensor(torch.empty(5 * WORLD + 1), vals(RANK))
    with _expect(ValueError, f"rank {RANK}", "output_tensors"):
        dist.all_gather([torch.empty(5)] * (WORLD + 1), vals(RANK))
    with _expect(ValueError, f"rank {RANK}", "split"):
        dist.all_to_all_single(
            torch.empty(WORLD + 1),
            torch.empty(WORLD + 1),
            output_split_sizes=[WORLD + 2] * WORLD,
            input_split_sizes=[WORLD + 2] * WORLD,
        )
    with _expect(ValueError, f"rank {RANK}", "op"):
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BXOR)
    with pytest.raises(ValueError):  # torch's own check, before the backend
        dist.broadcast(torch.ones(2), src=WORLD + 3)
    # The group still works after bad calls.
    t = torch.ones(2)
    dist.all_reduce(t)
    assert torch.all(t == WORLD)
