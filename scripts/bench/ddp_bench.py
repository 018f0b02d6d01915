"""A DDP training step on torchcomms against torch's own NCCL process group, in one run.

    torchrun --nproc_per_node 4 scripts/bench/ddp_bench.py [--backend ctran] [--params 100e6]
        [--batch 512] [--steps 20] [--warmup 5] [--rounds 3] [--bucket-mb 25] [--json OUT]

One process per GPU. The default group runs on the torchcomms c10d backend (``ctran``: our engine,
NVLink between the GPUs of a host; ``tc_nccl``: torchcomms' vendor NCCL backend); a second group
over the same ranks runs on torch's ProcessGroupNCCL. Two copies of one model (an MLP of
``hidden x hidden`` layers with at least ``--params`` parameters, fp32) train side by side under
DDP, one per group, on the same data: forward, backward (DDP's bucketed all-reduces overlap it),
SGD step. Each round times ``--steps`` steps of one, then of the other (alternating which goes
first), with a CUDA synchronize at both ends; the time of a step is the slowest rank's. Rank 0
prints ms per step per round, the medians and the ratio (ours / NCCL: below 1 is faster), and
the largest difference between the two models' parameters at the end (the same training, so it
stays at rounding level).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import torchcomms  # noqa: F401  (registers the c10d backends)


def model(params: float, hidden: int, device: torch.device) -> nn.Module:
    per_layer = hidden * hidden + hidden
    layers = max(1, -(-int(params) // per_layer))
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden), nn.GELU()]
    return nn.Sequential(*mods).to(device)


def timed_steps(ddp: DDP, opt: torch.optim.Optimizer, xs: list, ys: list, steps: int) -> float:
    """Seconds per step of the slowest rank."""
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(steps):
        x, y = xs[i % len(xs)], ys[i % len(ys)]
        opt.zero_grad(set_to_none=False)
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    torch.cuda.synchronize()
    dt = torch.tensor([(time.perf_counter() - t0) / steps], device=xs[0].device)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return float(dt.item())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="ctran", choices=["ctran", "tc_nccl"])
    p.add_argument("--params", type=float, default=100e6)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bucket-mb", type=float, default=25)
    p.add_argument("--json", default=None)
    a = p.parse_args()

    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group(a.backend, device_id=dev, timeout=timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    nccl = dist.new_group(backend="nccl")

    base = model(a.params, a.hidden, dev)
    n_params = sum(p.numel() for p in base.parameters())
    replicas = {
        a.backend: DDP(base, device_ids=[local], bucket_cap_mb=a.bucket_mb),
        "torch-nccl": DDP(
            model(a.params, a.hidden, dev),
            device_ids=[local],
            bucket_cap_mb=a.bucket_mb,
            process_group=nccl,
        ),
    }
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-4) for k, m in replicas.items()}
    g = torch.Generator(device=dev).manual_seed(1 + rank)
    xs = [torch.randn(a.batch, a.hidden, device=dev, generator=g) for _ in range(4)]
    ys = [torch.randn(a.batch, a.hidden, device=dev, generator=g) for _ in range(4)]

    for k, m in replicas.items():
        timed_steps(m, opts[k], xs, ys, a.warmup)
    times: dict[str, list[float]] = {k: [] for k in replicas}
    names = list(replicas)
    for r in range(a.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for k in order:
            times[k].append(timed_steps(replicas[k], opts[k], xs, ys, a.steps) * 1e3)
        if rank == 0:
            print(
                f"round {r + 1}: " + ", ".join(f"{k} {times[k][-1]:.2f} ms/step" for k in names),
                flush=True,
            )

    # Both replicas saw the same data and steps: their parameters agree to rounding.
    diff = max(
        (p - q).abs().max().item()
        for p, q in zip(replicas[names[0]].parameters(), replicas[names[1]].parameters())
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    row = {
        "ranks": world,
        "backend": a.backend,
        "params": n_params,
        "batch": a.batch,
        "hidden": a.hidden,
        "bucket_mb": a.bucket_mb,
        "steps": a.steps,
        "rounds": a.rounds,
        "ms_per_step": times,
        "median_ms": med,
        "ratio": med[a.backend] / med["torch-nccl"],
        "param_max_diff": diff,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(dev),
    }
    if rank == 0:
        print(
            f"DDP step, {n_params / 1e6:.1f}M params, {world} GPUs: {a.backend} "
            f"{med[a.backend]:.2f} ms, torch+NCCL {med['torch-nccl']:.2f} ms, ratio "
            f"{row['ratio']:.3f} (< 1: ours faster); parameters differ by at most {diff:.2e}",
            flush=True,
        )
        if a.json:
            with open(a.json, "w") as f:
                json.dump(row, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
