"""torch.distributed on torchcomms: c10d process groups and backends over ``TorchComm``.

Two classes carry every c10d operation onto a communicator:

- :class:`_BackendWrapper` wraps one ``TorchComm`` (upstream's ``torchcomms._BackendWrapper``).
  Where torch lets Python subclass ``torch._C._distributed_c10d.Backend`` (torch >= 2.14) it is
  such a backend, so ``ProcessGroup._register_backend(device, CUSTOM, wrapper)`` works as with
  upstream's C++ class; on older torch it is a plain object that only :class:`TorchCommsProcessGroup`
  drives.
- :class:`TorchCommsProcessGroup` is a ``ProcessGroup`` subclass over one wrapper per device type
  (``cpu``, ``cuda``). ``init_process_group(backend="ctran")``, ``new_group``, ``split_group``
  and ``torchcomms.device_mesh`` build these: ``torch.distributed``'s Python functions call its
  methods directly (no dispatcher round trip), and C++ callers (DDP's reducer, functional
  collectives) reach them through torch's ``PyProcessGroup`` trampoline.

Operations return :class:`_Work` (a ``torch.distributed.Work``): ``wait()`` waits on the
torchcomms work (CPU) or orders the caller's current stream after it (CUDA); ``get_future()``
returns a ``torch.futures.Future`` completed by the package's completion thread when the
operation finishes (CPU) or carrying CUDA events (CUDA), so DDP communication hooks work.

The backend lives in ``_c10d_backend``, the works, errors and reduce-op mapping in
``_c10d_work``; this module keeps the process group and the registration with torch.

This module is imported while ``torch.distributed`` itself is being imported (torch looks for
``torchcomms._comms._BackendWrapper``): at import time it only touches ``torch._C``.
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import torch
from torch._C import _distributed_c10d as _C

from torchcomms._comms import new_comm as _new_comm
from torchcomms._c10d_backend import (  # noqa: F401 - also re-exported
    PYTHON_BACKENDS,
    _BackendWrapper,
    _BackendWrapperOptions,
    _opt_timeout,
    _option,
    _python_backends_supported,
)
from torchcomms._c10d_work import (  # noqa: F401 - also re-exported
    DistTimeoutError,
    _Work,
    _dist_error,
    _done_work,
    _reduce_op,
)

__all__ = [
    "TorchCommsProcessGroup",
    "DistTimeoutError",
    "PYTHON_BACKENDS",
    "C10D_BACKENDS",
]

_ZERO = timedelta(0)

# c10d backend name -> torchcomms backend name. "ctran" is our engine; "tc_nccl" the vendor NCCL
# behind torchcomms' `nccl` backend (c10d's own "nccl" is torch's ProcessGroupNCCL).
C10D_BACKENDS = {"ctran": "ctran", "tc_nccl": "nccl"}
# The device types each serves (what a bare backend name means in init_process_group).
C10D_DEVICES = {"ctran": ["cpu", "cuda"], "tc_nccl": ["cuda"]}


def _process_group_takes_store() -> bool:
    """Whether a Python subclass of ``ProcessGroup`` can be built with a store (2.14 and 2.15 can;
    2.11 has only the ``(rank, size)`` constructor for subclasses)."""

    class _Probe(_C.ProcessGroup):  # type: ignore[misc]
        pass

    try:
        _Probe(_C.HashStore(), 0, 1)
        return True
    except TypeError:
        return False


_PG_TAKES_STORE: bool = _process_group_takes_store()


# --------------------------------------------------------------------------- the process group


def _device_type(t: torch.Tensor) -> str:
    return "cuda" if t.is_cuda else t.device.type


class TorchCommsProcessGroup(_C.ProcessGroup):  # type: ignore[misc]
    """A ``torch.distributed.ProcessGroup`` whose operations run on torchcomms communicators, one
    per device type (``cpu``, ``cuda``), each behind a :class:`_BackendWrapper`.

    A communicator the group does not hold yet (the CUDA one, when the group was created without
    ``device_id``) is created by ``make_comm(device)`` at the group's first operation on that
    device: a collective over the group, as ProcessGroupNCCL creates its communicators.
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        backends: dict[str, _BackendWrapper],
        *,
        devices: Sequence[str] = ("cpu", "cuda"),
        make_comm: Optional["_CommFactory"] = None,
        backend_name: str = "ctran",
        group_name: str = "",
        group_desc: str = "",
    ) -> None:
        if store is not None and _PG_TAKES_STORE:
            super().__init__(store, rank, size)
        else:
            super().__init__(rank, size)
        self._store = store
        self._r = rank
        self._n = size
        self._backends: dict[str, _BackendWrapper] = dict(backends)
        self._devices = [d for d in devices]
        for d in self._backends:
            if d not in self._devices:
                self._devices.append(d)
        self._make_comm = make_comm
        self._backend_name = backend_name
        self._group_name = group_name
        self._group_desc = group_desc
        self._cpu = self._backends.get("cpu")
        self._cuda = self._backends.get("cuda")
        # The accelerator this rank's communicators use (init_process_group's device_id), also
        # when the group does not announce it as bound_device_id (see _may_bind_device).
        self._device_id: Optional[torch.device] = None
        self._lock = threading.Lock()
        self._splits = 0
        self._closed = False
        self._cpp_registered: set[str] = set()
        self._register_cpp_backends()

    # ---------------------------------------------------------------- backends

    def _register_cpp_backends(self) -> None:
        """With Python backends (torch >= 2.14), registers the wrappers with the C++ group too,
        so its dispatcher paths (``ProcessGroup.get_backend``, ``_device_types``, C++ callers of
        the ``c10d::*`` operators) reach the same communicators."""
        if not PYTHON_BACKENDS:
            return
        for d, b in self._backends.items():
            if d not in self._cpp_registered and isinstance(b, _C.Backend):
                self._register_backend(torch.device(d), _C.ProcessGroup.BackendType.CUSTOM, b)
                self._cpp_registered.add(d)
        if self._backends:
            self._set_default_backend(_C.ProcessGroup.BackendType.CUSTOM)

    def _backend(self, device_type: str, where: str) -> _BackendWrapper:
        b = self._backends.get(device_type)
        if b is not None:
            return b
        with self._lock:
            b = self._backends.get(device_type)
            if b is not None:
                return b
            if device_type not in self._devices or self._make_comm is None:
                raise ValueError(
                    f"[rank {self._r}] {where}: this process group (backend "
                    f"{self._backend_name!r}) has no communicator for {device_type!r} tensors "
                    f"(it serves {', '.join(sorted(self._backends)) or 'nothing'})"
                )
            if self._closed:
                raise torch._C._DistBackendError(
                    f"[rank {self._r}] {where}: the process group was shut down"
                )
            if device_type == "cuda" and not torch.cuda.is_available():
                raise ValueError(
                    f"[rank {self._r}] {where}: CUDA tensors need a GPU; torch sees none here"
                )
            device = (
                torch.device("cuda", torch.cuda.current_device())
                if device_type == "cuda"
                else torch.device(device_type)
            )
            b = _BackendWrapper(self._make_comm(device))
            self._backends[device_type] = b
            if device_type == "cuda":
                self._cuda = b
            elif device_type == "cpu":
                self._cpu = b
            self._register_cpp_backends()
            return b

    def _for(self, t: torch.Tensor, where: str) -> _BackendWrapper:
        if t.is_cuda:
            b = self._cuda
            if b is None:
                with torch.cuda.device(t.device):
                    b = self._backend("cuda", where)
            return b
        if t.is_cpu:
            b = self._cpu
            return b if b is not None else self._backend("cpu", where)
        return self._backend(t.device.type, where)

    def _first(self, tensors: Any, where: str) -> _BackendWrapper:
        t = tensors
        while not isinstance(t, torch.Tensor):
            if not t:
                return self._default_backend(where)
            t = t[0]
        return self._for(t, where)

    def _default_backend(self, where: str) -> _BackendWrapper:
        bound = self.bound_device_id or self._device_id
        if bound is not None:
            return self._for_device(bound, where)
        if (
            "cuda" in self._devices
            and torch.cuda.is_available()
            and (self._cuda is not None or "cpu" not in self._devices)
        ):
            return self._for_device(torch.device("cuda", torch.cuda.current_device()), where)
        if "cpu" in self._devices:
            return self._backend("cpu", where)
        return self._backend(self._devices[0], where)

    def _for_device(self, device: Any, where: str) -> _BackendWrapper:
        device = torch.device(device)
        if device.type == "cuda" and self._cuda is None and torch.cuda.is_available():
            with torch.cuda.device(
                device if device.index is not None else torch.cuda.current_device()
            ):
                return self._backend("cuda", where)
        return self._backend(device.type, where)

    def _existing(self, device: Any, where: str) -> _BackendWrapper:
        """The backend of ``device`` if its communicator exists. Looking a backend up never
        creates a communicator: creation is a collective, and torch looks backends up on some
        ranks only (``batch_isend_irecv`` on a pipeline's pair)."""
        d = torch.device(device).type
        b = self._backends.get(d)
        if b is not None:
            return b
        if d in self._devices:
            raise RuntimeError(
                f"[rank {self._r}] {where}: this process group has no {d} communicator yet: it "
                f"is created by the group's first {d} collective (or at init_process_group with "
                f"device_id)"
            )
        raise RuntimeError(f"No backend type associated with device type {d}")

    def _get_backend(self, device: Any) -> _BackendWrapper:
        return self._existing(device, "_get_backend")

    def get_backend(self, device: Any) -> _BackendWrapper:
        return self._existing(device, "get_backend")

    @property
    def _device_types(self) -> list:
        """The device types whose communicator exists; before any does, the ones the group can
        create (a CUDA-only group without ``device_id``, before its first operation)."""
        if self._backends:
            return [torch.device(d) for d in self._devices if d in self._backends]
        return [torch.device(d) for d in self._devices if d != "cuda" or torch.cuda.is_available()]

    def _has_hooks(self) -> bool:
        return False

    def get_group_store(self) -> Any:
        """The group's store (None for groups made from communicators)."""
        return self._store

    # ---------------------------------------------------------------- names

    def getBackendName(self) -> str:  # noqa: N802 - the trampoline's name
        return self._backend_name

    def name(self) -> str:
        return self._backend_name

    def _get_backend_name(self) -> str:
        return self._backend_name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def __repr__(self) -> str:
        return (
            f"TorchCommsProcessGroup(backend={self._backend_name!r}, name={self._group_name!r}, "
            f"rank={self._r}, size={self._n}, devices={sorted(self._backends)})"
        )

    # ---------------------------------------------------------------- collectives

    def allreduce(self, tensors: Any, opts: Any = None) -> _Work:
        t = tensors[0] if tensors.__class__ is list else tensors
        b = self._cuda if t.is_cuda else self._cpu
        if b is None:
            b = self._first(tensors, "allreduce")
        return b.allreduce(tensors, opts)

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> _Work:
        return self._first(tensors, "allreduce_coalesced").allreduce_coalesced(tensors, opts)

    def broadcast(self, tensors: Any, opts: Any = None) -> _Work:
        if opts is not None and not hasattr(opts, "rootRank"):
            root, opts = opts, _C.BroadcastOptions()
            opts.rootRank = root
        return self._first(tensors, "broadcast").broadcast(tensors, opts)

    def reduce(self, tensors: Any, opts: Any = None) -> _Work:
        return self._first(tensors, "reduce").reduce(tensors, opts)

    def allgather(self, output_lists: Any, inputs: Any, opts: Any = None) -> _Work:
        return self._first(inputs, "allgather").allgather(output_lists, inputs, opts)

    def allgather_coalesced(self, output_lists: Any, inputs: Any, opts: Any = None) -> _Work:
        return self._first(inputs, "allgather_coalesced").allgather_coalesced(
            output_lists, inputs, opts
        )

    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> _Work:
        return self._for(input, "all_gather_into_tensor").all_gather_single(output, input, opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> _Work:
        return self._first(inputs, "all_gather_into_tensor_coalesced").all_gather_single_coalesced(
            outputs, inputs, opts
        )

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_lists: Any, inputs: Any, opts: Any = None) -> _Work:
        return self._first(inputs, "gather").gather(output_lists, inputs, opts)

    def gather_single(self, output: Any, input: Any, opts: Any = None) -> _Work:
        return self._for(input, "gather_into_tensor").gather_single(output, input, opts)

    gather_into_tensor = gather_single

    def scatter(self, outputs: Any, input_lists: Any, opts: Any = None) -> _Work:
        return self._first(outputs, "scatter").scatter(outputs, input_lists, opts)

    def reduce_scatter(self, outputs: Any, input_lists: Any, opts: Any = None) -> _Work:
        return self._first(outputs, "reduce_scatter").reduce_scatter(outputs, input_lists, opts)

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> _Work:
        return self._for(input, "reduce_scatter_tensor").reduce_scatter_single(output, input, opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> _Work:
        return self._first(
            inputs, "reduce_scatter_tensor_coalesced"
        ).reduce_scatter_single_coalesced(outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def alltoall(self, outputs: Any, inputs: Any, opts: Any = None) -> _Work:
        return self._first(inputs, "all_to_all").alltoall(outputs, inputs, opts)

    def all_to_all_single(
        self,
        output: Any,
        input: Any,
        output_split_sizes: Any,
        input_split_sizes: Any,
        opts: Any = None,
    ) -> _Work:
        return self._for(input, "all_to_all_single").all_to_all_single(
            output, input, output_split_sizes, input_split_sizes, opts
        )

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> _Work:
        device = None
        if opts is not None:
            ids = getattr(opts, "device_ids", None)
            device = getattr(opts, "device", None)
            if ids:
                device = torch.device("cuda", ids[0])
        b = (
            self._for_device(device, "barrier")
            if device is not None
            else self._default_backend("barrier")
        )
        return b.barrier(opts)

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """``ProcessGroup.monitored_barrier(timeout, wait_all_ranks)`` (``timeout`` may also be
        ``BarrierOptions``): gloo's health-checking barrier, on the CPU communicator."""
        opts = timeout
        if not hasattr(opts, "timeout"):
            opts = _C.BarrierOptions()
            if isinstance(timeout, timedelta):
                opts.timeout = timeout
        if "cpu" in self._devices:
            b = self._backend("cpu", "monitored_barrier")
        else:
            b = self._default_backend("monitored_barrier")
        b.monitored_barrier(opts, wait_all_ranks)

    # ---------------------------------------------------------------- point-to-point

    # Point-to-point operations run on existing communicators only: only the two ranks take part,
    # and creating a communicator takes the whole group.

    def _p2p(self, tensors: Any, where: str) -> _BackendWrapper:
        t = tensors
        while not isinstance(t, torch.Tensor):
            t = t[0]
        return self._existing(t.device, where)

    def send(self, tensors: Any, dst: int, tag: int = 0) -> _Work:
        return self._p2p(tensors, "send").send(tensors, dst, tag)

    def recv(self, tensors: Any, src: int, tag: int = 0) -> _Work:
        return self._p2p(tensors, "recv").recv(tensors, src, tag)

    def recv_anysource(self, tensors: Any, tag: int = 0) -> _Work:
        return self._p2p(tensors, "recv").recv_anysource(tensors, tag)

    def _start_coalescing(self, device: Any) -> None:
        self._existing(device, "start_coalescing").start_coalescing(device)

    def _end_coalescing(self, device: Any) -> _Work:
        return self._existing(device, "end_coalescing").end_coalescing(device)

    start_coalescing = _start_coalescing
    end_coalescing = _end_coalescing

    # ---------------------------------------------------------------- management

    def set_timeout(self, timeout: timedelta) -> None:
        """The default timeout of the group's operations (``dist.set_timeout``), also of the
        communicators it creates later."""
        for b in list(self._backends.values()):
            b.set_timeout(timeout)
        if self._make_comm is not None:
            self._make_comm.timeout = timeout

    def split_group(
        self,
        ranks: Sequence[int],
        timeout: Optional[timedelta] = None,
        opts: Any = None,
        group_name: Optional[str] = None,
        group_desc: Optional[str] = None,
        device_types: Any = None,
    ) -> Optional["TorchCommsProcessGroup"]:
        """A group of ``ranks`` (this group's ranks) made by splitting each communicator: a
        collective over this group. Ranks not in ``ranks`` get None."""
        ranks = sorted(ranks)
        self._splits += 1
        name = group_name or f"{self._group_name}:split:{self._splits}"
        member = self._r in ranks
        backends: dict[str, _BackendWrapper] = {}
        keep = None if not device_types else {torch.device(d).type for d in device_types}
        hints = _option(opts, "hints")
        for d, b in sorted(self._backends.items()):
            if keep is not None and d not in keep:
                continue
            child = b._comm.split(
                ranks if member else [],
                f"{name}:{d}",
                hints=hints,
                timeout=timeout if timeout is not None else _opt_timeout(opts),
            )
            if child is not None:
                backends[d] = _BackendWrapper(child)
        if not member:
            return None
        rank = ranks.index(self._r)
        store = _C.PrefixStore(f"split/{name}/", self._store) if _has_store(self) else None
        make = None
        if self._make_comm is not None and store is not None:
            make = self._make_comm.child(store, rank, len(ranks), name)
        pg = TorchCommsProcessGroup(
            store,
            rank,
            len(ranks),
            backends,
            devices=[d for d in self._devices if keep is None or d in keep],
            make_comm=make,
            backend_name=self._backend_name,
            group_name=name,
            group_desc=group_desc or name,
        )
        pg._device_id = self._device_id
        return pg

    splitGroup = split_group  # noqa: N815 - the trampoline's name

    def shutdown(self) -> None:
        """Finalizes every communicator (``destroy_process_group``); idempotent."""
        self._closed = True
        for b in list(self._backends.values()):
            b.shutdown()

    def abort(self) -> None:
        self._closed = True
        for b in list(self._backends.values()):
            b.abort()

    def _set_sequence_number_for_group(self) -> None:
        pass

    def _get_sequence_number_for_group(self) -> int:
        return 0

    def eager_connect_single_device(self, device: Any) -> None:
        """Creates the communicator of ``device`` now (a collective over the group)."""
        if device is not None:
            self._for_device(device, "eager_connect_single_device")

    def perform_nocolor_split(self, device: Any) -> None:
        """Nothing to do: subgroups of this backend meet through the store, not by splitting."""


def _has_store(pg: TorchCommsProcessGroup) -> bool:
    return pg._store is not None


def batch_p2p_coalesces() -> bool:
    """Whether ``torch.distributed.batch_isend_irecv`` coalesces the operations of a group of
    ours into one torchcomms batch (torch >= 2.14 asks the group's backend whether it supports
    coalescing; older torch does so only for groups of exactly ``ProcessGroup``, and issues the
    operations of a subclass one at a time)."""
    import inspect

    dc = sys.modules.get("torch.distributed.distributed_c10d")
    try:
        src = inspect.getsource(dc.batch_isend_irecv)  # type: ignore[union-attr]
    except (AttributeError, OSError, TypeError):
        return False
    return "type(group) is ProcessGroup" not in src


# --------------------------------------------------------------------------- creating groups


def _may_bind_device() -> bool:
    """Whether a group of ours may announce its device (``ProcessGroup.bound_device_id``). torch
    treats the default group's bound backend as the source of communicator splits for every new
    group; before 2.15 it hands that backend to ProcessGroupNCCL (``Options.split_from``), which
    only takes its own kind, so ``new_group(backend="nccl")`` beside a bound ctran group would
    fail. torch 2.15 splits only from a backend of the requested kind (``_get_split_source``
    takes the backend)."""
    import inspect

    dc = sys.modules.get("torch.distributed.distributed_c10d")
    f = getattr(dc, "_get_split_source", None)
    try:
        return f is not None and len(inspect.signature(f).parameters) >= 2
    except (TypeError, ValueError):
        return False


class _RankEnv:
    """Sets ``TORCHCOMM_RANK``/``TORCHCOMM_SIZE`` while a group's communicator is created (how
    ``new_comm`` learns a subgroup's rank and size, as torch's own torchcomms path does; group
    creation is single-threaded in torch.distributed)."""

    def __init__(self, rank: int, size: int) -> None:
        self.values = {"TORCHCOMM_RANK": str(rank), "TORCHCOMM_SIZE": str(size)}
        self.saved: dict[str, Optional[str]] = {}

    def __enter__(self) -> None:
        for k, v in self.values.items():
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc: Any) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _default_abort() -> Optional[bool]:
    """``abort_process_on_timeout_or_error`` of communicators made for torch.distributed: a
    failure raises (``DistBackendError``), as torch.distributed reports errors, unless
    ``TORCHCOMM_ABORT_ON_ERROR`` says otherwise."""
    return None if "TORCHCOMM_ABORT_ON_ERROR" in os.environ else False


class _CommFactory:
    """Creates a group's communicators, one per device type, meeting through the group's store:
    ``devices`` maps a device type to the torchcomms backend serving it."""

    def __init__(
        self,
        devices: dict[str, str],
        store: Any,
        rank: int,
        size: int,
        name: str,
        timeout: Optional[timedelta],
        options: Any = None,
    ) -> None:
        self.devices = dict(devices)
        self.store = store
        self.rank = rank
        self.size = size
        self.name = name
        self.timeout = timeout
        self.options = options

    def __call__(self, device: torch.device) -> Any:
        backend = self.devices.get(device.type)
        if backend is None:
            raise ValueError(
                f"[rank {self.rank}] no torchcomms backend serves {device.type!r} tensors in this "
                f"group (devices: {self.devices})"
            )
        o = self.options
        abort = _option(o, "abort_process_on_timeout_or_error")
        timeout = _opt_timeout(o) or self.timeout
        with _RankEnv(self.rank, self.size):
            return _new_comm(
                backend,
                device,
                f"{self.name}:{device.type}",
                abort_process_on_timeout_or_error=abort if abort is not None else _default_abort(),
                timeout=timeout,
                is_high_priority_stream=bool(_option(o, "is_high_priority_stream", False)),
                store=_C.PrefixStore(f"torchcomms/{device.type}/", self.store),
                hints=_option(o, "hints") or None,
            )

    def child(self, store: Any, rank: int, size: int, name: str) -> "_CommFactory":
        return _CommFactory(self.devices, store, rank, size, name, self.timeout, self.options)


def _caller_locals() -> dict:
    """The locals of torch's ``_new_process_group_helper`` (the creator's caller): the group's
    backend map and ``device_id``, which torch does not pass to backend creators. Best effort:
    an empty dict when the frame is not torch's."""
    try:
        f = sys._getframe(1)
    except (AttributeError, ValueError):
        return {}
    for _ in range(6):
        if f is None:
            break
        if f.f_code.co_name == "_new_process_group_helper":
            return dict(f.f_locals)
        f = f.f_back
    return {}


def _comm_name(group_name: str, global_ranks: list[int]) -> str:
    """The communicators' name: the group's, and its members. torch reuses group names after
    ``destroy_process_group`` (and names subgroups by a counter, so "1" may be ranks {0} once and
    {0, 1} later); the engine numbers the instances of a name per process, which only agrees
    between ranks that created the same groups of that name: the members make it so."""
    import zlib

    members = zlib.crc32(",".join(map(str, global_ranks)).encode())
    return f"c10d_{group_name}_{members:08x}"


def _create(dist_opts: Any, pg_options: Any, *, c10d_name: str) -> Any:
    """The creator registered with ``torch.distributed.Backend.register_backend`` for each name
    of :data:`C10D_BACKENDS` (``extended_api=True``)."""
    caller = _caller_locals()
    rank, size = dist_opts.group_rank, dist_opts.group_size
    store = dist_opts.store
    timeout = dist_opts.timeout
    group_name = str(getattr(dist_opts, "group_id", "") or "")
    comm_name = _comm_name(
        group_name, list(getattr(dist_opts, "global_ranks_in_group", None) or range(size))
    )
    device_id = caller.get("device_id")
    pg_being_built = getattr(dist_opts, "process_group", None)
    if device_id is None and pg_being_built is not None:
        device_id = pg_being_built.bound_device_id
    if device_id is None:
        # A subgroup: the device of the default group, if it is ours.
        dc = sys.modules.get("torch.distributed.distributed_c10d")
        default = getattr(getattr(dc, "_world", None), "default_pg", None) if dc else None
        device_id = getattr(default, "_device_id", None)
    # The backend map: every device this call serves, and whether other backends take part.
    config = caller.get("backend_config")
    device_map = {}
    if config is not None:
        device_map = {d: str(b) for d, b in config.get_device_backend_map().items()}
    if not device_map:
        device_map = {d: c10d_name for d in C10D_DEVICES[c10d_name]}
    ours = {d: C10D_BACKENDS[b] for d, b in device_map.items() if b in C10D_BACKENDS}
    foreign = {d: b for d, b in device_map.items() if b not in C10D_BACKENDS}
    if foreign:
        # Other backends serve other devices ("cpu:gloo,cuda:ctran"): become one backend of
        # torch's own group (torch >= 2.14); a whole process group would replace theirs.
        device = caller.get("device")
        if device is None:
            device = next(d for d, b in device_map.items() if b == c10d_name)
        device = str(device)
        if not PYTHON_BACKENDS:
            raise ValueError(
                f"[rank {rank}] init_process_group: invalid argument `backend`: mixing "
                f"{c10d_name!r} with other backends ({foreign}) needs torch >= 2.14 (Python "
                f"c10d backends); torch {torch.__version__} can run {c10d_name!r} for every "
                f'device (e.g. backend="{c10d_name}")'
            )
        factory = _CommFactory(
            {device: C10D_BACKENDS[c10d_name]}, store, rank, size, comm_name, timeout, pg_options
        )
        dev = torch.device(device)
        if dev.type == "cuda":
            dev = (
                device_id
                if device_id is not None and device_id.type == "cuda"
                else torch.device("cuda", torch.cuda.current_device())
            )
        return _BackendWrapper(factory(dev))
    factory = _CommFactory(ours, store, rank, size, comm_name, timeout, pg_options)
    backends: dict[str, _BackendWrapper] = {}
    if "cpu" in ours:
        backends["cpu"] = _BackendWrapper(factory(torch.device("cpu")))
    if "cuda" in ours and device_id is not None and torch.device(device_id).type == "cuda":
        backends["cuda"] = _BackendWrapper(factory(torch.device(device_id)))
    pg = TorchCommsProcessGroup(
        store,
        rank,
        size,
        backends,
        devices=list(ours),
        make_comm=factory,
        backend_name=c10d_name,
        group_name=group_name,
    )
    if device_id is not None:
        pg._device_id = torch.device(device_id)
        if _may_bind_device():
            pg.bound_device_id = torch.device(device_id)
    return pg


def _creator(name: str) -> Callable[[Any, Any], Any]:
    def create(dist_opts: Any, pg_options: Any) -> Any:
        return _create(dist_opts, pg_options, c10d_name=name)

    create.__name__ = f"create_{name}_process_group"
    create.__qualname__ = create.__name__
    return create


def register_c10d_backends() -> None:
    """Registers the c10d backends ``ctran`` and ``tc_nccl`` with torch.distributed
    (``init_process_group(backend="ctran")``). Idempotent; ``import torchcomms`` and torch's
    backend entry points call it."""
    dc = sys.modules.get("torch.distributed.distributed_c10d")
    backend_cls = getattr(dc, "Backend", None)
    if backend_cls is None or not hasattr(backend_cls, "register_backend"):
        return  # torch.distributed is still being imported (or is not built)
    for name in C10D_BACKENDS:
        if name.upper() in backend_cls._plugins:
            continue
        backend_cls.register_backend(
            name, _creator(name), extended_api=True, devices=C10D_DEVICES[name]
        )


def _autoload() -> None:
    """The ``torch.backends`` entry point: torch calls it at the end of ``import torch``, when
    torch.distributed is complete; it registers the c10d backends (torch < 2.14 has no
    ``torch.distributed.backends`` entry points). Never raises: a failure here would fail
    ``import torch``."""
    try:
        register_c10d_backends()
    except Exception as e:  # pragma: no cover - defensive
        import warnings

        warnings.warn(f"torchcomms: registering the c10d backends failed: {e}", stacklevel=2)
