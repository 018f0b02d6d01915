"""FlightRecorderHook: a record of every operation of the communicators it watches, dumped in
the format of PyTorch's flight recorder (``python -m torch.distributed.flight_recorder.fr_trace``
reads the files ``dump_file`` writes).

The hooks record what Python sees (op id, sizes, dtypes, reduce op, root/peer, async flag);
the engine's colltrace (``torchcomms._comms._colltrace_snapshot()``) supplies what happened to
the operation: at every dump each entry of a ``ctran`` communicator is joined with the engine's
record of the same operation (same communicator, kind and op, enqueued between the entry's pre-
and post-hook, in order), which gives its real state (``scheduled``, ``started``, ``completed``;
a failed or timed-out operation stays ``started`` with ``error`` and ``engine_state`` set), the
engine's start and end times, the duration, the algorithm and transport, and the communicator's
own sequence number (``pg_seq_id``). Entries of backends without colltrace (``fake``, Python
backends) fall back to their work's completion.

Compared with upstream's recorder it also records the rank, the real completion and duration of
CPU operations, the communicator's real timeout, whether an operation is point-to-point, the
reduce op, root/peer and async flag, and it tolerates op ids that are not contiguous.

Control-plane handlers for ``torch.distributed.debug.start_debug_server`` are registered at
import (where this torch has ``_register_handler``): ``torchcomms_fr_trace_json``
(``includecollectives``, ``onlyactive``), ``torchcomms_fr_dump_file`` (single-flight, 503 until
a communicator is registered) and ``torchcomms_health_check`` (``{"healthy": bool}``: false once
any communicator of this process failed or timed out).

Configuration (cvars: the environment or the ``TORCHCOMMS_CONFIG`` file, validated; see
``docs/cvars.md``):
    ``TORCHCOMM_FR_BUFFER_SIZE``: entries of the shared recorder (2000; 0 disables it).
    ``TORCHCOMM_FR_DUMP_TEMP_FILE``: prefix of ``dump_file`` paths (default
    ``$XDG_CACHE_HOME/torch/comm_lib_trace_rank_`` or ``~/.cache/...``); with
    ``TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME=1`` it is re-read at every dump and used as the exact path.
    ``TORCHCOMM_HEALTH_CHECK_WAIT_MS``: when set, the abort hook sleeps this long so a debug
    server can pull a dump before the process aborts.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import sys
import threading
import time
import weakref
from datetime import timedelta
from typing import Any, Optional

import torch

from torchcomms import _comms
from torchcomms._comms import OpName

__all__ = ["FlightRecorderHook"]

_VERSION = "2.10"

_DTYPE_NAMES = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.bool: "Bool",
}

_P2P = {OpName.send, OpName.recv, OpName.batch_op_issue}

# The engine's name of each operation (colltrace's ``op``): the v/single variants run as their
# base collective.
_ENGINE_OP = {
    OpName.all_gather_v: "all_gather",
    OpName.all_gather_single: "all_gather",
    OpName.reduce_scatter_v: "reduce_scatter",
    OpName.reduce_scatter_single: "reduce_scatter",
    OpName.all_to_all_single: "all_to_all",
    OpName.all_to_all_v_single: "all_to_all",
    OpName.gather_single: "gather",
    OpName.all_gather_p_exec: "all_gather",
}

# How far an engine timestamp may sit outside the hooks' window (colltrace may timestamp with
# the TSC, re-anchored to the system clock every second).
_SLACK_NS = 1_000_000

_ENGINE_STATE = {"queued": "scheduled", "started": "started", "completed": "completed"}

# (inputs, outputs) of each operation's pre-hook args: attribute names, "*" marks a list.
_IO = {
    OpName.send: (("tensor",), ()),
    OpName.recv: ((), ("tensor",)),
    OpName.broadcast: (("tensor",), ("tensor",)),
    OpName.all_reduce: (("tensor",), ("tensor",)),
    OpName.reduce: (("tensor",), ("tensor",)),
    OpName.all_gather: (("input",), ("*output",)),
    OpName.all_gather_v: (("input",), ("*output",)),
    OpName.gather: (("input",), ("*output",)),
    OpName.all_gather_single: (("input",), ("output",)),
    OpName.reduce_scatter_single: (("input",), ("output",)),
    OpName.all_to_all_single: (("input",), ("output",)),
    OpName.all_to_all_v_single: (("input",), ("output",)),
    OpName.gather_single: (("input",), ("output",)),
    OpName.reduce_scatter: (("*input",), ("output",)),
    OpName.reduce_scatter_v: (("*input",), ("output",)),
    OpName.scatter: (("*input",), ("output",)),
    OpName.all_to_all: (("*input",), ("*output",)),
    OpName.all_gather_p_exec: (("input",), ()),
}


def _tensors(args: Any, names: tuple[str, ...]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for n in names:
        if n.startswith("*"):
            out.extend(getattr(args, n[1:]))
        else:
            out.append(getattr(args, n))
    return out




class _Recorder:
    """A ring buffer of entries plus the communicators it knows."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max(0, max_entries)
        self.lock = threading.Lock()
        self.entries: collections.deque = collections.deque(maxlen=self.max_entries or 1)
        self.next_record_id = 0
        self.collective_seq = 0
        self.epoch_start = 0  # record ids below this were reset away
        self.pg_config: dict[str, dict[str, str]] = {}
        self.pg_ids: dict[str, int] = {}
        self.rank = -1
        self.healthy = True

    def enabled(self) -> bool:
        return self.max_entries > 0


