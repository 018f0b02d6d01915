"""Copy-engine bandwidth between GPU 0 and GPU 1: one way, and both ways at once.

One process, two GPUs: torch copies a tensor across devices with the driver's peer copy (copy
engines). What the pipelined all_reduce of ctran's NVLink transport can reach is bounded by the
"both ways" column (docs/perf/gpu.md). Run on a machine with two GPUs that reach each other::

    python3 scripts/bench/ce_bandwidth.py
"""

import time

import torch


def bandwidth(nbytes: int, both_ways: bool, iters: int = 20) -> float:
    """GB/s per direction of copies of `nbytes` from GPU 0 to GPU 1 (and back, if asked)."""
    a = [torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{d}") for d in (0, 1)]
    b = [torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{d}") for d in (0, 1)]
    src = [torch.cuda.Stream(device=d) for d in (0, 1)]
    # torch orders a cross-device copy after the destination's current stream: make that an
    # idle stream, so the two directions do not wait for each other.
    idle = [torch.cuda.Stream(device=d) for d in (0, 1)]

    def once() -> None:
        for d in (0, 1) if both_ways else (0,):
            with torch.cuda.stream(src[d]), torch.cuda.stream(idle[1 - d]):
                b[1 - d].copy_(a[d], non_blocking=True)

    for _ in range(3):
        once()
    for d in (0, 1):
        torch.cuda.synchronize(d)
    start = time.perf_counter()
    for _ in range(iters):
        once()
    for d in (0, 1):
        torch.cuda.synchronize(d)
    return nbytes * iters / (time.perf_counter() - start) / 1e9


def main() -> None:
    if torch.cuda.device_count() < 2 or not torch.cuda.can_device_access_peer(0, 1):
        raise SystemExit("needs two GPUs that reach each other")
    print("| size | one way GB/s | both ways GB/s per direction |")
    print("|---:|---:|---:|")
    for nbytes in (64 << 20, 256 << 20, 1 << 30):
        one, both = bandwidth(nbytes, False), bandwidth(nbytes, True)
        print(f"| {nbytes >> 20} MB | {one:.1f} | {both:.1f} |")


if __name__ == "__main__":
    main()
