"""All-reduce with torchcomms on the ctran engine.

    pip install ./bindings/python
    torchrun --nproc_per_node 4 examples/python/allreduce.py

Every rank contributes a tensor of its rank + 1; after the SUM all-reduce every rank holds
1 + 2 + ... + size. The async variant overlaps the collective with local work.
"""

from datetime import timedelta

import torch

import torchcomms
from torchcomms import ReduceOp


def main() -> None:
    # Rank and size come from torchrun's environment, the store from MASTER_ADDR/MASTER_PORT.
    comm = torchcomms.new_comm("ctran", torch.device("cpu"), name="example", timeout=timedelta(seconds=60))
    rank, size = comm.get_rank(), comm.get_size()
    expected = size * (size + 1) / 2

    # Synchronous: returns when the result is in place.
    t = torch.full((1 << 20,), float(rank + 1))
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert torch.all(t == expected), t

    # Asynchronous: wait() before using the tensor.
    t = torch.full((1 << 20,), float(rank + 1), dtype=torch.bfloat16)
    work = comm.all_reduce(t, ReduceOp.SUM, async_op=True)
    local = torch.randn(256, 256) @ torch.randn(256, 256)  # overlaps with the collective
    work.wait()
    assert torch.all(t == expected), t

    print(f"rank {rank}/{size}: all_reduce ok ({expected:g} everywhere), local work {local.shape}")
    comm.finalize()


if __name__ == "__main__":
    main()