_GLOBAL: Optional[_Recorder] = None
_GLOBAL_LOCK = threading.Lock()


def _global_recorder() -> _Recorder:
    global _GLOBAL
    with _GLOBAL_LOCK:
        if _GLOBAL is None:
            _GLOBAL = _Recorder(_comms._cvar("TORCHCOMM_FR_BUFFER_SIZE"))
        return _GLOBAL


class FlightRecorderHook:
    """Records every operation of the communicators registered with it.

    Args:
        max_entries: ring buffer size; only used with ``isolated=True`` (shared recorders are
            sized by ``TORCHCOMM_FR_BUFFER_SIZE``), like upstream.
        isolated: use a private recorder (and reset the process-wide op id counter).
    """

    def __init__(self, max_entries: int = 2048, isolated: bool = False) -> None:
        if isolated:
            self._rec = _Recorder(max_entries)
            _comms._reset_op_id_counter()
        else:
            self._rec = _global_recorder()
        self._registered = 0
        self._handles: list[Any] = []

    # ----- registration -----

    def register_with_comm(self, comm: Any, _global_ranks: Optional[list[int]] = None) -> None:
        """Starts recording ``comm``'s operations; communicators split from it are registered
        automatically."""
        rec = self._rec
        name = comm.get_name()
        backend = comm.get_backend()
        ranks = _global_ranks if _global_ranks is not None else list(range(comm.get_size()))
        try:
            timeout_ms = int(comm.get_options().timeout / timedelta(milliseconds=1))
        except Exception:  # noqa: BLE001 (Python backends may lack options)
            timeout_ms = 600000
        trace_id = _colltrace_identity(comm)
        with rec.lock:
            pg_id = rec.pg_ids.setdefault(name, len(rec.pg_ids))
            rec.pg_config[name] = {"name": name, "desc": backend, "ranks": str(ranks)}
            if rec.rank < 0 and _global_ranks is None:
                rec.rank = comm.get_rank()
        pending: dict[int, tuple[Any, list[int]]] = {}
        live: dict[int, dict[str, Any]] = {}

        def pre_hook(op: OpName, op_id: int, args: Any) -> None:
            if op == OpName.finalize or op == OpName.new_window:
                return
            if op == OpName.split:
                pending[op_id] = (args.name, [ranks[r] for r in args.ranks])
                return
            if not rec.enabled():
                return
            ins, outs = _IO.get(op, ((), ()))
            inputs = _tensors(args, ins)
            outputs = _tensors(args, outs)
            entry: dict[str, Any] = {
                "pg_id": pg_id,
                "process_group": [name, backend],
                "thread_id": threading.get_ident(),
                "thread_name": threading.current_thread().name,
                "p2p_seq_id": 0,
                "op_id": op_id,
                "profiling_name": f"{backend}:{op.name}",
                "time_created_ns": time.time_ns(),
                "input_sizes": [list(t.shape) for t in inputs],
                "input_dtypes": [_DTYPE_NAMES.get(t.dtype, str(t.dtype)) for t in inputs],
                "output_sizes": [list(t.shape) for t in outputs],
                "output_dtypes": [_DTYPE_NAMES.get(t.dtype, str(t.dtype)) for t in outputs],
                "state": "scheduled",
                "time_discovered_started_ns": None,
                "time_discovered_completed_ns": None,
                "retired": False,
                "timeout_ms": timeout_ms,
                "is_p2p": op in _P2P,
                "async_op": bool(getattr(args, "async_op", False)),
                "_work": None,
                "_trace": trace_id,
                "_kind": "p2p" if op in _P2P else "collective",
                "_engine_op": _ENGINE_OP.get(op, op.name),
                "_post_ns": None,
            }
            for attr in ("root", "peer"):
                if hasattr(args, attr):
                    entry[attr] = int(getattr(args, attr))
            red = getattr(args, "_op", None)
            if red is not None:
                entry["red_op"] = getattr(getattr(red, "type", None), "name", str(red))
            with rec.lock:
                entry["record_id"] = rec.next_record_id
                rec.next_record_id += 1
                entry["collective_seq_id"] = rec.collective_seq
                rec.collective_seq += 1
                rec.entries.append(entry)
            live[op_id] = entry

        def post_hook(op_id: int, args: Any) -> None:
            if op_id in pending:
                child_name, child_ranks = pending.pop(op_id)
                child = getattr(args, "_new_comm", None)
                if child is not None:
                    self.register_with_comm(child, _global_ranks=child_ranks)
                return
            entry = live.pop(op_id, None)
            if entry is None:
                return
            now = time.time_ns()
            entry["_post_ns"] = now
            entry["duration_ms"] = (now - entry["time_created_ns"]) / 1e6
            entry["time_discovered_started_ns"] = entry["time_created_ns"]
            work = getattr(args, "_work", None)
            if work is not None:
                entry["_work"] = weakref.ref(work)
                if work.is_completed():
                    entry["state"] = "completed"
                    entry["time_discovered_completed_ns"] = now
                    entry["retired"] = True
                else:
                    entry["state"] = "started"

        def abort_hook() -> None:
            rec.healthy = False
            try:
                wait_s = _comms._cvar("TORCHCOMM_HEALTH_CHECK_WAIT_MS")
            except ValueError as e:  # the process is going down: say why, do not wait
                print(f"torchcomms: {e}", file=sys.stderr)
                wait_s = None
            if wait_s:
                time.sleep(wait_s)

        self._handles.append(comm.register_pre_hook(pre_hook))
        self._handles.append(comm.register_post_hook(post_hook))
        self._handles.append(comm.register_abort_hook(abort_hook))
        self._registered += 1

    # ----- state -----

    def is_enabled(self) -> bool:
        """True once registered with a communicator (and the buffer is not disabled)."""
        return self._registered > 0 and self._rec.enabled()

    def size(self) -> int:
        """Entries recorded since the last ``reset()`` (at most the buffer size)."""
        rec = self._rec
        with rec.lock:
            return sum(1 for e in rec.entries if e["record_id"] >= rec.epoch_start)

    def __len__(self) -> int:
        return self.size()

    def reset(self) -> None:
        """Forgets the entries recorded so far (the buffer keeps its size)."""
        rec = self._rec
        with rec.lock:
            rec.epoch_start = rec.next_record_id

    def is_healthy(self) -> bool:
        """False once a registered communicator failed (its abort hook ran)."""
        return self._rec.healthy

    # ----- dumps -----

    def dump_json(self, include_completed: bool = True) -> str:
        """The trace as JSON (entries are omitted when there are none)."""
        return json.dumps(_snapshot(self._rec, include_completed, for_json=True))

    def dump_file(self, rank: int, include_completed: bool = True) -> str:
        """Writes the trace as a pickle (``pickle.load``-able) and returns the path."""
        return _dump_file(self._rec, rank, include_completed)


