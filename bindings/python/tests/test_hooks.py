"""Pre/post/abort hooks with one process-wide op id (§12), and the hooks package (§17):
FlightRecorderHook, clog, NanCheckHook."""

from __future__ import annotations

import json
import os
import pickle
from typing import Any

import pytest
import torch

import torchcomms
from conftest import RANK, WORLD
from torchcomms import ReduceOp
from torchcomms._comms import OpName
from torchcomms.hooks import FlightRecorderHook, NanCheckHook, clog

FINALIZE_OP_ID = 2**64 - 1


class Recorder:
    def __init__(self) -> None:
        self.pre: list[tuple[OpName, int, Any]] = []
        self.post: list[tuple[int, Any]] = []

    def attach(self, comm: Any) -> tuple[Any, Any]:
        return (
            comm.register_pre_hook(lambda name, op_id, args: self.pre.append((name, op_id, args))),
            comm.register_post_hook(lambda op_id, args: self.post.append((op_id, args))),
        )


def test_pre_and_post_hooks_see_every_op(fresh: Any) -> None:
    comm = fresh("hooks")
    rec = Recorder()
    rec.attach(comm)
    t = torch.ones(4)
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    out = [torch.empty(4) for _ in range(WORLD)]
    comm.all_gather(out, t, async_op=True).wait()
    comm.broadcast(t, 0, async_op=False)
    comm.barrier(async_op=True).wait()
    names = [p[0] for p in rec.pre]
    assert names == [OpName.all_reduce, OpName.all_gather, OpName.broadcast, OpName.barrier]
    ids = [p[1] for p in rec.pre]
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert [p[0] for p in rec.post] == ids  # post hooks pair with the same op id
    name, _, args = rec.pre[0]
    assert args.tensor is t and args.async_op is False
    assert not hasattr(args, "op"), "the ReduceOp is never exposed"
    _, _, args = rec.pre[1]
    assert args.input is t and len(args.output) == WORLD and args.async_op is True
    _, _, args = rec.pre[2]
    assert args.root == 0
    assert type(rec.post[0][1]).__name__ == "CollectivePostHookArgs"


def test_op_ids_are_process_wide(fresh: Any) -> None:
    a, b = fresh("ids_a"), fresh("ids_b")
    ra, rb = Recorder(), Recorder()
    ra.attach(a)
    rb.attach(b)
    a.barrier(async_op=False)
    b.barrier(async_op=False)
    a.barrier(async_op=False)
    ids = [ra.pre[0][1], rb.pre[0][1], ra.pre[1][1]]
    assert ids[0] < ids[1] < ids[2], ids
    assert ids[1] - ids[0] == 1 and ids[2] - ids[1] == 1


def test_finalize_hooks_use_max_op_id_and_consume_none() -> None:
    # A comm of its own (fresh() would finalize it again).
    comm = torchcomms.new_comm("ctran", "cpu", "hook_finalize", abort_process_on_timeout_or_error=False)
    rec = Recorder()
    rec.attach(comm)
    before = torchcomms._comms._peek_next_op_id()
    comm.finalize()
    assert rec.pre[0][0] == OpName.finalize and rec.pre[0][1] == FINALIZE_OP_ID
    assert rec.post[0][0] == FINALIZE_OP_ID
    assert torchcomms._comms._peek_next_op_id() == before
    assert type(rec.pre[0][2]).__name__ == "FinalizePreHookArgs"


def test_hook_args_of_every_kind(fresh: Any) -> None:
    comm = fresh("hook_kinds")
    rec = Recorder()
    rec.attach(comm)
    n = WORLD
    t = torch.ones(n * 2)
    comm.reduce_scatter_single(torch.empty(2), t, ReduceOp.SUM, False)
    comm.all_to_all_v_single(torch.empty(n), torch.ones(n), [1] * n, [1] * n, False)
    comm.scatter(torch.empty(1), [torch.ones(1)] * n if RANK == 0 else [], 0, False)
    comm.gather([torch.empty(1)] * n if RANK == 0 else [], torch.ones(1), 0, False)
    child = comm.split(list(range(n)), "hook_kinds_child")
    batch = comm.batch_op_create()
    if n > 1:
        batch.send(torch.ones(1), (RANK + 1) % n)
        batch.recv(torch.empty(1), (RANK - 1) % n)
        batch.issue(False)
    kinds = {p[0]: p[2] for p in rec.pre}
    rs = kinds[OpName.reduce_scatter_single]
    assert rs.input is t and rs.output.numel() == 2
    a2a = kinds[OpName.all_to_all_v_single]
    assert list(a2a.input_split_sizes) == [1] * n and list(a2a.output_split_sizes) == [1] * n
    assert kinds[OpName.scatter].root == 0 and kinds[OpName.gather].root == 0
    sp = kinds[OpName.split]
    assert list(sp.ranks) == list(range(n)) and sp.name == "hook_kinds_child"
    if n > 1:
        bi = kinds[OpName.batch_op_issue]
        assert bi.num_ops == 2 and bi.async_op is False
        assert type(rec.post[-1][1]).__name__ == "BatchOpIssuePostHookArgs"
    # Hooks are not inherited by split children.
    count = len(rec.pre)
    child.barrier(async_op=False)
    assert len(rec.pre) == count
    child.finalize()


