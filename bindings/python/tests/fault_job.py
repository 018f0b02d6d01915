"""One rank of a small job that test_z_faults.py launches to break on purpose.

Usage: ``python fault_job.py SCENARIO`` with ``TORCHCOMM_RANK``, ``TORCHCOMM_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` set. Prints ``RESULT <json>`` lines the test checks.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms.hooks import FlightRecorderHook

RANK = int(os.environ["TORCHCOMM_RANK"])


def result(**kw: object) -> None:
    print("RESULT " + json.dumps(kw), flush=True)


def make(name: str, timeout: float, abort: bool) -> torchcomms.TorchComm:
    comm = torchcomms.new_comm(
        "ctran",
        "cpu",
        name,
        abort_process_on_timeout_or_error=abort,
        timeout=timedelta(seconds=timeout),
    )
    comm.register_abort_hook(lambda: print(f"ABORT_HOOK rank {RANK}", flush=True))
    return comm


def healthy_round(comm: torchcomms.TorchComm) -> None:
    t = torch.ones(1000)
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert torch.all(t == comm.get_size())
    comm.barrier(async_op=False)


def killed() -> None:
    """The last rank dies (SIGKILL); the others must raise RuntimeError within the timeout."""
    timeout = 10.0
    comm = make("fault_killed", timeout, abort=False)
    healthy_round(comm)
    if RANK == comm.get_size() - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    t0 = time.monotonic()
    try:
        comm.all_reduce(torch.ones(1 << 16), ReduceOp.SUM, async_op=False)
        result(raised=None)
    except RuntimeError as e:
        result(raised=type(e).__name__, msg=str(e), elapsed=time.monotonic() - t0, timeout=timeout)
    result(healthy=torchcomms._comms._health_check())
    # The communicator is now failed: later work fails at once, also through wait().
    try:
        comm.barrier(async_op=True).wait()
        result(later=None)
    except RuntimeError as e:
        result(later=type(e).__name__, msg=str(e))
    comm.finalize()  # a failed communicator finalizes without waiting for peers
    result(finalized=True)


def timeout() -> None:
    """Rank 1 never joins the collective: rank 0's wait raises TimeoutError after ~timeout.
    The timeout is set after creation (set_timeout), and the flight recorder shows the engine's
    verdict on the operation."""
    limit = 1.5
    comm = make("fault_timeout", 60.0, abort=False)
    comm.set_timeout(timedelta(seconds=limit))
    fr = FlightRecorderHook(isolated=True)
    fr.register_with_comm(comm)
    healthy_round(comm)
    if RANK == 1:
        time.sleep(limit + 4)
        os._exit(0)
    t0 = time.monotonic()
    work = comm.all_reduce(torch.ones(8), ReduceOp.SUM, async_op=True)
    try:
        work.wait()
        result(raised=None)
    except TimeoutError as e:
        result(
            raised=type(e).__name__,
            is_runtime_error=isinstance(e, RuntimeError),
            msg=str(e),
            elapsed=time.monotonic() - t0,
            timeout=limit,
        )
    last = json.loads(fr.dump_json())["entries"][-1]
    result(fr_last={k: last.get(k) for k in ("profiling_name", "state", "engine_state", "error", "retired")})
    os._exit(0)


def abort_process() -> None:
    """abort_process_on_timeout_or_error=True: the abort hook runs, then the process aborts."""
    comm = make("fault_abort", 10.0, abort=True)
    healthy_round(comm)
    if RANK == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    comm.all_reduce(torch.ones(1 << 16), ReduceOp.SUM, async_op=False)
    result(survived=True)  # must not be reached


def watchdog() -> None:
    """An async operation fails while Python never waits on it: with
    abort_process_on_timeout_or_error=True the watchdog runs the abort hook and aborts the
    process (upstream's watchdog thread); without it the process carries on and the error
    surfaces at the next wait. ``sys.argv[2]``: ``timeout`` (rank 1 stalls), ``killed`` (rank 1
    dies) or ``off`` (rank 1 dies, the flag is off)."""
    mode = sys.argv[2]
    limit = 2.0
    # Created with a long timeout: on a loaded 2-core machine one rank may start (import torch)
    # seconds after the other, and the rendezvous must not be what times out.
    comm = make("fault_watchdog", 60.0, abort=mode != "off")
    comm.set_timeout(timedelta(seconds=limit))
    healthy_round(comm)
    if RANK == 1:
        if mode == "timeout":
            time.sleep(8)
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    work = comm.all_reduce(torch.ones(1 << 10), ReduceOp.SUM, async_op=True)
    result(issued=time.time())
    del work  # dropped: nobody will ever wait on it
    t0 = time.monotonic()
    busy = 0
    while time.monotonic() - t0 < 15:  # Python keeps running (and taking the GIL)
        busy += sum(range(1000))
        time.sleep(0.01)
    result(survived=True, healthy=torchcomms._comms._health_check())
    try:
        comm.barrier(async_op=True).wait()
        result(later=None)
    except RuntimeError as e:
        result(later=type(e).__name__)
    os._exit(0)


def no_finalize() -> None:
    """Communicators created back to back from MASTER_ADDR/PORT (rank 0 serves the store and
    releases the port after init); the last one is dropped without finalize()."""
    for i in range(3):
        comm = make(f"b2b_{i}", 30.0, abort=True)
        healthy_round(comm)
        if i < 2:
            comm.finalize()
    del comm
    result(clean_exit=True)


if __name__ == "__main__":
    {
        "killed": killed,
        "timeout": timeout,
        "abort_process": abort_process,
        "watchdog": watchdog,
        "no_finalize": no_finalize,
    }[
        sys.argv[1]
    ]()