def _colltrace_comms() -> dict[tuple[str, int, int, int], dict[str, Any]]:
    """The engine's communicators of this process, by (name, instance, rank, size)."""
    try:
        dumps = json.loads(_comms._colltrace_snapshot())
    except Exception:  # noqa: BLE001 (a recorder must dump even if the engine cannot)
        return {}
    out: dict[tuple[str, int, int, int], dict[str, Any]] = {}
    for d in dumps:
        for c in d.get("comms", []):
            out[(c["name"], c["instance"], c["rank"], c["size"])] = c
    return out


def _colltrace_identity(comm: Any) -> Optional[tuple[str, int, int, int]]:
    """The engine trace of ``comm``: its newest instance of that name, rank and size that is
    still running (None for backends without colltrace)."""
    name, rank, size = comm.get_name(), comm.get_rank(), comm.get_size()
    best = None
    for key, c in _colltrace_comms().items():
        if key[0] == name and key[2] == rank and key[3] == size and c.get("state") != "finalized":
            if best is None or key[1] > best[1]:
                best = key
    return best


def _join_engine(entries: list[dict[str, Any]]) -> None:
    """Sets the engine fields of entries of colltrace-backed communicators (see the module
    documentation): each entry takes the first unclaimed engine record of its communicator,
    kind and op that was enqueued within its pre/post-hook window, in order."""
    wanted = {e["_trace"] for e in entries if e.get("_trace") is not None}
    if not wanted:
        return
    comms = _colltrace_comms()
    queues: dict[tuple[Any, str], list[dict[str, Any]]] = {}
    for key in wanted:
        c = comms.get(key)
        if c is None:
            continue
        for r in sorted(c.get("records", []), key=lambda r: r["id"]):
            if r.get("kind") in ("collective", "p2p"):
                queues.setdefault((key, r["kind"]), []).append(r)
    for e in sorted(entries, key=lambda e: e["time_created_ns"]):
        q = queues.get((e.get("_trace"), e["_kind"]))
        if not q or e["_post_ns"] is None:
            continue
        lo, hi = e["time_created_ns"] - _SLACK_NS, e["_post_ns"] + _SLACK_NS
        for i, r in enumerate(q):
            if r["enqueued_ns"] > hi:
                break
            if r["enqueued_ns"] >= lo and r["op"] == e["_engine_op"]:
                del q[: i + 1]  # earlier ones belong to nobody (the engine's own)
                _apply_engine(e, r)
                break


