"""TorchWork semantics: tensors dropped after enqueue, works dropped without wait, double wait,
the GIL released while a call blocks."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any

import pytest
import torch

import torchcomms
from conftest import RANK, WORLD, need_ranks
from torchcomms import ReduceOp


def _churn() -> list[torch.Tensor]:
    """Allocates and scribbles over memory, so freed tensor memory would be reused."""
    return [torch.full((1 << 16,), -7.0) for _ in range(64)]


def test_input_dropped_after_enqueue(world: Any) -> None:
    """The engine holds the Python tensor until the operation finished: an input the caller
    dropped right after enqueue still delivers its data."""
    k = 1 << 16
    out = torch.empty(WORLD * k)
    work = world.all_gather_single(out, torch.full((k,), float(RANK + 1)), async_op=True)
    junk = _churn()
    work.wait()
    del junk
    want = torch.cat([torch.full((k,), float(q + 1)) for q in range(WORLD)])
    assert torch.equal(out, want)


def test_tensor_released_after_completion(world: Any) -> None:
    """The engine's reference goes away once the work finished (no leak)."""
    t = torch.ones(1024)
    ref = weakref.ref(t)
    work = world.all_reduce(t, ReduceOp.SUM, async_op=True)
    del t
    work.wait()
    del work
    # The progress thread drops its reference without the GIL; it is released at the next
    # entry into the extension.
    for _ in range(100):
        world.get_rank()
        gc.collect()
        if ref() is None:
            break
        time.sleep(0.01)
    assert ref() is None


def test_work_dropped_without_wait(world: Any) -> None:
    """A work dropped without wait() is not an error; the operation still completes in order."""
    t = torch.full((100,), float(RANK))
    world.all_reduce(t, ReduceOp.SUM, async_op=True)  # work dropped at once
    gc.collect()
    world.barrier(async_op=False)  # runs after the all_reduce (issue order)
    assert torch.all(t == sum(range(WORLD)))


def test_all_works_dropped_and_tensors_dropped(world: Any) -> None:
    for _ in range(20):
        world.all_reduce(torch.ones(4096), ReduceOp.SUM, async_op=True)
    world.barrier(async_op=False)


def test_double_wait_and_is_completed(world: Any) -> None:
    t = torch.ones(10)
    work = world.all_reduce(t, ReduceOp.SUM, async_op=True)
    work.wait()
    work.wait()
    work.wait_blocking()
    assert work.is_completed()
    assert torch.all(t == WORLD)
    # A synchronous call returns a completed work.
    work = world.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert work.is_completed()
    work.wait()
    assert isinstance(work, torchcomms.TorchWork)


def test_many_outstanding_async_works(world: Any) -> None:
    ts = [torch.full((257,), float(i + RANK)) for i in range(16)]
    works = [world.all_reduce(t, ReduceOp.MAX, async_op=True) for t in ts]
    for w in reversed(works):
        w.wait()
    for i, t in enumerate(ts):
        assert torch.all(t == i + WORLD - 1)


def test_set_status_only_for_python_works(world: Any) -> None:
    work = world.barrier(async_op=False)
    with pytest.raises(RuntimeError, match="_set_status"):
        work._set_status(torchcomms._comms.WorkStatus.COMPLETED)


class _Counter(threading.Thread):
    """Counts in a Python thread: it only advances while the main thread releases the GIL."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.count = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.count += 1
            time.sleep(0.001)


def _blocked_call_lets_python_run(call: Any, delay_rank: int) -> None:
    counter = _Counter()
    counter.start()
    if RANK == delay_rank:
        time.sleep(0.5)
        call()
    else:
        before = counter.count
        t0 = time.monotonic()
        call()
        waited = time.monotonic() - t0
        progressed = counter.count - before
        assert waited > 0.2, f"the call did not block ({waited:.3f}s): the test proves nothing"
        assert progressed > 20, f"only {progressed} ticks in {waited:.2f}s: the GIL was held"
    counter.stop.set()
    counter.join()


def test_gil_released_in_sync_op(world: Any) -> None:
    need_ranks(2)
    _blocked_call_lets_python_run(lambda: world.all_reduce(torch.ones(4), ReduceOp.SUM, False), 0)


def test_gil_released_in_wait(world: Any) -> None:
    need_ranks(2)
    _blocked_call_lets_python_run(lambda: world.barrier(True).wait(), WORLD - 1)


def test_gil_released_in_split(world: Any) -> None:
    need_ranks(2)
    made = []
    _blocked_call_lets_python_run(lambda: made.append(world.split(list(range(WORLD)), "gilsplit")), 0)
    made[0].finalize()


def test_gil_released_in_new_comm(world: Any) -> None:
    need_ranks(2)
    made = []

    def create() -> None:
        made.append(torchcomms.new_comm("ctran", "cpu", "gil_new_comm", abort_process_on_timeout_or_error=False))

    _blocked_call_lets_python_run(create, 0)
    made[0].finalize()


def test_threads_issue_concurrently_on_separate_comms(fresh: Any) -> None:
    """Two Python threads, each with its own communicator, run collectives at the same time
    (possible only because blocking calls release the GIL)."""
    a, b = fresh("thr_a"), fresh("thr_b")
    errors: list[BaseException] = []

    def loop(comm: Any, v: float) -> None:
        try:
            for _ in range(50):
                t = torch.full((64,), v)
                comm.all_reduce(t, ReduceOp.SUM, async_op=False)
                assert torch.all(t == v * WORLD)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    th = [threading.Thread(target=loop, args=(a, 1.0)), threading.Thread(target=loop, args=(b, 2.0))]
    for x in th:
        x.start()
    for x in th:
        x.join()
    assert not errors, errors
