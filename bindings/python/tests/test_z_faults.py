"""Faults: a killed rank, a timeout, abort_process_on_timeout_or_error, destruction without
finalize. Each test launches its own small job (fault_job.py) as separate processes, so a rank
can die without taking the pytest session with it. Rank 0 launches them (the other ranks of the
torchrun job skip, saying so); the file runs last so the others wait for it at the end.
Set ``TORCHCOMMS_TEST_FAULTS=0`` to skip them (scripts/test-python.sh runs them once).
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from conftest import RANK
from jobs import clean_env, collect, free_port, spawn
from jobs import results as result_lines


def launch(
    scenario: str, size: int, timeout: float = 90.0, args: tuple[str, ...] = ()
) -> list[tuple[int, str, list[dict[str, Any]]]]:
    """Runs ``size`` ranks of ``scenario``; returns (returncode, output, results) per rank."""
    if os.environ.get("TORCHCOMMS_TEST_FAULTS", "1") == "0":
        pytest.skip("fault jobs disabled by TORCHCOMMS_TEST_FAULTS=0 (scripts/test-python.sh runs them once)")
    if RANK != 0:
        pytest.skip("fault jobs are launched by rank 0 only (they start their own processes)")
    env = clean_env(
        ("TORCHELASTIC_", "RANK", "LOCAL_", "GROUP_", "ROLE_", "WORLD_SIZE"),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        TORCHCOMM_SIZE=str(size),
    )
    procs = [
        spawn("fault_job.py", [scenario, *args], dict(env, TORCHCOMM_RANK=str(r)))
        for r in range(size)
    ]
    done = collect(procs, timeout)
    ended[:] = [t for _, _, t in done]
    return [(rc, text, result_lines(text)) for rc, text, _ in done]


# When launch() saw each rank's process end (an upper bound of its exit time).
ended: list[float] = []


def merged(results: list[dict[str, Any]]) -> dict[str, Any]:
    m: dict[str, Any] = {}
    for r in results:
        m.update(r)
    return m


def test_killed_rank_survivors_raise_within_timeout() -> None:
    ranks = launch("killed", 3)
    assert ranks[2][0] == -signal.SIGKILL, ranks[2][1]
    for rc, text, results in ranks[:2]:
        assert rc == 0, text
        r = merged(results)
        assert r["raised"] == "RuntimeError", text
        assert r["elapsed"] < r["timeout"], f"took {r['elapsed']:.1f}s, timeout {r['timeout']}s"
        assert "all_reduce" in r["msg"] and "rank" in r["msg"], r["msg"]
        assert r["later"] == "RuntimeError" and r["finalized"], text
        assert r["healthy"] is False, text  # torchcomms_health_check reports the failure
        assert text.count("ABORT_HOOK") == 1, text  # abort hooks run once per communicator


def test_timeout_raises_timeout_error() -> None:
    rc, text, results = launch("timeout", 2)[0]
    assert rc == 0, text
    r = merged(results)
    assert r["raised"] == "CommTimeoutError" and r["is_runtime_error"], text
    assert r["timeout"] <= r["elapsed"] < r["timeout"] + 5, text
    assert "all_reduce" in r["msg"] and "rank 0" in r["msg"], r["msg"]
    assert "ABORT_HOOK rank 0" in text
    # The flight recorder has the engine's verdict on the operation that timed out.
    fr = r["fr_last"]
    assert fr["profiling_name"] == "ctran:all_reduce" and fr["engine_state"] == "timed_out", fr
    assert fr["state"] == "started" and fr["retired"] and fr["error"], fr


def test_abort_process_on_error_runs_abort_hook_then_aborts() -> None:
    ranks = launch("abort_process", 2)
    rc, text, results = ranks[0]
    assert rc == -signal.SIGABRT, f"exit {rc}\n{text}"
    assert "ABORT_HOOK rank 0" in text
    assert "aborting the process" in text
    assert not results  # never reached "survived"


@pytest.mark.parametrize("mode", ["timeout", "killed"])
def test_watchdog_aborts_on_async_failure_nobody_waits_for(mode: str) -> None:
    """abort_process_on_timeout_or_error: the process aborts when the failure reaches the
    watchdog, even though Python never waits on the failed work (upstream's semantics)."""
    ranks = launch("watchdog", 2, args=(mode,))
    rc, text, results = ranks[0]
    assert rc == -signal.SIGABRT, f"exit {rc}\n{text}"
    assert "ABORT_HOOK rank 0" in text, text
    assert "(watchdog)" in text and "aborting the process" in text, text
    r = merged(results)
    assert "survived" not in r, text
    # Aborted within the op's timeout (2 s) plus margins, long before the 15 s of Python work.
    assert ended[0] - r["issued"] < 12, f"aborted {ended[0] - r['issued']:.1f}s after the issue\n{text}"


def test_watchdog_off_lets_the_process_run_on() -> None:
    rc, text, results = launch("watchdog", 2, args=("off",))[0]
    assert rc == 0, text
    r = merged(results)
    assert r["survived"] and r["healthy"] is False, text
    assert r["later"] == "RuntimeError", text
    assert "ABORT_HOOK rank 0" in text  # the hooks still ran, once, when the failure surfaced


def test_back_to_back_comms_and_no_finalize_do_not_abort() -> None:
    for rc, text, results in launch("no_finalize", 2):
        assert rc == 0, text
        assert merged(results).get("clean_exit"), text
        assert "ABORT_HOOK" not in text
