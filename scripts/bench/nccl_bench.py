"""torch.distributed + NCCL on GPUs, measured like torchcomms-perf (same sizes, same formulas).

One process per GPU under torchrun. For each op and size: warm-up iterations, a barrier, then
`-i` synchronous iterations on the current stream and one torch.cuda.synchronize(); the time is
the average per iteration of the slowest rank. Rank 0 prints rows and writes JSON rows with the
keys of torchcomms-perf --json: op, bytes, count, time_us, algbw_gbps, busbw_gbps, nranks.
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


def make(op: str, nbytes: int, n: int, dev):
    """Buffers for one op of `nbytes` (nccl-tests convention: the largest buffer)."""
    count = nbytes // 4
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count -= count % n
    big = torch.zeros(count, dtype=torch.float32, device=dev)
    part = torch.zeros(count // n, dtype=torch.float32, device=dev)
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
    p.add_argument("-e", type=int, default=1 << 30)
    p.add_argument("-f", type=int, default=2)
    p.add_argument("-w", type=int, default=5)
    p.add_argument("-i", type=int, default=20)
    p.add_argument("--op", default=",".join(OPS))
    p.add_argument("--json", required=True)
    a = p.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        v = torch.cuda.nccl.version()
        print(f"# torch {torch.__version__}, NCCL {'.'.join(map(str, v))}, {n} ranks, "
              f"{torch.cuda.get_device_name(dev)}", flush=True)
    rows = []
    for op in a.op.split(","):
        size = a.b
        while size <= a.e:
            count, run = make(op, size, n, dev)
            if count == 0:
                size *= a.f
                continue
            for _ in range(a.w):
                run()
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.i):
                run()
            torch.cuda.synchronize()
            dt = torch.tensor([(time.perf_counter() - t0) / a.i], dtype=torch.float64, device=dev)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            t = dt.item()
            nbytes = count * 4
            algbw = nbytes / t / 1e9
            rows.append(dict(op=op, bytes=nbytes, count=count, time_us=t * 1e6, algbw_gbps=algbw,
                             busbw_gbps=algbw * busbw_factor(op, n), nranks=n))
            if rank == 0:
                print(f"torch-nccl {op:15s} {nbytes:>11d} B {t * 1e6:10.1f} us "
                      f"{rows[-1]['busbw_gbps']:8.2f} GB/s", flush=True)
            size *= a.f
    if rank == 0:
        with open(a.json, "w") as fh:
            json.dump(rows, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
