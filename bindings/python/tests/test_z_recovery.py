"""Surviving a failure without restarting: 4 ranks train (recovery_job.py), one is killed with
SIGKILL at a random step, the survivors catch the error, reconfigure onto the three of them and
go on; a new process joins later (grow back to 4). Checked: the survivors' parameters equal those
of a 3-rank run started from the failed step, every member ends with the same parameters, the
time from the error to the first successful collective of the new communicator, and nothing
left in /dev/shm. Rank 0 of the torchrun job launches it (it starts its own processes, which
torchrun would tear down when one dies); ``TORCHCOMMS_TEST_FAULTS=0`` skips it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import tempfile
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch.distributed import TCPStore

from jobs import clean_env, collect, spawn

RANK = int(os.environ.get("RANK", "0"))

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "recovery_job.py")


def _run(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    return [(rc, text) for rc, text, _ in collect(procs, timeout)]


def _read(prefix: str, who: str) -> dict[str, Any]:
    with open(f"{prefix}.{who}") as f:
        return json.load(f)


def test_survivors_shrink_continue_and_grow_back() -> None:
    if os.environ.get("TORCHCOMMS_TEST_FAULTS", "1") == "0":
        pytest.skip("fault jobs disabled by TORCHCOMMS_TEST_FAULTS=0 (scripts/test-python.sh runs them once)")
    if RANK != 0:
        pytest.skip("the recovery job is launched by rank 0 only (it starts its own processes)")
    run_recovery(cuda=False)


def run_recovery(cuda: bool) -> list[float]:
    """Runs the job (on GPUs with ``cuda``) and checks it; returns each survivor's seconds from
    the error to the end of its first successful step on the new communicator."""
    flag = ["--cuda"] if cuda else []
    rng = random.Random()
    kill_rank, kill_step = rng.randrange(4), rng.randrange(1, 5)
    grow_step = kill_step + 3
    shm_before = set(os.listdir("/dev/shm"))
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))
    port = str(server.port)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r")

        def launch(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
            return spawn(JOB, [*flag, *args], env or clean_env())

        train = [launch("train", str(r), "4", port, out, str(kill_rank), str(kill_step), str(grow_step)) for r in range(4)]
        # The newcomer takes the GPU the killed rank freed, so on 4 GPUs every communicator has
        # one process per GPU (NVLink).
        joiner = launch("join", port, out, str(kill_rank))
        results = _run(train + [joiner], timeout=150)
        where = f"kill rank {kill_rank} at step {kill_step}, grow at step {grow_step}"
        for r, (code, text) in enumerate(results[:4]):
            if r == kill_rank:
                assert code == -9, f"{where}: rank {r} should have been killed:\n{text}"
            else:
                assert code == 0, f"{where}: survivor {r} failed:\n{text}"
        assert results[4][0] == 0, f"{where}: the joiner failed:\n{results[4][1]}"

        survivors = [r for r in range(4) if r != kill_rank]
        reports = [_read(out, f"train{r}") for r in survivors] + [_read(out, "join")]
        for rep in reports[:3]:
            assert rep["failed_step"] == kill_step and rep["size_after"] == 3, (where, rep)
            assert rep["final_size"] == 4, (where, rep)
            # Goal: error to first successful collective of the new communicator within 2 s
            # (measured and recorded in docs/recovery.md; a loose bound here for slow machines).
            assert rep["recovered_s"] < 10.0, (where, rep["recovered_s"])
        assert reports[3]["final_size"] == 4
        for rep in reports:
            assert rep["cuda_bytes_held"] == [0, 0], f"{where}: {rep['who']} still holds {rep['cuda_bytes_held']}"
        finals = [rep["params"] for rep in reports]
        assert all(f == finals[0] for f in finals), f"{where}: members ended with different parameters"

        # Reference: a fresh 3-rank job from the failed step's parameters to the grow step.
        start = f"{out}.start{kill_step}.{survivors[0]}"
        ref_server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
        ref = [
            launch(
                "resume", str(r), "3", str(ref_server.port), out, str(kill_step), str(grow_step), start,
                env=clean_env(TORCHCOMM_RANK=str(r), TORCHCOMM_SIZE="3"),
            )
            for r in range(3)
        ]
        for r, (code, text) in enumerate(_run(ref, timeout=90)):
            assert code == 0, f"reference rank {r} failed:\n{text}"
        want = _read(out, "ref0")["params"]
        for r in survivors:
            got = [p.flatten().tolist() for p in torch.load(f"{out}.grow{grow_step}.{r}")]
            for g, w in zip(got, want):
                assert torch.allclose(torch.tensor(g), torch.tensor(w), atol=1e-6), f"{where}: survivor {r}"
        took = [rep["recovered_s"] for rep in reports[:3]]
        print(f"recovery ({where}): {[round(t, 3) for t in took]} s from the error")
    leaked = set(os.listdir("/dev/shm")) - shm_before
    assert not leaked, f"left in /dev/shm: {sorted(leaked)}"
    return took
