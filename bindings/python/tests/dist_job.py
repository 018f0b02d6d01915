"""One rank of a torch.distributed job that test_z_dist_jobs.py launches (processes of its own:
training jobs that need their own default group, a rank that dies, a rank that stalls).

Usage: ``python dist_job.py SCENARIO`` with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` set. Prints ``RESULT <json>`` lines the test checks.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

import torchcomms
from torchcomms import _c10d

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def result(**kw: Any) -> None:
    print("RESULT " + json.dumps(kw), flush=True)


def mlp(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16)).to(dtype)


_TEACHER = torch.randn(32, 16, generator=torch.Generator().manual_seed(7)) / 4


def batch(step: int, rank: int, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of a learnable task (a fixed linear teacher): each rank's own inputs."""
    g = torch.Generator().manual_seed(1000 * (step % 4) + rank)
    x = torch.randn(n, 32, generator=g)
    return x, x @ _TEACHER


# --------------------------------------------------------------------------- training


def ddp_against_gloo() -> None:
    """DDP on the ctran default group and on a gloo group, side by side from the same initial
    model and data: after 20 SGD steps the parameters agree to 1e-6 (and across ranks)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    gloo = dist.new_group(backend="gloo")
    models = {
        "ctran": DDP(mlp()),  # the default group: ctran
        "gloo": DDP(mlp(), process_group=gloo),
    }
    assert isinstance(models["ctran"].process_group, _c10d.TorchCommsProcessGroup)
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for k, m in models.items()}
    losses: dict[str, list[float]] = {k: [] for k in models}
    t0 = time.monotonic()
    for step in range(20):
        x, y = batch(step, RANK)
        for k, m in models.items():
            opts[k].zero_grad()
            loss = nn.functional.mse_loss(m(x), y)
            loss.backward()
            opts[k].step()
            losses[k].append(loss.item())
    diff = max(
        (a - b).abs().max().item()
        for a, b in zip(models["ctran"].parameters(), models["gloo"].parameters())
    )
    # The same parameters on every rank (gathered through ctran).
    flat = torch.cat([p.detach().reshape(-1) for p in models["ctran"].parameters()])
    every = [torch.empty_like(flat) for _ in range(WORLD)]
    dist.all_gather(every, flat)
    spread = max((e - flat).abs().max().item() for e in every)
    result(
        ddp_max_diff=diff,
        ddp_rank_spread=spread,
        ddp_first_loss=losses["ctran"][0],
        ddp_last_loss=losses["ctran"][-1],
        ddp_seconds=time.monotonic() - t0,
    )


def fsdp2_on_2x2_mesh() -> None:
    """FSDP2 (fully_shard) on a 2 x 2 DeviceMesh (replicate x shard: HSDP) made by
    torch.distributed from the ctran default group: each rank trains on its own batch; the model
    follows a local one trained on all ranks' batches at once (the mean loss)."""
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, WORLD // 2), mesh_dim_names=("replicate", "shard"))
    for name in ("replicate", "shard"):
        assert isinstance(mesh[name].get_group(), _c10d.TorchCommsProcessGroup), name
    model = mlp(seed=3)
    ref = copy.deepcopy(model)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    t0 = time.monotonic()
    worst = 0.0
    for step in range(10):
        x, y = batch(step, RANK)
        loss = nn.functional.mse_loss(model(x), y)
        xs, ys = zip(*(batch(step, r) for r in range(WORLD)))
        ref_loss = nn.functional.mse_loss(ref(torch.cat(xs)), torch.cat(ys))
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        worst = max(worst, abs(mean.item() - ref_loss.item()))
        loss.backward()
        ref_loss.backward()
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    pdiff = max((full[n] - p).abs().max().item() for n, p in ref.named_parameters())
    result(
        fsdp_loss_diff=worst,
        fsdp_param_diff=pdiff,
        fsdp_last_loss=loss.item(),
        fsdp_seconds=time.monotonic() - t0,
    )


