"""``comm.dump_trace()`` writes the communicator's colltrace as JSON (the Rust API's
``Comm::dump_trace``)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch

import torchcomms
from conftest import RANK, WORLD
from torchcomms import ReduceOp


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