def _apply_engine(e: dict[str, Any], r: dict[str, Any]) -> None:
    state = r.get("state", "queued")
    e["engine_state"] = state
    e["state"] = _ENGINE_STATE.get(state, "started")
    e["pg_seq_id"] = r.get("seq")
    e["colltrace_id"] = r.get("id")
    e["algorithm"] = r.get("algorithm")
    e["transport"] = r.get("transport")
    e["timeout_ms"] = r.get("timeout_ms", e["timeout_ms"])
    started, ended = r.get("started_ns") or 0, r.get("ended_ns") or 0
    e["time_discovered_started_ns"] = started or None
    if state == "completed":
        e["time_discovered_completed_ns"] = ended or None
        e["retired"] = True
    else:
        e["time_discovered_completed_ns"] = None
        e["retired"] = state in ("failed", "timed_out")
    if started and ended:
        e["duration_ms"] = (ended - started) / 1e6
    if r.get("error"):
        e["error"] = r["error"]
    e["_engine"] = True


def _snapshot(rec: "_Recorder", include_completed: bool, for_json: bool) -> dict[str, Any]:
    now = time.time_ns()
    with rec.lock:
        live = [e for e in rec.entries if e["record_id"] >= rec.epoch_start]
    _join_engine(live)
    with rec.lock:
        entries = []
        for e in live:
            ref = e.get("_work")
            work = ref() if ref is not None else None
            if (
                not e.get("_engine")
                and e["state"] != "completed"
                and work is not None
                and work.is_completed()
            ):
                e["state"] = "completed"
                e["time_discovered_completed_ns"] = now
                e["retired"] = True
            if not include_completed and e["state"] == "completed":
                continue
            out = {k: v for k, v in e.items() if not k.startswith("_")}
            if for_json:
                for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
                    if out[k] is None:
                        out[k] = 0
            entries.append(out)
        data: dict[str, Any] = {
            "version": _VERSION,
            "comm_lib_version": "",
            "rank": rec.rank,
            "pg_config": {k: dict(v) for k, v in rec.pg_config.items()},
            "pg_status": {},
        }
    if entries:
        data["entries"] = entries
    return data


