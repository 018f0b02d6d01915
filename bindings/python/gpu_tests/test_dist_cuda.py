"""torch.distributed on torchcomms with CUDA tensors, one process per GPU: the c10d backend of
``TORCHCOMMS_TEST_BACKEND`` (``ctran``: our engine, NVLink between GPUs of one host; ``nccl``:
torchcomms' vendor NCCL backend, c10d name ``tc_nccl``)::

    TORCHCOMMS_TEST_BACKEND=ctran torchrun --nproc_per_node NGPU -m pytest \\
        bindings/python/gpu_tests/test_dist_cuda.py -q -rs -p no:cacheprovider

Collectives and their stream semantics (ProcessGroupNCCL's: an async operation runs after the
caller's stream, ``wait()`` orders the current stream after it, futures carry CUDA events),
batched point-to-point, DDP against torch's own NCCL process group in the same job, FSDP2 on a
DeviceMesh of the backend (2 x N/2 from 4 GPUs), compiled functional collectives, and upstream's
``torchcomms.device_mesh`` on a CUDA communicator.
"""

from __future__ import annotations

import copy
import os
from datetime import timedelta
from typing import Any, Iterator

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

import torchcomms  # noqa: E402
from torchcomms import _c10d  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL = int(os.environ.get("LOCAL_RANK", "0"))
BACKEND = os.environ.get("TORCHCOMMS_TEST_BACKEND", "nccl")
C10D = {"ctran": "ctran", "nccl": "tc_nccl"}[BACKEND]
DEV = torch.device("cuda", LOCAL % torch.cuda.device_count())
torch.cuda.set_device(DEV)


@pytest.fixture(scope="module", autouse=True)
def world_pg() -> Iterator[Any]:
    dist.init_process_group(C10D, device_id=DEV, timeout=timedelta(seconds=180))
    pg = dist.group.WORLD
    assert isinstance(pg, _c10d.TorchCommsProcessGroup) and dist.get_backend() == C10D
    comm = pg._get_backend(DEV).get_comm()
    assert comm.get_backend() == BACKEND and comm.get_device() == DEV
    yield pg
    torch.cuda.synchronize()
    dist.destroy_process_group()


def vals(rank: int, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return ((torch.arange(n, device=DEV) * (rank + 1)) % 7 + rank + 1).to(dtype)


def total(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return sum(vals(r, n, torch.float64) for r in range(WORLD)).to(dtype)


@pytest.mark.parametrize("n", [8, 1 << 16, 1 << 22], ids=["32B", "256KB", "16MB"])
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_all_reduce_sum_avg_max_premul(n: int, async_op: bool) -> None:
    for op, want in [
        (dist.ReduceOp.SUM, total(n)),
        (dist.ReduceOp.AVG, total(n) / WORLD),
        (dist.ReduceOp.MAX, torch.stack([vals(r, n) for r in range(WORLD)]).amax(0)),
        (dist._make_nccl_premul_sum(torch.tensor([0.5], device=DEV)), total(n) * 0.5),
    ]:
        t = vals(RANK, n)
        w = dist.all_reduce(t, op=op, async_op=async_op)
        if async_op:
            w.wait()
        torch.testing.assert_close(t, want)


def test_all_reduce_bf16() -> None:
    t = vals(RANK, 4096, torch.bfloat16)
    dist.all_reduce(t)
    torch.testing.assert_close(t, total(4096, torch.bfloat16))


def test_gathers_scatters_all_to_all_broadcast() -> None:
    n = 1 << 12
    out = torch.empty(n * WORLD, device=DEV)
    dist.all_gather_into_tensor(out, vals(RANK, n))
    torch.testing.assert_close(out, torch.cat([vals(r, n) for r in range(WORLD)]))
    outs = [torch.empty(n, device=DEV) for _ in range(WORLD)]
    dist.all_gather(outs, vals(RANK, n), async_op=True).wait()
    for r in range(WORLD):
        torch.testing.assert_close(outs[r], vals(r, n))
    rs = torch.empty(n, device=DEV)
    dist.reduce_scatter_tensor(rs, torch.cat([vals(RANK, n) + i for i in range(WORLD)]))
    torch.testing.assert_close(rs, total(n) + WORLD * RANK)
    b = vals(RANK, n)
    dist.broadcast(b, src=WORLD - 1)
    torch.testing.assert_close(b, vals(WORLD - 1, n))
    ins = [RANK + 1] * WORLD
    outs_split = [r + 1 for r in range(WORLD)]
    x = torch.cat(
        [torch.full((RANK + 1, 4), float(RANK * 10 + d), device=DEV) for d in range(WORLD)]
    )
    y = torch.empty(sum(outs_split), 4, device=DEV)
    dist.all_to_all_single(y, x, output_split_sizes=outs_split, input_split_sizes=ins)
    want = torch.cat(
        [torch.full((s + 1, 4), float(s * 10 + RANK), device=DEV) for s in range(WORLD)]
    )
    torch.testing.assert_close(y, want)
    dist.barrier()


def test_async_overlaps_and_orders_the_current_stream() -> None:
    """An async all_reduce runs beside compute on the caller's stream; wait() orders the current
    stream after it (no host block); the future's events do the same for its consumers."""
    n = 1 << 22
    t = vals(RANK, n)
    w = dist.all_reduce(t, async_op=True)
    a = torch.randn(2048, 2048, device=DEV)
    for _ in range(4):
        a = a @ a / 2048  # compute on the current stream meanwhile
    w.wait()
    s = t * 1  # ordered after the collective by wait()
    torch.testing.assert_close(s, total(n))
    u = vals(RANK, n)
    fut = dist.all_reduce(u, async_op=True).get_future()
    (v,) = fut.wait()
    torch.testing.assert_close(v * 1, total(n))
    chained = (
        dist.all_reduce(vals(RANK, 64), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    )
    torch.testing.assert_close(chained.wait(), total(64) * 2)
    torch.cuda.synchronize()


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)).to(DEV)


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 256, generator=g)
    return x.to(DEV), (x.roll(1, 1) * 0.5).to(DEV)


