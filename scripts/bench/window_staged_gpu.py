"""Puts into a CUDA window over host transports (the staged path: what a CUDA window uses across
hosts or with ranks sharing a GPU) against ctran's own send/recv of the same bytes over the
same transports, in one job::

    torchrun --nproc_per_node 2 scripts/bench/window_staged_gpu.py [--sizes 4K,1M,64M] [--iters 20]

Each row is a round trip: rank 0 puts and signals, rank 1 waits, puts back and signals, rank 0
waits; the send/recv row sends and receives the same bytes both ways. Times are medians over
blocks, each block synchronised on the GPU at its end. The communicator uses CTRAN_BACKENDS
socket,shm so the window is staged even where the GPUs share NVLink.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta

import torch

os.environ["CTRAN_BACKENDS"] = "socket,shm"
import torchcomms  # noqa: E402


def size_arg(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="4K,64K,1M,16M,64M")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--blocks", type=int, default=5)
    a = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert world == 2, "two ranks"
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    comm = torchcomms.new_comm("ctran", dev, "staged_bench", timeout=timedelta(seconds=120))
    peer = 1 - rank
    if rank == 0:
        print(f"| bytes | put+signal round trip (us) | send/recv round trip (us) | put / send | put GB/s |")
        print("|---|---|---|---|---|")
    for size in map(size_arg, a.sizes.split(",")):
        n = size // 4
        src = torch.full((n,), float(rank), device=dev)
        dst = torch.zeros(n, device=dev)
        buf = torch.zeros(n, device=dev)
        win = comm.new_window(buf)
        iters = max(3, a.iters if size <= (1 << 20) else a.iters // 4)

        def put_round() -> None:
            if rank == 0:
                win.put(src, peer, 0, False)
                win.signal(peer, False)
                win.wait_signal(peer, False)
            else:
                win.wait_signal(peer, False)
                win.put(src, peer, 0, False)
                win.signal(peer, False)

        def send_round() -> None:
            if rank == 0:
                comm.send(src, peer, False)
                comm.recv(dst, peer, False)
            else:
                comm.recv(dst, peer, False)
                comm.send(src, peer, False)

        times = {}
        for name, fn in (("put", put_round), ("send", send_round)):
            fn()
            torch.cuda.synchronize()
            comm.barrier(False)
            per = []
            for _ in range(a.blocks):
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                torch.cuda.synchronize()
                per.append((time.perf_counter() - t0) / iters * 1e6)
                comm.barrier(False)
            times[name] = statistics.median(per)
        torch.testing.assert_close(buf, torch.full((n,), float(peer), device=dev))
        torch.testing.assert_close(dst, torch.full((n,), float(peer), device=dev))
        win.tensor_deregister()
        if rank == 0:
            put, send = times["put"], times["send"]
            print(f"| {size} | {put:.1f} | {send:.1f} | {put / send:.2f} | {2 * size / put / 1e3:.2f} |")
    comm.finalize()


if __name__ == "__main__":
    main()