def test_remove_hook(fresh: Any) -> None:
    comm = fresh("hook_remove")
    rec = Recorder()
    pre_h, post_h = rec.attach(comm)
    comm.barrier(async_op=False)
    pre_h.remove()
    post_h.remove()
    pre_h.remove()  # idempotent
    comm.barrier(async_op=False)
    assert len(rec.pre) == 1 and len(rec.post) == 1


def test_pre_hook_exception_stops_the_op(fresh: Any) -> None:
    comm = fresh("hook_raise")

    def boom(name: Any, op_id: int, args: Any) -> None:
        raise KeyError("from the hook")

    h = comm.register_pre_hook(boom)
    with pytest.raises(KeyError, match="from the hook"):
        comm.all_reduce(torch.ones(1), ReduceOp.SUM, async_op=False)
    h.remove()
    t = torch.ones(1)
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)  # nothing was issued before: still aligned
    assert t.item() == WORLD


def test_nan_check_falls_back_to_isnan_without_the_c10d_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch without ``torch.ops.c10d.check_for_nan`` (2.11 on the GPU machines): every call,
    not only the first, checks with ``torch.isnan``."""
    from torchcomms.hooks.nan_check import nan_check

    monkeypatch.setattr(nan_check, "_check_for_nan", False)
    assert nan_check._has_nan(torch.tensor([1.0, float("nan")]))
    assert not nan_check._has_nan(torch.ones(2))


def test_nan_check_hook(fresh: Any) -> None:
    comm = fresh("nan")
    hook = NanCheckHook()
    assert not hook.is_enabled()
    hook.register_with_comm(comm)
    assert hook.is_enabled()
    bad = torch.tensor([1.0, float("nan")])
    with pytest.raises(RuntimeError, match=r"NaN detected in input tensor for 'all_reduce' on comm 'nan\d+'"):
        comm.all_reduce(bad, ReduceOp.SUM, async_op=False)
    good = torch.ones(2)
    comm.all_reduce(good, ReduceOp.SUM, async_op=False)
    # Integers are never checked; outputs only when asked.
    comm.all_reduce(torch.ones(2, dtype=torch.int32), ReduceOp.SUM, async_op=False)
    out = [torch.full((2,), float("nan")) for _ in range(WORLD)]
    comm.all_gather(out, good, async_op=False)
    hook2 = NanCheckHook(check_inputs=False, check_outputs=True)
    hook2.register_with_comm(comm)
    out = [torch.full((2,), float("nan")) for _ in range(WORLD)]
    with pytest.raises(RuntimeError, match="NaN detected in output tensor for 'all_gather'"):
        comm.all_gather(out, good, async_op=False)


def test_flight_recorder_entries(fresh: Any) -> None:
    comm = fresh("fr")
    fr = FlightRecorderHook(max_entries=100, isolated=True)
    assert fr.size() == 0 and not fr.is_enabled()
    data = json.loads(fr.dump_json())
    assert data["version"] == "2.10" and "pg_config" in data and "pg_status" in data
    assert "entries" not in data
    fr.register_with_comm(comm)
    assert fr.is_enabled()
    t = torch.rand(10, 10)
    comm.all_reduce(t, op=ReduceOp.SUM, async_op=False)
    w = comm.all_gather_single(torch.empty(WORLD * 3, dtype=torch.int64), torch.ones(3, dtype=torch.int64), async_op=True)
    w.wait()
    assert fr.size() == 2 and len(fr) == 2
    data = json.loads(fr.dump_json())
    assert data["rank"] == RANK
    e0, e1 = data["entries"]
    for e in (e0, e1):
        for field in (
            "record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id",
            "profiling_name", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes",
            "time_created_ns", "state", "is_p2p", "retired", "timeout_ms",
        ):
            assert field in e, field
        assert e["state"] == "completed"  # real completion, also for the async one
        assert e["timeout_ms"] > 0
    assert e0["profiling_name"] == "ctran:all_reduce" and e0["op_id"] == 0  # isolated: ids reset
    assert e0["input_sizes"] == [[10, 10]] and e0["input_dtypes"] == ["Float"]
    assert e0["output_sizes"] == [[10, 10]]  # in place: listed as both
    assert e1["input_dtypes"] == ["Long"] and e1["output_sizes"] == [[WORLD * 3]]
    assert e1["collective_seq_id"] == e0["collective_seq_id"] + 1
    assert e0["red_op"] == "SUM"
    assert data["pg_config"][comm.get_name()]["desc"] == "ctran"
    assert json.loads(fr.dump_json(include_completed=False)).get("entries") is None
    fr.reset()
    assert fr.size() == 0
    comm.barrier(async_op=False)
    assert fr.size() == 1


def test_flight_recorder_dump_file_and_split(fresh: Any, tmp_path: Any, monkeypatch: Any) -> None:
    comm = fresh("fr_file")
    fr = FlightRecorderHook(isolated=True)
    fr.register_with_comm(comm)
    child = comm.split(list(range(WORLD)), "fr_child")
    child.barrier(async_op=False)  # split children register automatically
    monkeypatch.setenv("TORCHCOMM_FR_DUMP_TEMP_FILE", str(tmp_path / "trace_rank_"))
    path = fr.dump_file(RANK)
    assert path.endswith(f"trace_rank_{RANK}")
    with open(path, "rb") as f:
        data = pickle.load(f)
    assert "fr_child" in data["pg_config"]
    names = [e["profiling_name"] for e in data["entries"]]
    assert names == ["ctran:barrier"]  # split itself is not an entry
    monkeypatch.setenv("TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME", "1")
    monkeypatch.setenv("TORCHCOMM_FR_DUMP_TEMP_FILE", str(tmp_path / "exact.pkl"))
    assert fr.dump_file(RANK) == str(tmp_path / "exact.pkl")
    assert os.path.exists(tmp_path / "exact.pkl")
    child.finalize()


def test_clog(tmp_path: Any) -> None:
    comm = torchcomms.new_comm("ctran", "cpu", "clog_comm", abort_process_on_timeout_or_error=False)
    path = tmp_path / "clog.log"
    log = clog(str(path), events=["ALL"], verbose=["buffers"])
    log.register_with_comm(comm)
    with pytest.raises(RuntimeError, match="already registered"):
        log.register_with_comm(comm)
    t = torch.ones(8)
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)  # same signature: same correlation id
    w = comm.all_reduce(t, ReduceOp.MAX, async_op=True)
    w.wait()
    comm.barrier(async_op=True)  # never waited: reported as leaked
    child = comm.split(list(range(WORLD)), "clog_child")
    child.finalize()
    comm.finalize()
    lines = path.read_text().splitlines()
    assert lines[0].startswith("V|1|base_timestamp=")
    assert lines[1] == f"new_comm|comm=clog_comm|rank={RANK}|world_size={WORLD}"
    sigs = [ln for ln in lines if "|sig|" in ln]
    assert sigs[0].startswith("C0|sig|all_reduce|in_count=8|out_count=8|dtype=f32|red_op=sum|async_op=f|buf=0x")
    assert sigs[0].endswith("|comm=clog_comm")
    assert any("red_op=max|async_op=t" in s for s in sigs)
    assert len([ln for ln in lines if ln.startswith("C0|Q|")]) == 2
    assert any(ln.startswith("C0|S|") for ln in lines) and any(ln.startswith("C0|E|") for ln in lines)
    assert any("|W|" in ln for ln in lines)
    assert any(ln.startswith("split|parent=clog_comm|child=clog_child|ranks=") for ln in lines)
    assert any(ln.startswith("new_comm|comm=clog_child") for ln in lines)
    assert any(ln.startswith("WARN|comm=clog_comm|leaked work_id=") for ln in lines)


def test_flight_recorder_reads_the_engine_trace(fresh: Any) -> None:
    """Entries of a ctran communicator carry the engine's record of the operation: its state,
    start/end times, sequence number, algorithm and transport; engine-internal collectives
    (the split's exchange) are not mistaken for the user's operations."""
    comm = fresh("fr_engine")
    fr = FlightRecorderHook(max_entries=100, isolated=True)
    fr.register_with_comm(comm)
    child = comm.split(list(range(WORLD)), "fr_engine_child")
    t = torch.ones(64)
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    w = comm.all_gather_single(torch.empty(WORLD * 64), t, async_op=True)
    w.wait()
    comm.barrier(async_op=False)
    entries = [
        e for e in json.loads(fr.dump_json())["entries"] if e["process_group"][0] == comm.get_name()
    ]
    assert [e["profiling_name"] for e in entries] == ["ctran:all_reduce", "ctran:all_gather_single", "ctran:barrier"]
    for e in entries:
        assert e["engine_state"] == "completed" and e["state"] == "completed" and e["retired"], e
        assert 0 < e["time_discovered_started_ns"] <= e["time_discovered_completed_ns"], e
        assert e["duration_ms"] >= 0 and "algorithm" in e and "transport" in e
        assert e["time_created_ns"] - 10**6 <= e["time_discovered_started_ns"]
    seqs = [e["pg_seq_id"] for e in entries]
    assert seqs == [seqs[0], seqs[0] + 1, seqs[0] + 2], seqs
    child.finalize()


def test_flight_recorder_without_engine_trace_uses_the_work() -> None:
    """Backends without colltrace (fake) still get entries, completed through their work."""
    comm = torchcomms.new_comm("fake", "cpu", "fr_fake")
    fr = FlightRecorderHook(isolated=True)
    fr.register_with_comm(comm)
    comm.all_reduce(torch.ones(2), ReduceOp.SUM, async_op=True)
    (e,) = json.loads(fr.dump_json())["entries"]
    assert e["profiling_name"] == "fake:all_reduce" and e["state"] == "completed"
    assert "engine_state" not in e
    comm.finalize()


def test_hook_modules_under_comms() -> None:
    """Upstream's binding names: torchcomms._comms.hooks.{fr,clog}."""
    from torchcomms._comms.hooks import clog as clog_mod
    from torchcomms._comms.hooks import fr as fr_mod

    assert fr_mod.FlightRecorderHook is FlightRecorderHook
    assert clog_mod.clog is clog
    assert torchcomms._comms.hooks.fr.FlightRecorderHook is torchcomms.hooks.fr.FlightRecorderHook


def _post(sock: str, path: str) -> tuple[int, bytes]:
    import http.client
    import socket

    class Conn(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.settimeout(30)
            self.sock.connect(sock)

    c = Conn("localhost", timeout=30)
    c.request("POST", path)
    r = c.getresponse()
    return r.status, r.read()


def test_debug_server_handlers(fresh: Any, monkeypatch: Any) -> None:
    """The control-plane handlers answer through torch's worker server (what
    torch.distributed.debug.start_debug_server runs on every rank)."""
    import tempfile
    import time

    from torch._C._distributed_c10d import _WorkerServer

    comm = fresh("fr_debug")
    fr = FlightRecorderHook()  # the shared recorder, which the handlers dump
    fr.register_with_comm(comm)
    comm.barrier(async_op=False)
    d = tempfile.mkdtemp(prefix="tcdbg")
    sock = os.path.join(d, "ws.sock")
    server = _WorkerServer(sock)
    try:
        status, body = _post(sock, "/handler/torchcomms_fr_trace_json")
        assert status == 200, body
        data = json.loads(body)
        mine = [e for e in data.get("entries", []) if e["process_group"][0] == comm.get_name()]
        assert [e["profiling_name"] for e in mine] == ["ctran:barrier"] and mine[0]["state"] == "completed"
        status, body = _post(sock, "/handler/torchcomms_fr_trace_json?onlyactive=true")
        assert status == 200
        assert not [e for e in json.loads(body).get("entries", []) if e["state"] == "completed"]
        status, body = _post(sock, "/handler/torchcomms_fr_trace_json?includecollectives=false")
        assert status == 200 and "entries" not in json.loads(body)
        status, body = _post(sock, "/handler/torchcomms_fr_trace_json?onlyactive=maybe")
        assert status == 400, body
        status, body = _post(sock, "/handler/torchcomms_health_check")
        assert status == 200 and json.loads(body) == {"healthy": True}
        monkeypatch.setenv("TORCHCOMM_FR_DUMP_TEMP_FILE", os.path.join(d, "fr_rank_"))
        status, body = _post(sock, "/handler/torchcomms_fr_dump_file")
        assert status == 200, body
        target = os.path.join(d, f"fr_rank_{RANK}")
        deadline = time.monotonic() + 60
        while not os.path.exists(target):
            assert time.monotonic() < deadline, "torchcomms_fr_dump_file wrote nothing in 60 s"
            time.sleep(0.05)
        with open(target, "rb") as f:
            assert comm.get_name() in pickle.load(f)["pg_config"]
    finally:
        server.shutdown()
