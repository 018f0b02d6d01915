"""One-sided windows on CPU tensors (upstream's ``TorchCommWindow``): registration, put, signal,
wait_signal, attributes and mapping, the flow of upstream's ``WindowRmaTest``, a long put+signal
ring, every rank writing into every window at once, and bad input. Ranks on one host reach each
other by cross-memory attach or TCP (the engine picks per peer)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

import torchcomms
from conftest import RANK, WORLD, need_ranks
from torchcomms import TorchCommWinAccessType


def _window(comm: Any, n: int, dtype: torch.dtype = torch.float32, fill: float = 1.0) -> Any:
    buf = torch.full((n,), fill, dtype=dtype)
    win = comm.new_window()
    win.tensor_register(buf)
    return win, buf


@pytest.mark.parametrize(
    "count,dtype,async_op,async_signal",
    list(
        itertools.product(
            [4, 1024, 1 << 20], [torch.float32, torch.int32, torch.int8], [True, False], [True, False]
        )
    ),
    ids=lambda v: str(v).replace("torch.", ""),
)
def test_put_signal_wait_ring(
    world: Any, count: int, dtype: torch.dtype, async_op: bool, async_signal: bool
) -> None:
    """Upstream's WindowRmaTest on CPU: each rank puts into the next rank's window at the next
    rank's slot, signals it, waits for the previous rank's signal and checks its slot."""
    need_ranks(2)
    src = torch.full((count,), RANK, dtype=dtype)
    buf = torch.ones(count * WORLD, dtype=dtype)
    win = world.new_window(buf)
    dst, prev = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    for it in range(10):
        src.fill_(RANK + it)
        w = win.put(src, dst, dst * count, async_op)
        if async_op:
            w.wait()
        s = win.signal(dst, async_signal)
        if async_signal:
            s.wait()
        ws = win.wait_signal(prev, async_signal)
        if async_signal:
            ws.wait()
        got = win.map_remote_tensor(RANK)[RANK * count : (RANK + 1) * count]
        torch.testing.assert_close(got, torch.full((count,), prev + it, dtype=dtype))
        # The previous rank overwrites the slot next round: agree the check is done.
        world.barrier(False)
    win.tensor_deregister()


def test_window_properties_and_mapping(world: Any) -> None:
    buf = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    win = world.new_window()
    assert win.get_tensor() is None
    win.tensor_register(buf)
    assert win.get_size() == buf.numel() * buf.element_size()
    assert win.dtype == torch.float64 and list(win.shape) == [3, 4]
    assert win.device == torch.device("cpu")
    assert win.get_tensor() is not None and win.get_tensor().data_ptr() == buf.data_ptr()
    mine = win.map_remote_tensor(RANK)
    assert mine.data_ptr() == buf.data_ptr() and mine.dtype == buf.dtype
    assert list(mine.shape) == [3, 4]
    me = win.get_attr(RANK)
    assert me.access_type == TorchCommWinAccessType.WIN_ACCESS_TYPE_UNIFIED
    if WORLD > 1:
        peer = (RANK + 1) % WORLD
        attr = win.get_attr(peer)
        if attr.access_type == TorchCommWinAccessType.WIN_ACCESS_TYPE_SEPARATE:
            with pytest.raises((ValueError, RuntimeError), match="map_remote_tensor"):
                win.map_remote_tensor(peer)
    with pytest.raises(RuntimeError, match="already"):
        win.tensor_register(torch.zeros(4))
    win.tensor_deregister()
    assert win.get_tensor() is None


def test_put_signal_ring_of_1000_iterations(world: Any) -> None:
    need_ranks(2)
    n = 64
    win, buf = _window(world, 2 * n, torch.int64, 0.0)
    src = torch.empty(n, dtype=torch.int64)
    dst, prev = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    for it in range(1000):
        half = it % 2  # alternate halves: the next put never lands on data not yet checked
        src.fill_(it * 100 + RANK)
        win.put(src, dst, half * n, False)
        win.signal(dst, False)
        win.wait_signal(prev, False)
        got = buf[half * n : (half + 1) * n]
        assert bool((got == it * 100 + prev).all()), (it, got[:4])
        if it % 2:
            win.signal(prev, False)  # the previous rank may reuse both halves
            win.wait_signal(dst, False)
    win.tensor_deregister()


def test_every_rank_puts_into_every_window_at_once(world: Any) -> None:
    """Every rank writes its slot of every rank's window at once (its own too: a put to oneself
    is a local copy)."""
    need_ranks(2)
    n = 1000
    win, buf = _window(world, n * WORLD, torch.float32, -1.0)
    others = [d for d in range(WORLD) if d != RANK]
    works = [
        win.put(torch.full((n,), float(RANK * 10 + d), dtype=torch.float32), d, RANK * n, True)
        for d in range(WORLD)
    ]
    for w in works:
        w.wait()
    for d in others:
        win.signal(d, False)
    for s in others:
        win.wait_signal(s, False)
    want = torch.cat([torch.full((n,), float(s * 10 + RANK)) for s in range(WORLD)])
    torch.testing.assert_close(buf, want)
    world.barrier(False)
    win.tensor_deregister()


def test_bad_input_names_the_argument(world: Any) -> None:
    need_ranks(2)
    win, _ = _window(world, 16)
    peer = (RANK + 1) % WORLD
    with pytest.raises(ValueError, match="target_offset_nelems"):
        win.put(torch.ones(8), peer, 12, False)  # 12 + 8 > 16 elements
    with pytest.raises((ValueError, TypeError), match="dtype"):
        win.put(torch.ones(4, dtype=torch.float64), peer, 0, False)
    with pytest.raises(ValueError, match="dst_rank"):
        win.put(torch.ones(4), WORLD, 0, False)
    with pytest.raises(ValueError, match="peer_rank"):
        win.signal(WORLD + 3, False)
    world.barrier(False)
    win.tensor_deregister()
    with pytest.raises((ValueError, RuntimeError), match="register"):
        win.put(torch.ones(4), peer, 0, False)


def test_sizes_that_disagree_fail_on_every_rank(fresh: Any) -> None:
    need_ranks(2)
    comm = fresh("win_sizes")
    win = comm.new_window()
    with pytest.raises((ValueError, RuntimeError), match="size"):
        win.tensor_register(torch.zeros(8 + RANK))


def test_new_window_is_in_the_api(world: Any) -> None:
    assert isinstance(world.new_window(), torchcomms.TorchCommWindow)
