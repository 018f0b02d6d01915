"""DistributedDataParallel on torchcomms: torch.distributed's "ctran" backend.

    pip install ./bindings/python
    torchrun --nproc_per_node 4 examples/python/ddp.py          # CPU (or one GPU per rank)

`import torchcomms` (or torch's backend entry points) registers the c10d backend "ctran":
`init_process_group(backend="ctran")` runs every collective of the group, DDP's gradient
all-reduces included, on the ctran engine. With GPUs, pass `device_id` so the group's CUDA
communicator is created at once on this rank's GPU.
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import torchcomms  # noqa: F401  (registers the "ctran" backend with torch.distributed)


def main() -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("ctran", device_id=device, timeout=timedelta(seconds=120))
    else:
        device = torch.device("cpu")
        dist.init_process_group("ctran", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts rank 0's)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)

    # A learnable task; each rank trains on its own shard of the data.
    teacher = (torch.randn(64, 10, generator=torch.Generator().manual_seed(1)) / 8).to(device)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(30):
        x = torch.randn(32, 64, generator=g).to(device)
        loss = nn.functional.mse_loss(ddp(x), x @ teacher)
        opt.zero_grad()
        loss.backward()  # gradients are averaged across ranks on ctran, overlapped with backward
        opt.step()
        if rank == 0 and step % 10 == 9:
            print(f"step {step + 1}: loss {loss.item():.4f}")

    # Every rank holds the same parameters.
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    first = flat.clone()
    dist.broadcast(first, src=0)
    assert torch.equal(flat, first), "replicas diverged"
    if rank == 0:
        print(f"DDP on {world} ranks over torchcomms ({dist.get_backend()}, {device.type}): ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
