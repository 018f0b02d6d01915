"""``device_alltoallv_single`` on CUDA tensors with ``ctran``, both ways it runs: kernels that
keep the counts on the device and write into peers' outputs (ranks that map each other's
memory: GPUs over NVLink, or ranks sharing a GPU), and the GPU progress engine over host
transports (``CTRAN_BACKENDS=socket,shm``). Any number of GPUs, ranks sharing them::

    torchrun --nproc_per_node 2 -m pytest bindings/python/gpu_tests/test_device_alltoallv_cuda.py \\
        -q -p no:cacheprovider
"""

from __future__ import annotations

import os
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL = int(os.environ.get("LOCAL_RANK", "0"))

from conftest import new_comm_on  # noqa: E402

DEV = torch.device("cuda", LOCAL % torch.cuda.device_count())
torch.cuda.set_device(DEV)


@pytest.fixture(scope="module", params=["kernels", "engine"])
def a2a(request: Any) -> Iterator[SimpleNamespace]:
    backends = "socket,shm" if request.param == "engine" else None
    c = new_comm_on(backends, DEV, f"a2av_{request.param}", timeout=timedelta(seconds=60))
    yield SimpleNamespace(comm=c, way=request.param)
    torch.cuda.synchronize()
    c.finalize()


def rows_from(src: int, dst: int, seed: int) -> int:
    return (3 * src + 5 * dst + seed) % 7


def check(out: torch.Tensor, recv: torch.Tensor, seed: int, cols: int, fill: float) -> None:
    torch.cuda.synchronize()
    want = [rows_from(j, RANK, seed) for j in range(WORLD)]
    assert recv.cpu().tolist() == want
    o = out.cpu()
    at = 0
    for j, n in enumerate(want):
        block = o[at : at + n]
        expect = torch.arange(n * cols, dtype=torch.float32).view(n, cols) + 1000 * j + 100 * RANK
        assert torch.equal(block, expect), f"rows from rank {j}"
        at += n
    assert torch.all(o[at:] == fill), "rows past what arrived keep their values"


def inputs(seed: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    counts = [rows_from(RANK, j, seed) for j in range(WORLD)]
    parts = [
        torch.arange(n * cols, dtype=torch.float32).view(n, cols) + 1000 * RANK + 100 * j
        for j, n in enumerate(counts)
    ]
    return torch.cat(parts).to(DEV), torch.tensor(counts, dtype=torch.int64, device=DEV)


@pytest.mark.parametrize("cols", [1, 3, 64])
@pytest.mark.parametrize("async_op", [False, True])
def test_variable_rows_land_packed_by_source(a2a: SimpleNamespace, cols: int, async_op: bool) -> None:
    for seed in range(4):
        inp, send = inputs(seed, cols)
        out = torch.full((7 * WORLD + 3, cols), -1.0, device=DEV)
        recv = torch.zeros(WORLD, dtype=torch.int64, device=DEV)
        work = a2a.comm.device_alltoallv_single(out, inp, recv, send, async_op)
        if async_op:
            work.wait()
        check(out, recv, seed, cols, -1.0)


def test_counts_written_by_earlier_device_work(a2a: SimpleNamespace) -> None:
    """The counts are read when the operation runs on the stream, not when it is issued."""
    inp, send_final = inputs(9, 8)
    send = torch.zeros(WORLD, dtype=torch.int64, device=DEV)
    torch.cuda._sleep(20_000_000)  # the copy below lands long after the call returns
    send.copy_(send_final)
    out = torch.full((7 * WORLD, 8), 5.0, device=DEV)
    recv = torch.zeros(WORLD, dtype=torch.int64, device=DEV)
    a2a.comm.device_alltoallv_single(out, inp, recv, send, False)
    check(out, recv, 9, 8, 5.0)


def test_graph_capture_and_replay_with_new_counts(a2a: SimpleNamespace) -> None:
    if a2a.way != "kernels":
        pytest.skip("the GPU progress engine refuses capture")
    cols = 16
    inp = torch.zeros(7 * WORLD, cols, device=DEV)
    send = torch.zeros(WORLD, dtype=torch.int64, device=DEV)
    out = torch.full((7 * WORLD, cols), -1.0, device=DEV)
    recv = torch.zeros(WORLD, dtype=torch.int64, device=DEV)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        a2a.comm.device_alltoallv_single(out, inp, recv, send, False)  # warm up
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            a2a.comm.device_alltoallv_single(out, inp, recv, send, False)
    torch.cuda.synchronize()
    for seed in range(3):
        x, counts = inputs(seed, cols)
        inp.zero_()
        inp[: x.shape[0]].copy_(x)
        send.copy_(counts)
        out.fill_(-1.0)
        graph.replay()
        check(out, recv, seed, cols, -1.0)


def test_bad_counts_fail_every_rank(a2a: SimpleNamespace) -> None:
    """A negative count: nothing is sent, the kernels report it, and the next operation fails
    on every rank before anything moves. (The engine's way fails the operation itself; the
    CPU suite covers it: it aborts the communicator.)"""
    if a2a.way != "kernels":
        pytest.skip("covered by the CPU suite (the failure aborts the communicator)")
    inp, send = inputs(1, 4)
    out = torch.zeros(7 * WORLD, 4, device=DEV)
    recv = torch.zeros(WORLD, dtype=torch.int64, device=DEV)
    if RANK == 0:
        send[WORLD - 1] = -2
    a2a.comm.device_alltoallv_single(out, inp, recv, send, False)
    torch.cuda.synchronize()
    if RANK == WORLD - 1:
        assert recv.cpu().tolist()[0] == 0, "nothing came from the rank with a bad count"
    inp, send = inputs(2, 4)
    want = "input_split_sizes" if RANK == 0 else "rank 0 reported one"
    with pytest.raises(ValueError, match=want):
        a2a.comm.device_alltoallv_single(out, inp, recv, send, False)
    # The error is consumed: the communicator works on.
    out.fill_(-1.0)
    a2a.comm.device_alltoallv_single(out, inp, recv, send, False)
    check(out, recv, 2, 4, -1.0)