def compiled_funcol() -> None:
    """A function calling the functional all_reduce, compiled whole (fullgraph) by Inductor."""
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD

    @torch.compile(fullgraph=True)
    def f(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(x.sin() * 2, "sum", group) + 1

    t0 = time.monotonic()
    x = torch.full((8,), float(RANK))
    got = f(x)
    want = sum(torch.full((8,), float(r)).sin() * 2 for r in range(WORLD)) + 1
    result(
        compiled_ok=bool(torch.allclose(got, want, atol=1e-5)),
        compiled_value=got[0].item(),
        compile_seconds=time.monotonic() - t0,
    )


def training() -> None:
    dist.init_process_group("ctran", timeout=timedelta(seconds=120))
    assert dist.get_backend() == "ctran"
    ddp_against_gloo()
    fsdp2_on_2x2_mesh()
    compiled_funcol()
    dist.destroy_process_group()
    result(clean_exit=True)


# --------------------------------------------------------------------------- upstream's surface


def upstream() -> None:
    """Code written for upstream torchcomms, unchanged: ``torchcomms.device_mesh.init_device_mesh``
    over communicators (DDP, FSDP2, DeviceMesh groups, tensor parallelism), a 2-D mesh from
    ``comm.split``, and ``pg.split_group`` with the backend's options."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torchcomms.device_mesh import init_device_mesh

    device = torch.device("cpu")
    comm = torchcomms.new_comm(
        "ctran", device, name="upstream_world", timeout=timedelta(seconds=120)
    )
    mesh = init_device_mesh(mesh_dim_comms=(comm,), mesh_dim_names=("main",))
    pg = mesh.get_group("main")
    assert pg.group_name == "main"
    t = torch.ones(10, dtype=torch.int32)
    dist.all_reduce(t, group=pg)
    assert t[0].item() == comm.get_size()

    # DDP (upstream's DDPCommTest): the loss moves.
    torch.manual_seed(42)
    model = DDP(nn.Sequential(*[nn.Linear(4, 4, bias=False) for _ in range(2)]), process_group=pg)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    inp = torch.randn(4, 4)
    losses = []
    for _ in range(10):
        loss = model(inp).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    ddp_moved = all(a != b for a, b in zip(losses[:5], losses[1:6]))

    # FSDP2 (upstream's FSDPCommTest): matches a local model step by step.
    torch.manual_seed(42)
    fmodel = nn.Sequential(*[nn.Linear(4, 4, bias=False) for _ in range(2)])
    ref = copy.deepcopy(fmodel)
    for layer in fmodel:
        fully_shard(layer, mesh=mesh)
    fully_shard(fmodel, mesh=mesh)
    fopt = torch.optim.Adam(fmodel.parameters(), lr=0.05)
    ropt = torch.optim.Adam(ref.parameters(), lr=0.05)
    fsdp_worst = 0.0
    for _ in range(10):
        loss, rloss = fmodel(inp).sum(), ref(inp).sum()
        fsdp_worst = max(fsdp_worst, abs(loss.item() - rloss.item()))
        loss.backward()
        rloss.backward()
        fopt.step()
        ropt.step()
        fopt.zero_grad()
        ropt.zero_grad()

    # Tensor parallelism (upstream's TPCommTest, shortened): colwise + rowwise MLP.
    torch.manual_seed(5)
    local = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 10))
    tp = parallelize_module(
        copy.deepcopy(local), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()}
    )
    lopt = torch.optim.SGD(local.parameters(), lr=8e-4)
    topt = torch.optim.SGD(tp.parameters(), lr=8e-4)
    tp_worst = 0.0
    for step in range(5):
        x = torch.rand(12, 10, generator=torch.Generator().manual_seed(step))
        out, tout = local(x), tp(x)
        if isinstance(tout, DTensor):
            tout = tout.redistribute(tout.device_mesh, [Replicate()]).to_local()
        tp_worst = max(tp_worst, abs(out.sum().item() - tout.sum().item()))
        out.sum().backward()
        tout.sum().backward()
        lopt.step()
        topt.step()
        lopt.zero_grad()
        topt.zero_grad()

    # A 2-D mesh from comm.split (upstream's DeviceMeshTest.test_2_d_parallel).
    two_d = {}
    if WORLD % 2 == 0:
        grid = torch.arange(WORLD).view(2, WORLD // 2)
        tp_ranks = next(r for r in grid.tolist() if RANK in r)
        dp_ranks = next(c for c in grid.t().tolist() if RANK in c)
        tp_comm = comm.split(tp_ranks, "tp")
        dp_comm = comm.split(dp_ranks, "dp")
        mesh2 = init_device_mesh(
            mesh_dim_comms=(dp_comm, tp_comm), mesh_dim_names=("dp", "tp"), _global_comm=comm
        )
        for dim, sub in (("dp", dp_comm), ("tp", tp_comm)):
            sub_mesh = mesh2[dim]
            g = sub_mesh.get_group()
            x = torch.ones(10, dtype=torch.int32)
            dist.all_reduce(x, group=g)
            two_d[dim] = [
                sub_mesh.get_rank() == RANK,
                sub_mesh.size() == sub.get_size(),
                g.group_name == dim,
                int(x[0].item()) == sub.get_size(),
                dist.distributed_c10d._get_group_tag(g) == f"ptd:{dim}",
            ]
        tp_comm.finalize()
        dp_comm.finalize()

    # pg.split_group with the backend's options (upstream's test_backend_wrapper_split_group).
    from torchcomms.device_mesh import _create_torchcomm_process_group

    base = _create_torchcomm_process_group(comm, "upstream_split_base")
    half = max(WORLD // 2, 1)
    mine = [r for r in range(WORLD) if r // half == RANK // half]
    split_pg = base.split_group(
        mine, group_name="split_test_group", opts=base._get_backend(device).options
    )
    x = torch.ones(10, dtype=torch.int32)
    dist.all_reduce(x, group=split_pg)
    split_ok = (
        split_pg.size() == len(mine)
        and split_pg.rank() == mine.index(RANK)
        and split_pg._get_backend(device).name() == "ctran"
        and int(x[0].item()) == len(mine)
    )
    split_pg._get_backend(device).get_comm().finalize()
    comm.finalize()
    result(
        ddp_moved=ddp_moved,
        fsdp_worst=fsdp_worst,
        tp_worst=tp_worst,
        two_d=two_d,
        split_ok=split_ok,
        clean_exit=True,
    )


def backend_paths() -> None:
    """The paths where torch's C++ ProcessGroup drives our ``_BackendWrapper`` (torch >= 2.14):
    a device map mixing ctran with another backend ("cpu:ctran,cuda:gloo"), then torch's own
    TorchComms path (``dist.config.use_torchcomms``, upstream's C10dTorchCommTest), where torch
    creates the communicators through ``new_comm`` and registers ``_BackendWrapper(comm)``. On
    torch 2.11 the mixed map must be refused with a ValueError saying why."""
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        WORLD,
        is_master=RANK == 0,
        timeout=timedelta(seconds=120),
    )
    if not _c10d.PYTHON_BACKENDS:
        try:
            dist.init_process_group(
                "cpu:ctran,cuda:gloo",
                store=dist.PrefixStore("mixed", store),
                rank=RANK,
                world_size=WORLD,
            )
            result(mixed_refused=False)
        except ValueError as e:
            result(mixed_refused="torch >= 2.14" in str(e) and f"rank {RANK}" in str(e), msg=str(e))
        result(skipped=f"torch {torch.__version__} has no Python c10d backends", clean_exit=True)
        return
    checks: dict[str, bool] = {}
    dist.init_process_group(
        "cpu:ctran,cuda:gloo",
        store=dist.PrefixStore("mixed", store),
        rank=RANK,
        world_size=WORLD,
        timeout=timedelta(seconds=120),
    )
    pg = dist.group.WORLD
    checks["mixed_plain_group"] = type(pg) is dist.ProcessGroup
    checks["mixed_wrapper"] = isinstance(
        pg._get_backend(torch.device("cpu")), torchcomms._BackendWrapper
    )
    t = torch.full((3,), float(RANK + 1))
    dist.all_reduce(t)
    checks["mixed_all_reduce"] = t.tolist() == [WORLD * (WORLD + 1) / 2] * 3
    fut = dist.all_reduce(torch.ones(2), async_op=True).get_future()
    checks["mixed_future"] = fut.wait()[0].tolist() == [float(WORLD)] * 2
    dist.destroy_process_group()

    dist.config.use_torchcomms = True
    dist.init_process_group(
        backend="ctran",
        store=dist.PrefixStore("tc", store),
        rank=RANK,
        world_size=WORLD,
        timeout=timedelta(seconds=120),
    )
    pg = dist.group.WORLD
    checks["tc_wrapper"] = isinstance(
        pg._get_backend(torch.device("cpu")), torchcomms._BackendWrapper
    )
    t = torch.tensor([RANK + 1.0])
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    checks["tc_avg"] = t.item() == sum(range(1, WORLD + 1)) / WORLD
    out = torch.empty(WORLD)
    dist.all_gather_into_tensor(out, torch.tensor([float(RANK)]))
    checks["tc_all_gather_into_tensor"] = out.tolist() == [float(r) for r in range(WORLD)]
    splits_in = [RANK + 1] * WORLD
    splits_out = [r + 1 for r in range(WORLD)]
    x = torch.cat([torch.full((RANK + 1,), float(RANK + d)) for d in range(WORLD)])
    y = torch.empty(sum(splits_out))
    dist.all_to_all_single(y, x, output_split_sizes=splits_out, input_split_sizes=splits_in)
    want = torch.cat([torch.full((r + 1,), float(r + RANK)) for r in range(WORLD)])
    checks["tc_all_to_all_single_splits"] = bool(torch.equal(y, want))
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    recv = torch.empty(2)
    ops = [
        dist.P2POp(dist.isend, torch.full((2,), float(RANK)), nxt),
        dist.P2POp(dist.irecv, recv, prv),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    checks["tc_batch_isend_irecv"] = recv.tolist() == [float(prv)] * 2
    dist.barrier()
    dist.destroy_process_group()
    result(checks=checks, clean_exit=True)


# --------------------------------------------------------------------------- failures


def killed() -> None:
    """The last rank dies (SIGKILL); the others' next operations through torch.distributed raise
    DistBackendError within the timeout: synchronous calls, ``wait()`` and futures."""
    timeout = 10.0
    dist.init_process_group("ctran", timeout=timedelta(seconds=timeout))
    t = torch.ones(1000)
    dist.all_reduce(t)
    dist.barrier()
    if RANK == WORLD - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1 << 16))
        result(raised=None)
    except Exception as e:
        result(
            raised=type(e).__name__,
            is_dist_backend_error=isinstance(e, dist.DistBackendError),
            msg=str(e),
            elapsed=time.monotonic() - t0,
            timeout=timeout,
        )
    try:
        dist.all_reduce(torch.ones(4), async_op=True).wait()
        result(later_wait=None)
    except Exception as e:
        result(later_wait=type(e).__name__, later_is_dist=isinstance(e, dist.DistBackendError))
    try:
        dist.all_reduce(torch.ones(4), async_op=True).get_future().wait()
        result(later_future=None)
    except Exception as e:
        result(later_future=type(e).__name__)
    os._exit(0)


def timeout() -> None:
    """Rank 1 stalls: rank 0's operation with a 2 s per-operation timeout (c10d options) raises
    DistBackendError (also a TimeoutError) after about 2 s; a group timeout set with
    ``_set_pg_timeout`` applies the same way."""
    dist.init_process_group("ctran", timeout=timedelta(seconds=60))
    pg = dist.group.WORLD
    dist.all_reduce(torch.ones(4))
    if RANK == 1:
        time.sleep(4)  # past rank 0's 2 s timeout
        os._exit(0)
    opts = dist.AllreduceOptions()
    opts.timeout = timedelta(seconds=2)
    t0 = time.monotonic()
    try:
        pg.allreduce([torch.ones(4)], opts).wait()
        result(raised=None)
    except Exception as e:
        result(
            raised=type(e).__name__,
            is_dist_backend_error=isinstance(e, dist.DistBackendError),
            is_timeout_error=isinstance(e, TimeoutError),
            msg=str(e),
            elapsed=time.monotonic() - t0,
        )
    os._exit(0)


if __name__ == "__main__":
    {
        "training": training,
        "upstream": upstream,
        "backend_paths": backend_paths,
        "killed": killed,
        "timeout": timeout,
    }[sys.argv[1]]()
