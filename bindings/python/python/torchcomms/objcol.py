"""Collectives over picklable Python objects (blocking), on any TorchComm.

Objects are serialized with ``torch.save`` (loaded with ``torch.load(weights_only=...)``), or
with ``pickle`` when ``TORCHCOMMS_SERIALIZATION=pickle``. Payloads travel as uint8 tensors on the
communicator's device: first every rank's size (an ``all_gather`` of int64), then the payloads
padded to the largest one.

Only use these with data you trust: unpickling can run arbitrary code.
"""

from __future__ import annotations

import functools
import io
import pickle
from datetime import timedelta
from typing import Any, Optional

import torch

from torchcomms import _comms

__all__ = [
    "all_gather_object",
    "gather_object",
    "send_object_list",
    "recv_object_list",
    "broadcast_object_list",
    "scatter_object_list",
]


@functools.lru_cache(maxsize=None)
def _use_pickle() -> bool:
    # The cvar TORCHCOMMS_SERIALIZATION (environment or TORCHCOMMS_CONFIG file; validated).
    return _comms._cvar("TORCHCOMMS_SERIALIZATION") == "pickle"


def _dumps(obj: object) -> bytes:
    f = io.BytesIO()
    if _use_pickle():
        pickle.Pickler(f).dump(obj)
    else:
        torch.save(obj, f)
    return f.getvalue()


def _loads(data: bytes, weights_only: bool) -> object:
    f = io.BytesIO(data)
    if _use_pickle():
        return pickle.Unpickler(f).load()
    return torch.load(f, weights_only=weights_only)


def _to_tensor(obj: object, device: torch.device) -> torch.Tensor:
    data = _dumps(obj)
    # A bytearray copy: the tensor gets writable memory of its own.
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return t.to(device)


def _from_tensor(t: torch.Tensor, size: int, weights_only: bool) -> object:
    # Copied out through a tensor over a bytearray: `Tensor.numpy()` would need NumPy, which
    # PyTorch does not require.
    data = bytearray(size)
    if size:
        torch.frombuffer(data, dtype=torch.uint8).copy_(t[:size])
    return _loads(bytes(data), weights_only)


def _padded(t: torch.Tensor, size: int) -> torch.Tensor:
    out = torch.zeros(size, dtype=torch.uint8, device=t.device)
    out[: t.numel()] = t
    return out


def _sizes(comm: Any, local: int, timeout: Optional[timedelta]) -> list[int]:
    device = comm.get_device()
    n = comm.get_size()
    sizes = torch.zeros(n, dtype=torch.int64, device=device)
    mine = torch.tensor([local], dtype=torch.int64, device=device)
    comm.all_gather([sizes[i : i + 1] for i in range(n)], mine, async_op=False, timeout=timeout)
    return [int(s) for s in sizes.tolist()]


def all_gather_object(
    comm: Any,
    object_list: list[Any],
    obj: object,
    timeout: Optional[timedelta] = None,
    weights_only: bool = True,
) -> None:
    """Gathers ``obj`` from every rank into ``object_list`` (``comm.get_size()`` long)."""
    device = comm.get_device()
    n = comm.get_size()
    payload = _to_tensor(obj, device)
    sizes = _sizes(comm, payload.numel(), timeout)
    width = max(sizes)
    out = torch.empty(width * n, dtype=torch.uint8, device=device)
    comm.all_gather(
        [out[i * width : (i + 1) * width] for i in range(n)],
        _padded(payload, width),
        async_op=False,
        timeout=timeout,
    )
    for i in range(n):
        object_list[i] = _from_tensor(out[i * width : (i + 1) * width], sizes[i], weights_only)


def gather_object(
    comm: Any,
    obj: object,
    root: int,
    object_gather_list: Optional[list[Any]] = None,
    timeout: Optional[timedelta] = None,
    weights_only: bool = True,
) -> None:
    """Gathers ``obj`` from every rank into ``object_gather_list`` on ``root`` (pass None
    elsewhere)."""
    rank = comm.get_rank()
    if rank == root and object_gather_list is None:
        raise ValueError("gather_object: `object_gather_list` must be a list on the root rank")
    device = comm.get_device()
    n = comm.get_size()
    payload = _to_tensor(obj, device)
    sizes = _sizes(comm, payload.numel(), timeout)
    width = max(sizes)
    out = torch.empty(width * n, dtype=torch.uint8, device=device) if rank == root else None
    outputs = [out[i * width : (i + 1) * width] for i in range(n)] if out is not None else []
    comm.gather(outputs, _padded(payload, width), root, async_op=False, timeout=timeout)
    if rank == root:
        assert object_gather_list is not None
        for i in range(n):
            object_gather_list[i] = _from_tensor(outputs[i], sizes[i], weights_only)


