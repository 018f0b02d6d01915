"""torch.distributed on torchcomms in jobs of their own (dist_job.py): DDP against gloo, FSDP2 on
a 2 x 2 mesh, Inductor-compiled functional collectives, upstream's torchcomms.device_mesh code,
a device map mixing ctran with gloo, torch's own use_torchcomms path, a killed rank and a
stalled one.

Rank 0 of the suite's torchrun job launches them as separate processes (ranks that die must not
take the pytest session with them); the other ranks skip, saying so. They run once, in the
1-rank run of scripts/test-python.sh (``TORCHCOMMS_TEST_JOBS=0`` skips them).
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from conftest import RANK
from jobs import clean_env, collect, free_port, results, spawn


def launch(
    scenario: str, size: int, timeout: float = 240.0
) -> list[tuple[int, str, dict[str, Any]]]:
    """Runs ``size`` ranks of ``scenario`` with torchrun's environment; returns (returncode,
    output, merged results) per rank."""
    if os.environ.get("TORCHCOMMS_TEST_JOBS", "1") == "0":
        pytest.skip(
            "torch.distributed jobs disabled by TORCHCOMMS_TEST_JOBS=0 (scripts/test-python.sh runs them once)"
        )
    if RANK != 0:
        pytest.skip(
            "torch.distributed jobs are launched by rank 0 only (they start their own processes)"
        )
    env = clean_env(
        ("TORCHELASTIC_", "TORCHCOMM_RANK", "TORCHCOMM_SIZE", "GROUP_", "ROLE_"),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(size),
        LOCAL_WORLD_SIZE=str(size),
        OMP_NUM_THREADS="1",
    )
    procs = [
        spawn("dist_job.py", [scenario], dict(env, RANK=str(r), LOCAL_RANK=str(r)))
        for r in range(size)
    ]
    out = []
    for rc, text, _ in collect(procs, timeout):
        merged: dict[str, Any] = {}
        for r in results(text):
            merged.update(r)
        out.append((rc, text, merged))
    return out


def test_training_ddp_matches_gloo_fsdp2_on_2x2_mesh_compiled_funcol() -> None:
    for rc, text, r in launch("training", 4):
        assert rc == 0 and r.get("clean_exit"), text
        # DDP on ctran and on gloo, same model and data, 20 steps: the same parameters.
        assert r["ddp_max_diff"] <= 1e-6, r
        assert r["ddp_rank_spread"] == 0.0, r
        assert r["ddp_last_loss"] < r["ddp_first_loss"], r  # it trained
        # FSDP2 (HSDP on 2 x 2) follows the local model.
        assert r["fsdp_loss_diff"] < 1e-5 and r["fsdp_param_diff"] < 1e-5, r
        assert r["compiled_ok"], r


def test_upstream_device_mesh_code_runs_unchanged() -> None:
    for rc, text, r in launch("upstream", 4):
        assert rc == 0 and r.get("clean_exit"), text
        assert r["ddp_moved"], r
        assert r["fsdp_worst"] < 1e-5, r
        assert r["tp_worst"] < 1e-4, r
        assert r["two_d"] and all(all(v) for v in r["two_d"].values()), r
        assert r["split_ok"], r


def test_cpp_backend_paths_mixed_map_and_use_torchcomms() -> None:
    ranks = launch("backend_paths", 2)
    for rc, text, r in ranks:
        assert rc == 0 and r.get("clean_exit"), text
    r = ranks[0][2]
    if "skipped" in r:
        assert r["mixed_refused"], r  # torch 2.11 refuses a mixed map, saying why
        pytest.skip(r["skipped"])
    for _, text, r in ranks:
        assert r["checks"] and all(r["checks"].values()), r


def test_killed_rank_raises_dist_backend_error_on_every_survivor() -> None:
    ranks = launch("killed", 3)
    assert ranks[2][0] == -signal.SIGKILL, ranks[2][1]
    for rc, text, r in ranks[:2]:
        assert rc == 0, text
        assert r["raised"] is not None and r["is_dist_backend_error"], text
        assert r["elapsed"] < r["timeout"], (
            f"took {r['elapsed']:.1f}s, timeout {r['timeout']}s\n{text}"
        )
        assert "all_reduce" in r["msg"] and "rank" in r["msg"], r["msg"]
        assert r["later_wait"] is not None and r["later_is_dist"], text
        assert r["later_future"] is not None, text


def test_per_op_timeout_raises_dist_timeout() -> None:
    rc, text, r = launch("timeout", 2)[0]
    assert rc == 0, text
    assert r["is_dist_backend_error"] and r["is_timeout_error"], text
    assert 2.0 <= r["elapsed"] < 7.0, text
    assert "all_reduce" in r["msg"] and "rank 0" in r["msg"], r["msg"]
