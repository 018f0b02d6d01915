"""CPU window put bandwidth by size against one core's memcpy, in one run::

    torchrun --nproc_per_node 2 scripts/bench/window_put_cpu.py

Rank 0 puts a float tensor of 1, 16 and 64 MiB into rank 1's window (a synchronous
``win.put``: cross-memory attach between ranks of one host), then copies the same bytes with
``dst.copy_(src)`` on one thread; 7 repetitions each, the first 2 dropped; prints the best and
median bandwidths and their ratio (put / memcpy).
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta

import torch

import torchcomms


def main() -> None:
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    comm = torchcomms.new_comm(
        "ctran", torch.device("cpu"), "window_put_cpu", timeout=timedelta(seconds=120)
    )
    for mib in [1, 16, 64]:
        n = mib * (1 << 20) // 4
        win = comm.new_window(torch.zeros(n))
        src = torch.ones(n)
        puts, copies = [], []
        for _ in range(7):
            comm.barrier(False)
            if rank == 0:
                t0 = time.perf_counter()
                win.put(src, 1, 0, False)
                puts.append(time.perf_counter() - t0)
                dst = torch.zeros(n)  # touched: the copy measures no page faults
                t0 = time.perf_counter()
                dst.copy_(src)
                copies.append(time.perf_counter() - t0)
            comm.barrier(False)
        if rank == 0:
            gib = mib / 1024
            p, c = min(puts[2:]), min(copies[2:])
            pm, cm = statistics.median(puts[2:]), statistics.median(copies[2:])
            print(
                f"put {mib} MiB: put {gib / p:.2f} GiB/s (median {gib / pm:.2f}), memcpy "
                f"{gib / c:.2f} GiB/s (median {gib / cm:.2f}); put/memcpy best {c / p:.3f} "
                f"median {cm / pm:.3f}",
                flush=True,
            )
        comm.barrier(False)
        win.tensor_deregister()
    comm.finalize()


if __name__ == "__main__":
    main()
