"""MoE dispatch and combine latency: torchcomms' ``MoeBuffer`` against the same exchange
written with torch.distributed (counts by ``all_to_all_single``, a host synchronisation to size
the buffers, ``all_to_all_single`` with split sizes for the rows, indexing to group them by
expert, and the reverse for combine), in one run.

    torchrun --nproc_per_node 4 scripts/bench/moe_bench.py [--tokens 128] [--hidden 7168]
        [--experts 256] [--top-k 8] [--fp8] [--mode high_throughput] [--iters 20]
        [--peer gloo] [--device cpu] [--json OUT] [--profile N]

``--device cuda --peer nccl`` times CUDA tensors (each rank on ``cuda:LOCAL_RANK % count``;
``MoeBuffer`` runs its kernels, torch.distributed its NCCL exchange with the host
synchronisation), each iteration up to a device synchronize. Each iteration starts after a
barrier; the figure per way is the median over iterations of the slowest rank's time.

``--profile N`` (CUDA) then runs N more dispatches, and N combines, of ours under
torch.profiler; rank 0 prints each call's host time and each kernel's median duration: where
the time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

import torchcomms
from torchcomms.moe import MoeBuffer


def routing(rank: int, a: Any, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(a.tokens, a.hidden, generator=g).to(torch.bfloat16)
    idx = torch.rand(a.tokens, a.experts, generator=g).topk(a.top_k, dim=1).indices
    w = torch.rand(a.tokens, a.top_k, generator=g)
    return x.to(dev), idx.to(torch.int64).to(dev), w.to(dev)


def torch_dispatch(group: Any, world: int, rank: int, x, idx, w, experts: int):
    """The exchange in torch.distributed: counts, host sync, rows, grouping by expert."""
    local = experts // world
    dev = x.device
    dest = idx // local
    hit = torch.stack([(dest == r).any(dim=1) for r in range(world)])
    send = hit.sum(dim=1)
    recv = torch.empty(world, dtype=torch.int64, device=dev)
    dist.all_to_all_single(recv, send, group=group)
    ins, outs = send.tolist(), recv.tolist()  # the host synchronisation
    order = [torch.nonzero(hit[r]).flatten() for r in range(world)]
    sel = torch.cat(order)
    n = sum(outs)
    rx = torch.empty(n, x.shape[1], dtype=x.dtype, device=dev)
    dist.all_to_all_single(rx, x[sel], outs, ins, group=group)
    meta_in = torch.cat([idx[sel].float(), w[sel]], dim=1)  # ids are exact in float32
    meta = torch.empty(n, meta_in.shape[1], device=dev)
    dist.all_to_all_single(meta, meta_in, outs, ins, group=group)
    ridx = meta[:, : idx.shape[1]].to(torch.int64)
    groups = [torch.nonzero((ridx == rank * local + e).any(dim=1)).flatten() for e in range(local)]
    rows = torch.cat(groups)
    counts = torch.tensor([len(g) for g in groups], device=dev)
    state = (rows, counts, outs, ins, order, dest, ridx, w)
    return rx[rows], state


def torch_combine(group: Any, world: int, rank: int, y, state, experts: int):
    """Each (token, expert) row back to its rank, in (token, slot) order; weighted sums there."""
    rows, counts, outs, ins, order, dest, ridx, w = state
    dev = y.device
    local = experts // world
    e_of_row = torch.repeat_interleave(torch.arange(local, device=dev), counts)
    k_of_row = (ridx[rows] == (rank * local + e_of_row)[:, None]).float().argmax(dim=1)
    by_source = torch.argsort(rows * ridx.shape[1] + k_of_row)
    bounds = torch.tensor(outs, device=dev).cumsum(0)
    back_in = torch.bucketize(rows, bounds, right=True).bincount(minlength=world).tolist()
    send = y[by_source]
    # What comes back from rank r: its rows of this rank's tokens routed there, (token, slot).
    pairs = [torch.nonzero(dest[o] == r) for r, o in enumerate(order)]
    back_out = [len(p) for p in pairs]
    back = torch.empty(sum(back_out), y.shape[1], dtype=y.dtype, device=dev)
    dist.all_to_all_single(back, send, back_out, back_in, group=group)
    tok = torch.cat([o[p[:, 0]] for o, p in zip(order, pairs)])
    slot = torch.cat([p[:, 1] for p in pairs])
    out = torch.zeros(dest.shape[0], y.shape[1], device=dev)
    out.index_add_(0, tok, back.float() * w[tok, slot][:, None])
    return out.to(torch.bfloat16)


def timed(fn: Callable[[], Any], barrier: Callable[[], None], iters: int, cuda: bool) -> list[float]:
    out = []
    for _ in range(iters):
        barrier()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def profile_kernels(
    label: str, step: Callable[[], Any], barrier: Callable[[], None], iters: int, rank: int
) -> None:
    """Rank 0 prints, over `iters` profiled calls of `step` (each after a barrier), the median
    host time of the call, its time to a device synchronize, and each kernel's median
    duration."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    host, wall = [], []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            host.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
            wall.append((time.perf_counter() - t0) * 1e6)
    barrier()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    issued = (time.perf_counter() - t0) * 1e6 / iters
    torch.cuda.synchronize()
    back_to_back = (time.perf_counter() - t0) * 1e6 / iters
    if rank != 0:
        return
    print(f"{label}: {iters} calls back to back, unprofiled: {issued:.1f} us per call to issue, "
          f"{back_to_back:.1f} us per call to a synchronize")
    spans: dict[str, list[float]] = {}
    api: dict[str, float] = {}
    moe: list[tuple[float, float]] = []
    for e in prof.events():
        d = e.time_range.end - e.time_range.start
        if e.device_type == DeviceType.CUDA:
            spans.setdefault(e.name, []).append(d)
            if e.name.startswith("moe_"):
                moe.append((e.time_range.start, e.time_range.end))
        elif e.name.startswith("cu"):
            api[e.name] = api.get(e.name, 0.0) + d
    # The device span of a call: its first kernel's start to its last kernel's end (kernel
    # time, the way DeepEP's and pplx-garden's figures are taken).
    moe.sort()
    per = len(moe) // iters if iters else 0
    device = [moe[i + per - 1][1] - moe[i][0] for i in range(0, per * iters, per)] if per else [0.0]
    print(f"{label} on rank 0, {iters} profiled calls: host {statistics.median(host):.1f} us, "
          f"to a synchronize {statistics.median(wall):.1f} us, on the device (first kernel's "
          f"start to last kernel's end) {statistics.median(device):.1f} us; kernels (median us, "
          f"count):")
    for name, d in sorted(spans.items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"  {name[:56]:56s} {statistics.median(d):9.1f} {len(d):6d}")
    print("  CUDA API calls on the host (us per call of the step):")
    for name, total in sorted(api.items(), key=lambda kv: -kv[1])[:8]:
        print(f"    {name[:54]:54s} {total / iters:9.1f}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--fp8", action="store_true")
    p.add_argument("--mode", default="high_throughput")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--peer", default="gloo")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--json", default=None)
    p.add_argument("--profile", type=int, default=0)
    a = p.parse_args()

    cuda = a.device == "cuda"
    if cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        dev = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    dist.init_process_group(a.peer)
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = torchcomms.new_comm("ctran", dev, name="moe_bench")
    buf = MoeBuffer(comm, a.experts, a.hidden, a.tokens, a.top_k, mode=a.mode)
    x, idx, w = routing(rank, a, dev)
    group = dist.group.WORLD

    def ours_dispatch() -> Any:
        return buf.dispatch(x, idx, w, use_fp8=a.fp8)

    d = ours_dispatch()
    y_ours = (d[0].float() * (d[1][..., None] if a.fp8 else 1.0)).to(torch.bfloat16)
    state: dict[str, Any] = {}

    def theirs_dispatch() -> Any:
        state["d"] = torch_dispatch(group, world, rank, x, idx, w, a.experts)

    theirs_dispatch()
    y_theirs = state["d"][0]
    if not a.fp8:
        # Both ways agree (identity experts; rounding differs: torch sums in another order).
        ours = buf.combine(d[0].contiguous(), d[4]).float()
        theirs = torch_combine(group, world, rank, y_theirs, state["d"][1], a.experts).float()
        if not torch.allclose(ours, theirs, rtol=2e-2, atol=5e-2):
            raise SystemExit(f"rank {rank}: combine differs from torch.distributed's")
    barrier = lambda: dist.barrier(group=group)  # noqa: E731
    # Combine answers the latest dispatch: time it after one.
    d = ours_dispatch()
    y_ours = (d[0].float() * (d[1][..., None] if a.fp8 else 1.0)).to(torch.bfloat16)
    res = {
        "ours_combine": timed(lambda: buf.combine(y_ours, d[4]), barrier, a.iters, cuda),
        "torch_dispatch": timed(theirs_dispatch, barrier, a.iters, cuda),
        "torch_combine": timed(
            lambda: torch_combine(group, world, rank, y_theirs, state["d"][1], a.experts),
            barrier,
            a.iters,
            cuda,
        ),
        "ours_dispatch": timed(ours_dispatch, barrier, a.iters, cuda),
    }
    if cuda:
        buf.check()
    # The slowest rank's time per iteration.
    slowest = {}
    for k, v in res.items():
        t = torch.tensor(v, dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        slowest[k] = statistics.median(t.tolist())
    if rank == 0:
        print(
            f"MoE on {world} {a.device} ranks ({'mapped' if buf.is_mapped else 'staged'} on ours): {a.tokens} tokens/rank, hidden {a.hidden}, "
            f"top-{a.top_k} of {a.experts}, dispatch {'fp8' if a.fp8 else 'bf16'}, {a.mode}; "
            f"median of {a.iters} (slowest rank), torch.distributed on {a.peer}"
        )
        for op in ("dispatch", "combine"):
            o, t = slowest[f"ours_{op}"], slowest[f"torch_{op}"]
            print(f"  {op:8s} torchcomms {o:10.1f} us   torch.distributed {t:10.1f} us   {t / o:5.2f}x")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"args": vars(a), "world": world, "median_us": slowest}, f, indent=1)
    if cuda and a.profile:
        profile_kernels("dispatch", ours_dispatch, barrier, a.profile, rank)
        d = ours_dispatch()
        profile_kernels("combine", lambda: buf.combine(y_ours, d[4]), barrier, a.profile, rank)
    comm.finalize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