def _dump_file(rec: "_Recorder", rank: int, include_completed: bool) -> str:
    path = _comms._cvar("TORCHCOMM_FR_DUMP_TEMP_FILE")
    if path and _comms._cvar("TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME"):
        target = path
    else:
        if not path:
            cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(
                os.path.expanduser("~"), ".cache"
            )
            path = os.path.join(cache, "torch", "comm_lib_trace_rank_")
        target = f"{path}{rank}"
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    data = _snapshot(rec, include_completed, for_json=False)
    tmp = f"{target}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        pickle.dump(data, f)
    os.replace(tmp, target)
    return target


# ----- control-plane handlers (torch.distributed.debug.start_debug_server) -----

_DUMP_LOCK = threading.Lock()
_DUMP_THREAD: Optional[threading.Thread] = None


def _bool_param(req: Any, name: str, default: bool) -> Optional[bool]:
    value = req.get_param(name)
    if value == "":
        return default
    return {"true": True, "false": False}.get(value)


def _handle_trace_json(req: Any, resp: Any) -> None:
    include_collectives = _bool_param(req, "includecollectives", True)
    only_active = _bool_param(req, "onlyactive", False)
    if include_collectives is None or only_active is None:
        resp.set_status(400)
        resp.set_content(
            "Invalid value for includecollectives/onlyactive: valid values are true or false",
            "text/plain",
        )
        return
    data = _snapshot(_global_recorder(), not only_active, for_json=True)
    if not include_collectives:
        data.pop("entries", None)
    resp.set_content(json.dumps(data), "application/json")
    resp.set_status(200)


def _handle_dump_file(req: Any, resp: Any) -> None:
    global _DUMP_THREAD
    rec = _global_recorder()
    rank = rec.rank
    if rank < 0:
        resp.set_status(503)
        resp.set_content(
            "Flight Recorder has not been registered with any communicator yet", "text/plain"
        )
        return
    with _DUMP_LOCK:
        if _DUMP_THREAD is not None and _DUMP_THREAD.is_alive():
            resp.set_status(200)
            resp.set_content(
                f"Flight Recorder dump already in progress for rank {rank}", "text/plain"
            )
            return
        _DUMP_THREAD = threading.Thread(
            target=_dump_file, args=(rec, rank, True), name="torchcomms-fr-dump", daemon=True
        )
        _DUMP_THREAD.start()
    resp.set_status(200)
    resp.set_content(f"Flight Recorder dump started for rank {rank}", "text/plain")


def _handle_health_check(req: Any, resp: Any) -> None:
    healthy = bool(_comms._health_check())
    resp.set_content(json.dumps({"healthy": healthy}), "application/json")
    resp.set_status(200)


def _register_handlers() -> None:
    try:
        from torch._C._distributed_c10d import _register_handler
    except ImportError:  # torch without the control plane (or without distributed)
        return
    _register_handler("torchcomms_fr_trace_json", _handle_trace_json)
    _register_handler("torchcomms_fr_dump_file", _handle_dump_file)
    _register_handler("torchcomms_health_check", _handle_health_check)


_register_handlers()
