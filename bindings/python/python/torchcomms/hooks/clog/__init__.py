"""clog: logs the signature of every collective, and optionally its lifecycle, to a
pipe-delimited text file (upstream's format)::

    V|1|base_timestamp=1700000000.123
    new_comm|comm=world|rank=0|world_size=4
    C0|sig|all_reduce|in_count=8|out_count=8|dtype=f32|red_op=sum|async_op=f|comm=world
    C0|Q|work_id=0|+0.004
    C0|S|+0.004
    C0|E|+0.004

Identical signatures share one correlation id ``C<n>``. ``events=["ALL"]`` or
``["LIFECYCLE"]`` adds the S (handed to the engine), E (finished: at return for synchronous
operations, after ``wait()`` for async ones) and W (``wait()`` called) lines;
``verbose=["buffers"]`` adds buffer addresses. At the last ``finalize()``, works whose events
never came are reported as ``WARN|...leaked work_id``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

import torch

from torchcomms._comms import OpName

__all__ = ["clog"]

_DTYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
}

_RED = {
    "SUM": "sum",
    "PRODUCT": "prod",
    "MIN": "min",
    "MAX": "max",
    "BAND": "band",
    "BOR": "bor",
    "BXOR": "bxor",
    "PREMUL_SUM": "premul_sum",
    "AVG": "avg",
}


def _dt(t: torch.Tensor) -> str:
    return _DTYPES.get(t.dtype, "other")


def _ptr(t: torch.Tensor) -> str:
    return hex(t.data_ptr())


def _ptrs(ts: list) -> str:
    return ",".join(_ptr(t) for t in ts)


def _counts(ts: list) -> str:
    return ",".join(str(t.numel()) for t in ts)


def _red(args: Any) -> str:
    op = getattr(args, "_op", None)
    t = getattr(op, "type", op)
    return _RED.get(getattr(t, "name", ""), "unknown")


def _flag(args: Any) -> str:
    return "t" if getattr(args, "async_op", False) else "f"


def _signature(op: OpName, a: Any, buffers: bool) -> str:
    """The signature line body of one operation (empty for operations clog does not log)."""
    name = op.name
    if op in (OpName.all_reduce, OpName.broadcast, OpName.reduce):
        n = a.tensor.numel()
        sig = f"{name}|in_count={n}|out_count={n}|dtype={_dt(a.tensor)}"
        if op != OpName.broadcast:
            sig += f"|red_op={_red(a)}"
        if op != OpName.all_reduce:
            sig += f"|root={a.root}"
        sig += f"|async_op={_flag(a)}"
        if buffers:
            sig += f"|buf={_ptr(a.tensor)}"
    elif op in (OpName.send, OpName.recv):
        n = a.tensor.numel()
        send = op == OpName.send
        sig = (
            f"{name}|in_count={n if send else 0}|out_count={0 if send else n}"
            f"|dtype={_dt(a.tensor)}|peer={a.peer}|async_op={_flag(a)}"
        )
        if buffers:
            sig += f"|{'in' if send else 'out'}={_ptr(a.tensor)}"
    elif op in (OpName.all_gather_single, OpName.all_to_all_single, OpName.reduce_scatter_single):
        sig = f"{name}|in_count={a.input.numel()}|out_count={a.output.numel()}|dtype={_dt(a.input)}"
        if op == OpName.reduce_scatter_single:
            sig += f"|red_op={_red(a)}"
        sig += f"|async_op={_flag(a)}"
        if buffers:
            sig += f"|in={_ptr(a.input)}|out={_ptr(a.output)}"
    elif op == OpName.all_to_all_v_single:
        sig = (
            f"{name}|in_splits={','.join(map(str, a.input_split_sizes))}"
            f"|out_splits={','.join(map(str, a.output_split_sizes))}"
            f"|dtype={_dt(a.input)}|async_op={_flag(a)}"
        )
        if buffers:
            sig += f"|in={_ptr(a.input)}|out={_ptr(a.output)}"
    elif op in (OpName.all_gather, OpName.all_gather_v):
        sig = (
            f"{name}|in_count={a.input.numel()}|out_counts={_counts(a.output)}"
            f"|dtype={_dt(a.input)}|async_op={_flag(a)}"
        )
        if buffers:
            sig += f"|in={_ptr(a.input)}|out={_ptrs(a.output)}"
    elif op in (OpName.reduce_scatter, OpName.reduce_scatter_v):
        sig = (
            f"{name}|in_counts={_counts(a.input)}|out_count={a.output.numel()}"
            f"|dtype={_dt(a.output)}|red_op={_red(a)}|async_op={_flag(a)}"
        )
        if buffers:
            sig += f"|in={_ptrs(a.input)}|out={_ptr(a.output)}"
    elif op == OpName.all_to_all:
        if not a.input:
            return ""
        sig = (
            f"{name}|in_counts={_counts(a.input)}|out_counts={_counts(a.output)}"
            f"|dtype={_dt(a.input[0])}|async_op={_flag(a)}"
        )
        if buffers:
            sig += f"|in={_ptrs(a.input)}|out={_ptrs(a.output)}"
    elif op == OpName.scatter:
        sig = (
            f"{name}|in_counts={_counts(a.input)}|out_count={a.output.numel()}"
            f"|dtype={_dt(a.output)}|root={a.root}|async_op={_flag(a)}"
        )
        if buffers:
            sig += f"|in={_ptrs(a.input)}|out={_ptr(a.output)}"
    elif op == OpName.gather:
        sig = (
            f"{name}|in_count={a.input.numel()}|out_counts={_counts(a.output)}"
            f"|dtype={_dt(a.input)}|root={a.root}|async_op={_flag(a)}"
        )
        if buffers:
            sig += f"|in={_ptr(a.input)}|out={_ptrs(a.output)}"
    elif op == OpName.gather_single:
        sig = (
            f"{name}|in_count={a.input.numel()}|out_count={a.output.numel()}"
            f"|dtype={_dt(a.input)}|root={a.root}|async_op={_flag(a)}"
        )
        if buffers:
            sig += f"|in={_ptr(a.input)}|out={_ptr(a.output)}"
    elif op == OpName.barrier:
        sig = f"{name}|async_op={_flag(a)}"
    elif op == OpName.batch_op_issue:
        sig = f"{name}|num_ops={a.num_ops}|async_op={_flag(a)}"
    else:
        return ""
    return sig


class clog:  # noqa: N801 (upstream's name)
    """Logs collective signatures (and lifecycle events) of registered communicators.

    Args:
        output: path of the log file (truncated).
        events: ``["ALL"]`` or ``["LIFECYCLE"]`` add lifecycle lines.
        verbose: ``["buffers"]`` adds buffer addresses to signatures.
    """

    def __init__(self, output: str, events: list[str], verbose: Optional[list[str]] = None) -> None:
        self._lifecycle = any(e in ("ALL", "LIFECYCLE") for e in events)
        self._buffers = "buffers" in (verbose or [])
        self._lock = threading.Lock()
        self._file = open(output, "w", buffering=1)  # noqa: SIM115 (lives with the hook)
        self._base = time.time()
        self._sigs: dict[str, int] = {}
        self._next_work = 0
        self._pending: dict[int, tuple[int, str, list[str]]] = {}
        self._op_to_work: dict[int, int] = {}
        self._comms: list[Any] = []
        self._active = 0
        self._write(f"V|1|base_timestamp={self._base:.3f}")

    def _write(self, line: str) -> None:
        with self._lock:
            self._file.write(line + "\n")

    def _event(self, corr: int, event: str) -> None:
        self._write(f"C{corr}|{event}|+{time.time() - self._base:.3f}")

    def _lifecycle_event(self, work_id: int, event: str) -> None:
        with self._lock:
            info = self._pending.get(work_id)
            ok = info is not None and event in info[2]
            if ok:
                info[2].remove(event)
                if not info[2]:
                    del self._pending[work_id]
        if info is None:
            self._write(f"WARN|lifecycle event {event} for unknown work_id {work_id}")
        elif not ok:
            self._write(f"WARN|unexpected lifecycle event {event} for work_id {work_id}")
        else:
            self._event(info[0], event)

    def register_with_comm(self, comm: Any) -> None:
        """Starts logging ``comm``; communicators split from it are registered automatically."""
        if any(c is comm for c in self._comms):
            raise RuntimeError(f"ClogHook: already registered with comm {comm.get_name()}")
        self._comms.append(comm)
        self._active += 1
        name = comm.get_name()
        self._write(f"new_comm|comm={name}|rank={comm.get_rank()}|world_size={comm.get_size()}")

        def pre_hook(op: OpName, op_id: int, args: Any) -> None:
            if op == OpName.split:
                self._write(
                    f"split|parent={name}|child={args.name}|ranks={','.join(map(str, args.ranks))}"
                )
                return
            sig = _signature(op, args, self._buffers)
            if not sig:
                return
            sig += f"|comm={name}"
            with self._lock:
                corr = self._sigs.get(sig)
                new = corr is None
                if new:
                    corr = len(self._sigs)
                    self._sigs[sig] = corr
                work_id = self._next_work
                self._next_work += 1
                if self._lifecycle:
                    events = ["S", "E", "W"] if getattr(args, "async_op", False) else ["S", "E"]
                    self._pending[work_id] = (corr, name, events)
                self._op_to_work[op_id] = work_id
            if new:
                self._write(f"C{corr}|sig|{sig}")
            self._event(corr, f"Q|work_id={work_id}")

        def post_hook(op_id: int, args: Any) -> None:
            child = getattr(args, "_new_comm", None)
            if child is not None:
                self.register_with_comm(child)
                return
            if type(args).__name__ == "FinalizePostHookArgs":
                self._on_finalize()
                return
            if type(args).__name__ == "SplitPostHookArgs":
                return
            with self._lock:
                work_id = self._op_to_work.pop(op_id, None)
            if work_id is None:
                self._write(f"WARN|post-hook missing work_id for op_id {op_id}")
                return
            if not self._lifecycle:
                return
            self._lifecycle_event(work_id, "S")
            work = getattr(args, "_work", None)
            if work is None or not self._is_async(work_id):
                # Synchronous: finished when the call returned.
                self._lifecycle_event(work_id, "E")
                return
            work._add_wait_callbacks(
                lambda: self._lifecycle_event(work_id, "W"),
                lambda: self._lifecycle_event(work_id, "E"),
            )

        comm.register_pre_hook(pre_hook)
        comm.register_post_hook(post_hook)

    def _is_async(self, work_id: int) -> bool:
        with self._lock:
            info = self._pending.get(work_id)
            return info is not None and "W" in info[2]

    def _on_finalize(self) -> None:
        self._active -= 1
        if self._active > 0:
            return
        with self._lock:
            leaked = sorted(self._pending.items())
        for work_id, (corr, comm_name, events) in leaked:
            self._write(
                f"WARN|comm={comm_name}|leaked work_id={work_id}|corr_id={corr}"
                f"|pending_events={','.join(events)}"
            )
        with self._lock:
            self._file.flush()
