"""Gloo through torch.distributed, measured like torchcomms-perf (same sizes, same formulas).

Run under torchrun; rank 0 writes JSON rows: op, bytes, time_us, algbw_gbps, busbw_gbps, nranks.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]


def busbw_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def paired_calls(big, part, out, comm) -> dict:
    """Per op, (torch.distributed call, the same call on torchcomms `comm`) on the same
    tensors: `big` (the largest buffer), `part` (a rank's share of it), `out` (like `big`).
    The scripts that time both stacks in one Python loop share it."""
    import torchcomms

    s = torchcomms.ReduceOp.SUM
    return {
        "all_reduce": (lambda: dist.all_reduce(big), lambda: comm.all_reduce(big, s, False)),
        "broadcast": (lambda: dist.broadcast(big, 0), lambda: comm.broadcast(big, 0, False)),
        "all_gather": (
            lambda: dist.all_gather_into_tensor(big, part),
            lambda: comm.all_gather_single(big, part, False),
        ),
        "reduce_scatter": (
            lambda: dist.reduce_scatter_tensor(part, big),
            lambda: comm.reduce_scatter_single(part, big, s, False),
        ),
        "all_to_all": (
            lambda: dist.all_to_all_single(out, big),
            lambda: comm.all_to_all_single(out, big, False),
        ),
    }


def make(op: str, nbytes: int, n: int, rank: int):
    """Buffers for one op of `nbytes` (nccl-tests convention: the largest buffer)."""
    count = nbytes // 4
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count -= count % n
    big = torch.ones(count, dtype=torch.float32)
    part = torch.ones(count // n, dtype=torch.float32)
    if op == "all_reduce":
        return count, lambda: dist.all_reduce(big)
    if op == "broadcast":
        return count, lambda: dist.broadcast(big, 0)
    if op == "all_gather":
        return count, lambda: dist.all_gather_into_tensor(big, part)
    if op == "reduce_scatter":
        return count, lambda: dist.reduce_scatter_tensor(part, big)
    out = torch.empty_like(big)
    return count, lambda: dist.all_to_all_single(out, big)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-b", type=int, default=8)
    p.add_argument("-e", type=int, default=64 << 20)
    p.add_argument("-f", type=int, default=2)
    p.add_argument("-w", type=int, default=3)
    p.add_argument("-i", type=int, default=10)
    p.add_argument("--op", default=",".join(OPS))
    p.add_argument("--json", required=True)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    rows = []
    for op in a.op.split(","):
        size = a.b
        while size <= a.e:
            count, run = make(op, size, n, rank)
            if count == 0:
                size *= a.f
                continue
            for _ in range(a.w):
                run()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(a.i):
                run()
            dt = torch.tensor([(time.perf_counter() - t0) / a.i], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            t = dt.item()
            nbytes = count * 4
            algbw = nbytes / t / 1e9
            rows.append(dict(op=op, bytes=nbytes, count=count, time_us=t * 1e6, algbw_gbps=algbw,
                             busbw_gbps=algbw * busbw_factor(op, n), nranks=n))
            if rank == 0:
                print(f"gloo {op:15s} {nbytes:>10d} B {t * 1e6:10.1f} us {rows[-1]['busbw_gbps']:7.3f} GB/s", flush=True)
            size *= a.f
    if rank == 0:
        with open(a.json, "w") as fh:
            json.dump(rows, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
