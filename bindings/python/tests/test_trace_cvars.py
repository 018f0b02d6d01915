"""``comm.dump_trace()`` writes the communicator's colltrace as JSON (the Rust API's
``Comm::dump_trace``), and the Python package's knobs come from the cvars: declared defaults,
the ``TORCHCOMMS_CONFIG`` file, the environment, with validation."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch

import torchcomms
from conftest import RANK, WORLD
from torchcomms import ReduceOp, _comms, objcol


def test_dump_trace_writes_this_comm_as_json(fresh: Any, tmp_path: Any) -> None:
    comm = fresh("dumped")
    t = torch.ones(3, dtype=torch.float32)
    comm.all_reduce(t, ReduceOp.MAX, async_op=False)
    comm.barrier(async_op=True).wait()
    path = comm.dump_trace(tmp_path / "traces")
    assert os.path.dirname(path) == str(tmp_path / "traces")
    assert os.path.basename(path).startswith(f"colltrace_rank{RANK}_{comm.get_name()}_")
    with open(path) as f:
        dump = json.load(f)
    assert (dump["schema"], dump["version"]) == ("torchcomms-colltrace", 1)
    assert (dump["rank"], dump["trigger"], dump["reason"]) == (RANK, "api", "TorchComm.dump_trace")
    assert len(dump["comms"]) == 1, "only this communicator"
    c = dump["comms"][0]
    assert (c["name"], c["rank"], c["size"]) == (comm.get_name(), RANK, WORLD)
    colls = [r for r in c["records"] if r["kind"] == "collective"]
    ar, bar = colls[-2], colls[-1]
    assert (ar["op"], ar["dtype"], ar["count"], ar["reduce_op"]) == ("all_reduce", "f32", 3, "max")
    assert (ar["async_op"], ar["state"], ar["in_bytes"]) == (False, "completed", 12)
    assert (bar["op"], bar["seq"], bar["async_op"], bar["state"]) == ("barrier", ar["seq"] + 1, True, "completed")
    assert c["collective"]["completed"] == bar["seq"]
    assert ar["enqueued_ns"] <= ar["started_ns"] <= ar["ended_ns"]


def test_dump_trace_defaults_to_the_trace_dir_and_says_when_tracing_is_off(
    tmp_path: Any, monkeypatch: Any
) -> None:
    # Every rank creates these communicators, in the same order.
    monkeypatch.setenv("TORCHCOMMS_TRACE_DIR", str(tmp_path / "default"))
    comm = torchcomms.new_comm("ctran", "cpu", "dump_default", abort_process_on_timeout_or_error=False)
    comm.barrier(async_op=False)
    path = comm.dump_trace()
    assert os.path.dirname(path) == str(tmp_path / "default")
    with open(path) as f:
        assert json.load(f)["comms"][0]["name"] == "dump_default"
    comm.finalize()

    monkeypatch.setenv("TORCHCOMMS_TRACE_BUFFER_SIZE", "0")
    off = torchcomms.new_comm("ctran", "cpu", "dump_untraced", abort_process_on_timeout_or_error=False)
    with pytest.raises(RuntimeError, match="TORCHCOMMS_TRACE_BUFFER_SIZE=0"):
        off.dump_trace(tmp_path)
    off.finalize()


KNOBS = [
    "TORCHCOMMS_SERIALIZATION",
    "TORCHCOMMS_PATCH_FOR_COMPILE",
    "TORCHCOMM_FR_BUFFER_SIZE",
    "TORCHCOMM_HEALTH_CHECK_WAIT_MS",
    "TORCHCOMM_FR_DUMP_TEMP_FILE",
    "TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME",
    "TORCHCOMMS_LOG",
]


def test_python_knobs_come_from_the_cvars(tmp_path: Any, monkeypatch: Any) -> None:
    for k in KNOBS + ["TORCHCOMMS_CONFIG"]:
        monkeypatch.delenv(k, raising=False)
    # The defaults declared in cvars/cvars.toml, typed.
    assert _comms._cvar("TORCHCOMMS_SERIALIZATION") == "torch"
    assert _comms._cvar("TORCHCOMMS_PATCH_FOR_COMPILE") is False
    assert _comms._cvar("TORCHCOMM_FR_BUFFER_SIZE") == 2000
    assert _comms._cvar("TORCHCOMM_HEALTH_CHECK_WAIT_MS") is None
    assert _comms._cvar("TORCHCOMM_FR_DUMP_TEMP_FILE") is None
    assert _comms._cvar("TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME") is False
    assert _comms._cvar("TORCHCOMMS_LOG") == "error"

    # The configuration file applies; the environment overrides it.
    cfg = tmp_path / "torchcomms.toml"
    cfg.write_text(
        'TORCHCOMMS_SERIALIZATION = "pickle"\n'
        'TORCHCOMM_HEALTH_CHECK_WAIT_MS = "250ms"\n'
        "TORCHCOMM_FR_BUFFER_SIZE = 7\n"
        "TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME = true\n"
        f'TORCHCOMM_FR_DUMP_TEMP_FILE = "{tmp_path / "fr.pkl"}"\n'
    )
    monkeypatch.setenv("TORCHCOMMS_CONFIG", str(cfg))
    assert _comms._cvar("TORCHCOMMS_SERIALIZATION") == "pickle"
    assert _comms._cvar("TORCHCOMM_HEALTH_CHECK_WAIT_MS") == pytest.approx(0.25)
    assert _comms._cvar("TORCHCOMM_FR_BUFFER_SIZE") == 7
    monkeypatch.setenv("TORCHCOMM_FR_BUFFER_SIZE", "9")
    assert _comms._cvar("TORCHCOMM_FR_BUFFER_SIZE") == 9
    # The package's readers see the file: objcol's serialization, the flight recorder's path.
    objcol._use_pickle.cache_clear()
    try:
        assert objcol._use_pickle()
    finally:
        objcol._use_pickle.cache_clear()
    from torchcomms.hooks.fr import _dump_file, _Recorder

    assert _dump_file(_Recorder(4), RANK, include_completed=True) == str(tmp_path / "fr.pkl")

    # Invalid values name the variable, the value, where it came from and what is allowed;
    # an invalid value of another variable does not break this lookup.
    monkeypatch.setenv("TORCHCOMMS_SERIALIZATION", "json")
    with pytest.raises(ValueError, match=r'"json" for TORCHCOMMS_SERIALIZATION \(from environment\).*torch, pickle'):
        _comms._cvar("TORCHCOMMS_SERIALIZATION")
    assert _comms._cvar("TORCHCOMM_FR_BUFFER_SIZE") == 9
    monkeypatch.setenv("TORCHCOMMS_PATCH_FOR_COMPILE", "maybe")
    with pytest.raises(ValueError, match="TORCHCOMMS_PATCH_FOR_COMPILE"):
        _comms._cvar("TORCHCOMMS_PATCH_FOR_COMPILE")
    cfg.write_text("TORCHCOMM_FR_BUFFER_SIZE = -3\n")
    monkeypatch.delenv("TORCHCOMM_FR_BUFFER_SIZE")
    with pytest.raises(ValueError, match=f"TORCHCOMM_FR_BUFFER_SIZE.*{cfg}"):
        _comms._cvar("TORCHCOMM_FR_BUFFER_SIZE")
    with pytest.raises(ValueError, match="TORCHCOMMS_NO_SUCH_KNOB is not a declared cvar"):
        _comms._cvar("TORCHCOMMS_NO_SUCH_KNOB")