def send_object_list(
    comm: Any, object_list: list[Any], dst: int, timeout: Optional[timedelta] = None
) -> None:
    """Sends the objects of ``object_list`` to ``dst`` (which calls ``recv_object_list`` with a
    list of the same length)."""
    device = comm.get_device()
    payloads = [_to_tensor(o, device) for o in object_list]
    sizes = torch.tensor([p.numel() for p in payloads], dtype=torch.int64, device=device)
    comm.send(sizes, dst, async_op=False, timeout=timeout)
    if payloads:
        comm.send(torch.cat(payloads), dst, async_op=False, timeout=timeout)


def recv_object_list(
    comm: Any,
    object_list: list[Any],
    src: int,
    timeout: Optional[timedelta] = None,
    weights_only: bool = True,
) -> None:
    """Receives objects sent by ``send_object_list`` on ``src`` into ``object_list``."""
    device = comm.get_device()
    sizes = torch.zeros(len(object_list), dtype=torch.int64, device=device)
    comm.recv(sizes, src, async_op=False, timeout=timeout)
    if not object_list:
        return
    sizes_l = [int(s) for s in sizes.tolist()]
    data = torch.empty(sum(sizes_l), dtype=torch.uint8, device=device)
    comm.recv(data, src, async_op=False, timeout=timeout)
    off = 0
    for i, s in enumerate(sizes_l):
        object_list[i] = _from_tensor(data[off : off + s], s, weights_only)
        off += s


def broadcast_object_list(
    comm: Any,
    object_list: list[Any],
    root: int,
    timeout: Optional[timedelta] = None,
    weights_only: bool = True,
) -> None:
    """Broadcasts ``root``'s ``object_list`` into every rank's list (of the same length)."""
    device = comm.get_device()
    n = len(object_list)
    if comm.get_rank() == root:
        payloads = [_to_tensor(o, device) for o in object_list]
        sizes = torch.tensor([p.numel() for p in payloads], dtype=torch.int64, device=device)
    else:
        payloads = []
        sizes = torch.zeros(n, dtype=torch.int64, device=device)
    comm.broadcast(sizes, root, async_op=False, timeout=timeout)
    sizes_l = [int(s) for s in sizes.tolist()]
    if comm.get_rank() == root:
        data = torch.cat(payloads) if payloads else torch.empty(0, dtype=torch.uint8, device=device)
    else:
        data = torch.empty(sum(sizes_l), dtype=torch.uint8, device=device)
    comm.broadcast(data, root, async_op=False, timeout=timeout)
    if comm.get_rank() != root:
        off = 0
        for i, s in enumerate(sizes_l):
            object_list[i] = _from_tensor(data[off : off + s], s, weights_only)
            off += s


def scatter_object_list(
    comm: Any,
    root: int,
    scatter_object_output_list: list[Any],
    scatter_object_input_list: Optional[list[Any]] = None,
    timeout: Optional[timedelta] = None,
    weights_only: bool = True,
) -> None:
    """Scatters ``root``'s ``scatter_object_input_list`` (one object per rank); each rank gets
    its object in ``scatter_object_output_list[0]``."""
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError(
            "scatter_object_list: `scatter_object_output_list` must be a list of at least one element"
        )
    device = comm.get_device()
    n = comm.get_size()
    rank = comm.get_rank()
    if rank == root:
        if scatter_object_input_list is None or len(scatter_object_input_list) != n:
            raise ValueError(
                f"scatter_object_list: `scatter_object_input_list` must hold {n} objects on the root rank"
            )
        payloads = [_to_tensor(o, device) for o in scatter_object_input_list]
        sizes = torch.tensor([p.numel() for p in payloads], dtype=torch.int64, device=device)
    else:
        payloads = []
        sizes = torch.zeros(n, dtype=torch.int64, device=device)
    comm.broadcast(sizes, root, async_op=False, timeout=timeout)
    sizes_l = [int(s) for s in sizes.tolist()]
    width = max(sizes_l) if sizes_l else 0
    out = torch.empty(width, dtype=torch.uint8, device=device)
    inputs = [_padded(p, width) for p in payloads] if rank == root else []
    comm.scatter(out, inputs, root, async_op=False, timeout=timeout)
    scatter_object_output_list[0] = _from_tensor(out, sizes_l[rank], weights_only)
