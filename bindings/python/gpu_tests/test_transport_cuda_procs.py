"""torchcomms._transport between two processes, one GPU each (CUDA IPC between the processes),
and CPU <-> CUDA between them (the TCP payload path)::

    torchrun --nproc_per_node 2 -m pytest bindings/python/gpu_tests/test_transport_cuda_procs.py -q

URLs and pickled remote buffers travel through torch.distributed (gloo) object collectives.
"""

from __future__ import annotations

import os
import pickle
import time
from typing import Any, Iterator

import pytest
import torch
import torch.distributed as dist

if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs 2 CUDA devices", allow_module_level=True)
if int(os.environ.get("WORLD_SIZE", "1")) != 2:
    pytest.skip("runs as 2 processes (torchrun --nproc_per_node 2)", allow_module_level=True)

from torchcomms._transport import RdmaMemory, RdmaTransport  # noqa: E402

RANK = int(os.environ["RANK"])
PEER = 1 - RANK
DEV = torch.device("cuda", RANK)
torch.cuda.set_device(DEV)


@pytest.fixture(scope="module")
def link() -> Iterator[Any]:
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    t = RdmaTransport(DEV)
    urls: list[Any] = [None, None]
    dist.all_gather_object(urls, t.bind())
    assert t.connect(urls[PEER]) == 0
    yield t
    dist.barrier()
    del t


def swap(obj: Any) -> Any:
    got: list[Any] = [None, None]
    dist.all_gather_object(got, pickle.dumps(obj))
    return pickle.loads(got[PEER])


@pytest.mark.parametrize("mine,theirs", [("cuda", "cuda"), ("cpu", "cuda"), ("cuda", "cpu")])
@pytest.mark.parametrize("nbytes", [1024, (8 << 20) + 3])
def test_write_then_read_between_processes(link: Any, mine: str, theirs: str, nbytes: int) -> None:
    dev = lambda kind, r: torch.device("cuda", r) if kind == "cuda" else torch.device("cpu")  # noqa: E731
    my_kind = mine if RANK == 0 else theirs
    src = (torch.arange(nbytes, dtype=torch.int64, device=dev(my_kind, RANK)) * (RANK + 3)).to(torch.uint8)
    inbox = torch.zeros(nbytes, dtype=torch.uint8, device=dev(my_kind, RANK))
    back = torch.zeros(nbytes, dtype=torch.uint8, device=dev(my_kind, RANK))
    src_mem, inbox_mem, back_mem = RdmaMemory(src), RdmaMemory(inbox), RdmaMemory(back)
    peer_inbox = swap(inbox_mem.to_remote_buffer())
    peer_src = swap(src_mem.to_remote_buffer())
    torch.cuda.synchronize()
    assert link.write(src_mem.to_view(), peer_inbox, notify=True) == 0
    link.wait_for_write()
    assert link.read(back_mem.to_mutable_view(), peer_src) == 0
    want = (torch.arange(nbytes, dtype=torch.int64) * (PEER + 3)).to(torch.uint8)
    torch.cuda.synchronize()
    assert torch.equal(inbox.cpu(), want)
    assert torch.equal(back.cpu(), want)
    dist.barrier()


def test_bandwidth_gpu_to_gpu(link: Any) -> None:
    """256 MiB written GPU to GPU between the processes (CUDA IPC), printed for the record."""
    n = 256 << 20
    src = torch.full((n,), RANK + 1, dtype=torch.uint8, device=DEV)
    dst = torch.zeros(n, dtype=torch.uint8, device=DEV)
    sm, dm = RdmaMemory(src), RdmaMemory(dst)
    peer_dst = swap(dm.to_remote_buffer())
    torch.cuda.synchronize()
    dist.barrier()
    if RANK == 0:
        link.write(sm.to_view(), peer_dst)
        t0 = time.perf_counter()
        for _ in range(5):
            link.write(sm.to_view(), peer_dst)
        dt = (time.perf_counter() - t0) / 5
        print(f"\nRDMA write 256 MiB GPU->GPU across processes: {n / dt / 1e9:.1f} GB/s")
    dist.barrier()
    if RANK == 1:
        assert bool((dst == 1).all())
    dist.barrier()
