"""Host cost of a small all_reduce issued from Python, to compare with the same operation from
Rust (`torchcomms-perf --op all_reduce -b 8 -e 8 -c 0`, same ranks, same device).

    torchrun --standalone --nproc_per_node N scripts/bench/host_cost.py [--device cpu|cuda]
        [--numel 2] [--iters 20000] [--blocks 7]

Times `comm.all_reduce(t, SUM, async_op=False)` and `comm.all_reduce(t, SUM, True).wait()`
back to back; rank 0 prints the median over blocks of the time per call. On CUDA a block ends
with a device synchronize, so a call's time is what the host spends issuing it when the GPU
keeps up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torchcomms


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--numel", type=int, default=2)
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--blocks", type=int, default=7)
    a = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    if a.device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    comm = torchcomms.new_comm("ctran", dev, name="host_cost")
    t = torch.ones(a.numel, dtype=torch.float32, device=dev)
    s = torchcomms.ReduceOp.SUM
    ways = {
        "sync": lambda: comm.all_reduce(t, s, False),
        "async+wait": lambda: comm.all_reduce(t, s, True).wait(),
    }
    for name, call in ways.items():
        for _ in range(a.iters // 10):
            call()
        blocks = []
        for _ in range(a.blocks):
            comm.barrier(False)
            sync()
            t0 = time.perf_counter()
            for _ in range(a.iters):
                call()
            sync()
            blocks.append((time.perf_counter() - t0) / a.iters * 1e6)
        if rank == 0:
            print(f"python {a.device} all_reduce {a.numel * 4} B {name}: "
                  f"{statistics.median(blocks):.2f} us per call "
                  f"(blocks {min(blocks):.2f}-{max(blocks):.2f})", flush=True)
    comm.finalize()


if __name__ == "__main__":
    main()
