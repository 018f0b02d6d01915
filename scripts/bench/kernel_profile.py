"""Where the device time of a small collective goes: per-kernel durations and the gaps between
one operation's kernels and the next, from torch.profiler (CUPTI sees every kernel of the
process, also those our engine launches through the driver API).

Run under torchrun, one process per GPU; rank 0 prints, per kernel name, how many ran, their
mean and median duration, and the median period (start to start) and gap (end to next start)
of consecutive kernels of that name:

    torchrun --standalone --nproc_per_node 2 scripts/bench/kernel_profile.py \
        --backend ctran --op all_reduce --bytes 8192 -i 200

--backend torch profiles torch.distributed with NCCL on the same loop (the peer of the
benchmarks); ctran and nccl go through the torchcomms wheel. The loop is the benchmarks':
synchronous operations back to back on the current stream, one synchronize at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict
from datetime import timedelta

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="ctran", choices=["ctran", "nccl", "torch"])
    ap.add_argument("--op", default="all_reduce", choices=["all_reduce", "all_gather", "reduce_scatter"])
    ap.add_argument("--bytes", type=int, default=8192)
    ap.add_argument("-w", type=int, default=50, help="warm-up iterations")
    ap.add_argument("-i", type=int, default=200, help="profiled iterations")
    a = ap.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    n = max(1, a.bytes // 4)
    if a.backend == "torch":
        import torch.distributed as dist

        dist.init_process_group("nccl", device_id=dev)
        sum_op = dist.ReduceOp.SUM

        def all_reduce(t):
            dist.all_reduce(t, sum_op)

        def all_gather(out, inp):
            dist.all_gather_into_tensor(out, inp)

        def reduce_scatter(out, inp):
            dist.reduce_scatter_tensor(out, inp, sum_op)

        finish = dist.destroy_process_group
    else:
        import torchcomms

        comm = torchcomms.new_comm(a.backend, dev, "profile", timeout=timedelta(seconds=60))
        sum_op = torchcomms.ReduceOp.SUM

        def all_reduce(t):
            comm.all_reduce(t, sum_op, async_op=False)

        def all_gather(out, inp):
            comm.all_gather_single(out, inp, async_op=False)

        def reduce_scatter(out, inp):
            comm.reduce_scatter_single(out, inp, sum_op, async_op=False)

        finish = comm.finalize

    big = torch.ones(n * world, dtype=torch.float32, device=dev)
    small = torch.ones(n, dtype=torch.float32, device=dev)
    step = {
        "all_reduce": lambda: all_reduce(small),
        "all_gather": lambda: all_gather(big, small),
        "reduce_scatter": lambda: reduce_scatter(small, big),
    }[a.op]
    for _ in range(a.w):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(a.i):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / a.i
    if rank == 0:
        spans = defaultdict(list)
        for e in prof.events():
            if e.device_type == DeviceType.CUDA:
                spans[e.name].append((e.time_range.start, e.time_range.end))
        print(f"# {a.backend} {a.op} {a.bytes} B x {a.i}: {wall * 1e6:.2f} us per iteration (wall, profiled)")
        for name, s in sorted(spans.items(), key=lambda kv: -len(kv[1])):
            s.sort()
            dur = [e - b for b, e in s]
            period = [s[k + 1][0] - s[k][0] for k in range(len(s) - 1)] or [0.0]
            gap = [s[k + 1][0] - s[k][1] for k in range(len(s) - 1)] or [0.0]
            print(f"{name[:60]:60s} n={len(s):5d} mean={statistics.mean(dur):7.2f} "
                  f"median={statistics.median(dur):7.2f} period={statistics.median(period):7.2f} "
                  f"gap={statistics.median(gap):7.2f} us")
    finish()


if __name__ == "__main__":
    main()
