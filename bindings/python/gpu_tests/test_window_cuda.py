"""One-sided windows on CUDA tensors over NVLink (the ``ctran`` backend), one process per GPU::

    TORCHCOMMS_TEST_BACKEND=ctran torchrun --nproc_per_node NGPU -m pytest \\
        bindings/python/gpu_tests/test_window_cuda.py -q -p no:cacheprovider

Upstream's ``WindowRmaTest`` flow (put on one stream, signal, wait_signal on another, read the
window through ``map_remote_tensor``), peers' windows mapped over NVLink, a ring captured in a
CUDA graph and replayed, and bad input.
"""

from __future__ import annotations

import itertools
import os
from datetime import timedelta
from typing import Any, Iterator

import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs 2 CUDA devices", allow_module_level=True)

import torchcomms  # noqa: E402
from torchcomms import TorchCommWinAccessType  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL = int(os.environ.get("LOCAL_RANK", "0"))
BACKEND = os.environ.get("TORCHCOMMS_TEST_BACKEND", "ctran")
DEV = torch.device("cuda", LOCAL % torch.cuda.device_count())
torch.cuda.set_device(DEV)

if BACKEND != "ctran" or WORLD < 2:
    pytest.skip("windows run on the ctran backend with 2 or more ranks", allow_module_level=True)


@pytest.fixture(scope="module")
def comm() -> Iterator[Any]:
    c = torchcomms.new_comm("ctran", DEV, "gpu_windows", timeout=timedelta(seconds=120))
    yield c
    torch.cuda.synchronize()
    c.finalize()


@pytest.mark.parametrize(
    "count,dtype,async_op,async_signal",
    list(
        itertools.product(
            [4, 1024, 1 << 20], [torch.float, torch.int, torch.int8], [True, False], [True, False]
        )
    ),
    ids=lambda v: str(v).replace("torch.", ""),
)
def test_window_put(comm: Any, count: int, dtype: torch.dtype, async_op: bool, async_signal: bool) -> None:
    put_stream, wait_stream = torch.cuda.Stream(), torch.cuda.Stream()
    input_tensor = torch.full([count], RANK, dtype=dtype, device=DEV)
    win_buf = torch.ones([count * WORLD], dtype=dtype, device=DEV)
    comm.barrier(False)
    win = comm.new_window()
    win.tensor_register(win_buf)
    comm.barrier(False)
    dst, src = (RANK + 1) % WORLD, (RANK - 1) % WORLD
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
            local = win.map_remote_tensor(RANK)
            out = local[RANK * count : (RANK + 1) * count].clone()
        wait_stream.synchronize()
        torch.testing.assert_close(out, torch.full([count], src + it, dtype=dtype, device=DEV))
        put_stream.synchronize()
        comm.barrier(False)  # the slot is rewritten next iteration
    win.tensor_deregister()


def test_peers_are_mapped_over_nvlink(comm: Any) -> None:
    buf = torch.arange(1 << 16, dtype=torch.float32, device=DEV) + RANK * 1000
    win = comm.new_window(buf)
    torch.cuda.synchronize()
    comm.barrier(False)
    peer = (RANK + 1) % WORLD
    assert win.get_attr(peer).access_type == TorchCommWinAccessType.WIN_ACCESS_TYPE_UNIFIED
    remote = win.map_remote_tensor(peer)
    assert remote.device == DEV and remote.dtype == torch.float32 and remote.shape == buf.shape
    torch.testing.assert_close(remote, torch.arange(1 << 16, dtype=torch.float32, device=DEV) + peer * 1000)
    assert win.get_size() == buf.numel() * 4 and win.device == DEV
    comm.barrier(False)
    win.tensor_deregister()


def test_ring_in_a_cuda_graph(comm: Any) -> None:
    n = 256
    buf = torch.zeros(n * WORLD, dtype=torch.int32, device=DEV)
    win = comm.new_window(buf)
    src = torch.full((n,), 100 + RANK, dtype=torch.int32, device=DEV)
    dst, prev = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    comm.barrier(False)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        win.put(src, dst, RANK * n, False)
        win.signal(dst, False)
        win.wait_signal(prev, False)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(buf[prev * n : (prev + 1) * n], torch.full((n,), 100 + prev, dtype=torch.int32, device=DEV))
    comm.barrier(False)
    win.tensor_deregister()


def test_bad_input(comm: Any) -> None:
    buf = torch.zeros(64, device=DEV)
    win = comm.new_window(buf)
    peer = (RANK + 1) % WORLD
    with pytest.raises(ValueError, match="target_offset_nelems"):
        win.put(torch.ones(8, device=DEV), peer, 60, False)
    with pytest.raises(ValueError, match="tensor"):
        win.put(torch.ones(8), peer, 0, False)  # a CPU tensor into a CUDA window
    comm.barrier(False)
    win.tensor_deregister()
    with pytest.raises((ValueError, RuntimeError), match="size"):
        comm.new_window(torch.zeros(64 + RANK, device=DEV))


@pytest.mark.parametrize("n", [256, 1 << 20])
def test_all_gather_p_on_a_window(comm: Any, n: int) -> None:
    """A persistent all-gather asked to run on a window: one kernel per round writes into
    every peer's output over NVLink; rounds back to back, one captured in a CUDA graph and
    replayed."""
    out = torch.zeros(WORLD * n, dtype=torch.float32, device=DEV)
    inp = torch.empty(n, dtype=torch.float32, device=DEV)
    assert not comm.all_gather_p_init(torch.zeros_like(out)).uses_window  # the default
    handle = comm.all_gather_p_init(out, hints={"window": "true"})
    assert handle.uses_window
    for it in range(10):
        inp.fill_(float(it * 100 + RANK))
        comm.all_gather_p_exec(handle, inp, False)
        want = torch.cat([torch.full((n,), float(it * 100 + q), device=DEV) for q in range(WORLD)])
        torch.testing.assert_close(out, want)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        comm.all_gather_p_exec(handle, inp, False)
    for it in range(20, 25):
        inp.fill_(float(it * 100 + RANK))
        g.replay()
        want = torch.cat([torch.full((n,), float(it * 100 + q), device=DEV) for q in range(WORLD)])
        torch.testing.assert_close(out, want)
    torch.cuda.synchronize()
    comm.barrier(False)
    comm.all_gather_p_free(handle)
