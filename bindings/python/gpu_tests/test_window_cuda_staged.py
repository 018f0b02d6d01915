"""One-sided windows on CUDA tensors over host transports (the ``ctran`` backend without
NVLink): what a CUDA window uses across hosts, or with several ranks on one GPU. Runs with any
number of GPUs, ranks sharing them round robin::

    torchrun --nproc_per_node 2 -m pytest bindings/python/gpu_tests/test_window_cuda_staged.py \\
        -q -p no:cacheprovider

Its communicator is created with ``CTRAN_BACKENDS=socket,shm`` (host transports only), so the
window is staged even where the GPUs share NVLink.

Puts from a CUDA tensor are staged to the host by the GPU progress engine in stream order; the
target's wait for the covering signal copies the bytes they wrote into its window, on its
stream. Peers are SEPARATE (nothing is mapped), and only the bytes peers put are written: what
the owner wrote into its own window stays.
"""

from __future__ import annotations

import itertools
import os
from datetime import timedelta
from typing import Any, Iterator

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL = int(os.environ.get("LOCAL_RANK", "0"))
if WORLD < 2:
    pytest.skip("windows need 2 or more ranks", allow_module_level=True)

import torchcomms  # noqa: E402
from conftest import new_comm_on  # noqa: E402
from torchcomms import TorchCommWinAccessType  # noqa: E402

DEV = torch.device("cuda", LOCAL % torch.cuda.device_count())
torch.cuda.set_device(DEV)


@pytest.fixture(scope="module")
def comm() -> Iterator[Any]:
    # Host transports only for this communicator.
    timeout = timedelta(seconds=float(os.environ.get("STAGED_TIMEOUT", "60")))
    c = new_comm_on("socket,shm", DEV, "gpu_windows_staged", timeout=timeout)
    yield c
    torch.cuda.synchronize()
    c.finalize()


@pytest.mark.parametrize(
    "count,dtype,async_op,async_signal",
    list(itertools.product([4, 1024, 1 << 20], [torch.float, torch.int8], [True, False], [True, False])),
    ids=lambda v: str(v).replace("torch.", ""),
)
def test_ring_of_puts_and_signals(comm: Any, count: int, dtype: torch.dtype, async_op: bool, async_signal: bool) -> None:
    """Upstream's WindowRmaTest flow: put on one stream, signal, wait_signal on another, read
    the own window; ten rounds, each checked."""
    put_stream, wait_stream = torch.cuda.Stream(), torch.cuda.Stream()
    input_tensor = torch.full([count], RANK, dtype=dtype, device=DEV)
    win_buf = torch.ones([count * WORLD], dtype=dtype, device=DEV)
    torch.cuda.synchronize()
    comm.barrier(False)
    win = comm.new_window()
    win.tensor_register(win_buf)
    dst, src = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    assert win.get_attr(dst).access_type == TorchCommWinAccessType.WIN_ACCESS_TYPE_SEPARATE
    for it in range(10):
        with torch.cuda.stream(put_stream):
            input_tensor.fill_(RANK + it)
            w = win.put(input_tensor, dst, dst * count, async_op)
            if async_op:
                w.wait()
            s = win.signal(dst, async_signal)
            if async_signal:
                s.wait()
        with torch.cuda.stream(wait_stream):
            ws = win.wait_signal(src, async_signal)
            if async_signal:
                ws.wait()
            out = win.map_remote_tensor(RANK)[RANK * count : (RANK + 1) * count].clone()
        wait_stream.synchronize()
        torch.testing.assert_close(out, torch.full([count], src + it, dtype=dtype, device=DEV))
        put_stream.synchronize()
        comm.barrier(False)  # the slot is rewritten next round
    win.tensor_deregister()


def test_only_put_bytes_are_written(comm: Any) -> None:
    """The owner's own writes to its window survive peers' puts into other parts of it."""
    n = 4096
    buf = torch.zeros(n * WORLD, dtype=torch.int32, device=DEV)
    win = comm.new_window(buf)
    torch.cuda.synchronize()
    comm.barrier(False)
    # Every rank fills its own block itself, then puts into its block of every peer's window.
    buf[RANK * n : (RANK + 1) * n].fill_(7)
    src = torch.full((n,), 100 + RANK, dtype=torch.int32, device=DEV)
    peers = [p for p in range(WORLD) if p != RANK]
    for p in peers:
        win.put(src, p, RANK * n, False)
        win.signal(p, False)
    for p in peers:
        win.wait_signal(p, False)
    torch.cuda.synchronize()
    for q in range(WORLD):
        want = 7 if q == RANK else 100 + q
        torch.testing.assert_close(buf[q * n : (q + 1) * n], torch.full((n,), want, dtype=torch.int32, device=DEV))
    comm.barrier(False)
    win.tensor_deregister()


def test_put_to_self_and_many_in_flight(comm: Any) -> None:
    n = 1 << 16
    buf = torch.zeros(n * WORLD, dtype=torch.float32, device=DEV)
    win = comm.new_window(buf)
    torch.cuda.synchronize()
    comm.barrier(False)
    works = []
    for q in range(WORLD):
        works.append(win.put(torch.full((n,), float(RANK * 10 + q), device=DEV), q, RANK * n, True))
    for q in range(WORLD):
        if q != RANK:
            works.append(win.signal(q, True))
    for q in range(WORLD):
        if q != RANK:
            works.append(win.wait_signal(q, True))
    for w in works:
        w.wait()
    torch.cuda.synchronize()
    for q in range(WORLD):
        torch.testing.assert_close(buf[q * n : (q + 1) * n], torch.full((n,), float(q * 10 + RANK), device=DEV))
    comm.barrier(False)
    win.tensor_deregister()


def test_all_gather_p_on_a_staged_window(comm: Any) -> None:
    n = 1 << 12
    out = torch.zeros(WORLD * n, dtype=torch.float32, device=DEV)
    inp = torch.empty(n, dtype=torch.float32, device=DEV)
    handle = comm.all_gather_p_init(out, hints={"window": "true"})
    assert handle.uses_window
    for it in range(5):
        inp.fill_(float(it * 100 + RANK))
        comm.all_gather_p_exec(handle, inp, False)
        want = torch.cat([torch.full((n,), float(it * 100 + q), device=DEV) for q in range(WORLD)])
        torch.testing.assert_close(out, want)
    torch.cuda.synchronize()
    comm.barrier(False)
    comm.all_gather_p_free(handle)


def test_bad_input(comm: Any) -> None:
    buf = torch.zeros(64, device=DEV)
    win = comm.new_window(buf)
    peer = (RANK + 1) % WORLD
    with pytest.raises(ValueError, match="target_offset"):
        win.put(torch.ones(8, device=DEV), peer, 60, False)
    with pytest.raises(ValueError, match="tensor"):
        win.put(torch.ones(8), peer, 0, False)  # a CPU tensor into a CUDA window
    with pytest.raises((ValueError, RuntimeError), match="peer"):
        win.wait_signal(RANK, False)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with pytest.raises(RuntimeError, match="captur"):
        with torch.cuda.graph(g, stream=s):
            win.put(torch.ones(8, device=DEV), peer, 0, False)
    torch.cuda.synchronize()
    comm.barrier(False)
    win.tensor_deregister()
    with pytest.raises((ValueError, RuntimeError), match="size"):
        comm.new_window(torch.zeros(64 + RANK, device=DEV))
