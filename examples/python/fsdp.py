"""FSDP2 (`fully_shard`) on torchcomms: a DeviceMesh whose groups run on the "ctran" backend.

    pip install ./bindings/python
    torchrun --nproc_per_node 4 examples/python/fsdp.py         # CPU (or one GPU per rank)

With 4 ranks the mesh is 2 x 2 (replicate x shard, HSDP): parameters are sharded over one
dimension and replicated over the other; every all-gather and reduce-scatter runs on ctran.
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

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
    shape = (2, world // 2) if world % 2 == 0 and world >= 4 else (world,)
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    ).to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    teacher = (torch.randn(64, 10, generator=torch.Generator().manual_seed(1)) / 8).to(device)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(30):
        x = torch.randn(32, 64, generator=g).to(device)
        loss = nn.functional.mse_loss(model(x), x @ teacher)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 9:
            print(f"step {step + 1}: loss {loss.item():.4f}")

    local = sum(p.to_local().numel() for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(
            f"FSDP2 on a {' x '.join(map(str, shape))} DeviceMesh ({', '.join(names)}) over torchcomms "
            f"({dist.get_backend()}, {device.type}): {local} of {total} parameters on this rank"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
