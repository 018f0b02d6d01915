"""Host cost of a small all_reduce through torch.distributed on a torchcomms c10d backend, over
the same call on the communicator directly.

    torchrun --nproc_per_node 2 scripts/bench/c10d_overhead.py [--device cpu|cuda]
        [--backend ctran] [--numel 8] [--iters 200] [--rounds 30] [--json OUT]

Three ways to issue the same operation on the same communicator (the group's own):
``comm.all_reduce(t, SUM, async_op=False)`` (direct), ``dist.all_reduce(t)`` (sync) and
``dist.all_reduce(t, async_op=True).wait()`` (async). Each round times ``--iters`` issues of each,
in rotating order, and the result per way is the median over rounds of the host time per call.
On CUDA a round times only the issuing (the device work is synchronized outside the timed
part), so it measures the host. On the CPU the time includes the operation itself; the
difference between the ways is still the extra host cost.

Before that, on rank 0 alone: the same three ways on upstream's ``fake`` backend (every
operation a completed no-op), which isolates the host cost of each layer from any engine, and
``dist.all_reduce`` on a group that does nothing (torch.distributed's own Python layer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

import torchcomms
from torchcomms import ReduceOp


def per_call_us(fn: Callable[[], object], iters: int, sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = time.perf_counter() - t0
    sync()
    return dt / iters * 1e6


def measure(ways: dict, iters: int, rounds: int, sync: Callable[[], None]) -> dict:
    """{way: {"median": us, "min": us}} over ``rounds`` rounds (the minimum is the round least
    disturbed by other processes)."""
    for fn in ways.values():  # warm-up
        for _ in range(max(iters // 4, 10)):
            fn()
    sync()
    samples: dict[str, list[float]] = {k: [] for k in ways}
    names = list(ways)
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            samples[k].append(per_call_us(ways[k], iters, sync))
    return {k: {"median": statistics.median(v), "min": min(v)} for k, v in samples.items()}


class _NullGroup(torch._C._distributed_c10d.ProcessGroup):  # type: ignore[misc]
    """A process group whose all_reduce does nothing: what torch.distributed's own Python layer
    costs, for comparison."""

    def __init__(self) -> None:
        super().__init__(0, 1)
        self._done = _DoneWork()

    def allreduce(self, tensors, opts=None):  # type: ignore[no-untyped-def]
        return self._done

    def getBackendName(self) -> str:  # noqa: N802
        return "null"


class _DoneWork(torch._C._distributed_c10d.Work):  # type: ignore[misc]
    def wait(self, timeout=None):  # type: ignore[no-untyped-def]
        return True


def fake_backend(iters: int, rounds: int) -> dict:
    """The layers alone: upstream's fake backend (no engine), in a group of this process only."""
    from torchcomms.device_mesh import _create_torchcomm_process_group

    comm = torchcomms.new_comm("fake", torch.device("cpu"), name="overhead_fake")
    pg = _create_torchcomm_process_group(comm, "overhead_fake")
    null = _NullGroup()
    t = torch.ones(8)
    res = measure(
        {
            "direct": lambda: comm.all_reduce(t, ReduceOp.SUM, False),
            "dist_sync": lambda: dist.all_reduce(t, group=pg),
            "dist_async_wait": lambda: dist.all_reduce(t, group=pg, async_op=True).wait(),
            "torch_layer_only": lambda: dist.all_reduce(t, group=null),
        },
        iters * 5,
        rounds,
        lambda: None,
    )
    comm.finalize()
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backend", default="ctran", choices=["ctran", "tc_nccl"])
    p.add_argument("--numel", type=int, default=8)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--json", default=None)
    a = p.parse_args()

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if a.device == "cuda":
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
        dist.init_process_group(a.backend, device_id=dev, timeout=timedelta(seconds=300))
        sync: Callable[[], None] = torch.cuda.synchronize
    else:
        dev = torch.device("cpu")
        dist.init_process_group(a.backend, timeout=timedelta(seconds=300))
        sync = lambda: None  # noqa: E731
    rank, world = dist.get_rank(), dist.get_world_size()
    # Rank 0 alone (the others wait in a barrier), so the ranks do not share the cores.
    fake = fake_backend(a.iters, a.rounds) if rank == 0 else {}
    dist.barrier()

    pg = dist.group.WORLD
    comm = pg._get_backend(dev).get_comm()
    t = torch.ones(a.numel, device=dev)
    ways = {
        "direct": lambda: comm.all_reduce(t, ReduceOp.SUM, False),
        "dist_sync": lambda: dist.all_reduce(t),
        "dist_async_wait": lambda: dist.all_reduce(t, async_op=True).wait(),
    }
    real = measure(ways, a.iters, a.rounds, sync)
    extra = {
        name: {
            way: {stat: r[way][stat] - r["direct"][stat] for stat in ("median", "min")}
            for way in ("dist_sync", "dist_async_wait")
        }
        for name, r in (("fake", fake), ("real", real))
        if r
    }
    row = {
        "device": a.device,
        "backend": a.backend,
        "ranks": world,
        "numel": a.numel,
        "iters": a.iters,
        "rounds": a.rounds,
        "fake_us": fake,
        "real_us": real,
        "extra_us": extra,
        "torch": torch.__version__,
    }
    if rank == 0:
        print(
            f"host us per all_reduce of {a.numel} elements: median (min) of {a.rounds} rounds of {a.iters} calls"
        )
        ways = ["direct", "dist_sync", "dist_async_wait", "torch_layer_only"]
        print(f"{'':30s}" + "".join(f"{w:>22s}" for w in ways))
        for name, r in (
            ("fake backend (layers only)", fake),
            (f"{a.backend} on {a.device}, {world} ranks", real),
        ):
            cells = [f"{r[w]['median']:.2f} ({r[w]['min']:.2f})" if w in r else "-" for w in ways]
            print(f"{name:30s}" + "".join(f"{c:>22s}" for c in cells))
        for name in ("fake", "real"):
            e = extra[name]
            print(
                f"extra over direct ({name}): dist sync {e['dist_sync']['median']:+.2f} us "
                f"(min {e['dist_sync']['min']:+.2f}), async+wait {e['dist_async_wait']['median']:+.2f} us "
                f"(min {e['dist_async_wait']['min']:+.2f})"
            )
        print(
            f"of which torch.distributed's own layer (a group that does nothing): "
            f"{fake['torch_layer_only']['median']:.2f} us (min {fake['torch_layer_only']['min']:.2f})"
        )
        if a.json:
            with open(a.json, "w") as f:
                json.dump(row, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