def test_ddp_matches_torch_nccl() -> None:
    """DDP on this backend and on torch's own NCCL group, same model and data, 10 steps."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    local = int(os.environ.get("LOCAL_WORLD_SIZE", WORLD))
    if torch.cuda.device_count() < local:
        pytest.skip("the reference, torch's NCCL group, refuses ranks that share a GPU")
    nccl = dist.new_group(backend="nccl")
    ours, ref = (
        DDP(_mlp(0), device_ids=[DEV.index]),
        DDP(_mlp(0), device_ids=[DEV.index], process_group=nccl),
    )
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ours, ref)]
    for step in range(10):
        x, y = _batch(step, RANK)
        for m, o in zip((ours, ref), opts):
            o.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            o.step()
    for p, q in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    torch.cuda.synchronize()
    dist.destroy_process_group(nccl)


def test_fsdp2_on_the_backend_mesh() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if WORLD >= 4 and WORLD % 2 == 0:  # HSDP: fully_shard needs the dimensions' names
        mesh = init_device_mesh("cuda", (2, WORLD // 2), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cuda", (WORLD,))
    model = _mlp(3)
    ref = copy.deepcopy(model)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt, ropt = (
        torch.optim.Adam(model.parameters(), lr=1e-3),
        torch.optim.Adam(ref.parameters(), lr=1e-3),
    )
    for step in range(8):
        x, y = _batch(step, RANK)
        loss = nn.functional.mse_loss(model(x), y)
        xs, ys = zip(*(_batch(step, r) for r in range(WORLD)))
        rloss = nn.functional.mse_loss(ref(torch.cat(xs)), torch.cat(ys))
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        torch.testing.assert_close(mean, rloss.detach(), rtol=1e-4, atol=1e-5)
        loss.backward()
        rloss.backward()
        opt.step()
        ropt.step()
        opt.zero_grad()
        ropt.zero_grad()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.full_tensor(), q, rtol=1e-4, atol=1e-5, msg=name)


def test_functional_all_reduce_compiled() -> None:
    import torch.distributed._functional_collectives as funcol

    g = dist.group.WORLD

    @torch.compile(fullgraph=True)
    def f(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(x * 2, "sum", g) + 1

    torch.testing.assert_close(f(vals(RANK, 1024)), total(1024) * 2 + 1)


def test_upstream_device_mesh_on_a_cuda_comm() -> None:
    """Upstream's DDPCommTest on this GPU: torchcomms.device_mesh over a CUDA communicator. It
    makes its group the default one; the module's default group comes back afterwards."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torchcomms.device_mesh import init_device_mesh

    world = dist.distributed_c10d._world
    saved = world.default_pg
    comm = torchcomms.new_comm(
        BACKEND, DEV, name="gpu_upstream_mesh", timeout=timedelta(seconds=120)
    )
    try:
        mesh = init_device_mesh(mesh_dim_comms=(comm,), mesh_dim_names=("main",))
        pg = mesh.get_group("main")
        t = torch.ones(10, device=DEV, dtype=torch.int32)
        dist.all_reduce(t, group=pg)
        assert t[0].item() == WORLD
        torch.manual_seed(42)
        model = DDP(
            nn.Sequential(*[nn.Linear(4, 4, bias=False, device=DEV) for _ in range(2)]),
            process_group=pg,
        )
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        inp = torch.randn(4, 4).to(DEV)
        losses = []
        for _ in range(5):
            loss = model(inp).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        assert len(set(losses)) == len(losses), losses
        torch.cuda.synchronize()
    finally:
        world.default_pg = saved
        comm.finalize()


@pytest.mark.parametrize("n", [1 << 10, 1 << 24], ids=["4KB", "64MB"])
def test_z_batch_isend_irecv_both_directions(n: int) -> None:
    """Sends and receives to both neighbours in one batch: on torch >= 2.14 they are coalesced
    into one torchcomms batch (which may not deadlock, however large). Last in the module: a
    deadlock breaks the communicator."""
    if WORLD < 2:
        pytest.skip("needs 2 GPUs")
    if n > (1 << 20) and not _c10d.batch_p2p_coalesces():
        pytest.skip(
            f"torch {torch.__version__} issues batch_isend_irecv one operation at a time on a "
            "ProcessGroup subclass: large transfers both ways can deadlock (torch >= 2.14 batches them)"
        )
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    a, b = torch.empty(n, device=DEV), torch.empty(n, device=DEV)
    ops = [
        dist.P2POp(dist.isend, vals(RANK, n) * 3, nxt),
        dist.P2POp(dist.isend, vals(RANK, n) * 5, prv),
        dist.P2POp(dist.irecv, a, prv),
        dist.P2POp(dist.irecv, b, nxt),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    torch.testing.assert_close(a, vals(prv, n) * 3)
    torch.testing.assert_close(b, vals(nxt, n) * 5)
