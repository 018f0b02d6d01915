"""The c10d backend over one ``TorchComm`` (``_BackendWrapper``, upstream's
``torchcomms._BackendWrapper``) and its options (see ``_c10d``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import torch
from torch._C import _distributed_c10d as _C


from torchcomms._c10d_work import (
    _AllreduceOptions,
    _RT_SUM,
    _TC_SUM,
    _Work,
    _ZERO,
    _dist_error,
    _done_work,
    _reduce_op,
    _timeout,
)


def _python_backends_supported() -> bool:
    """Whether torch lets Python subclass ``Backend`` (its ``PyBackend`` trampoline, torch >=
    2.14); older torch binds ``Backend`` without a constructor."""
    try:

        class _Probe(_C.Backend):  # type: ignore[misc]
            pass

        _Probe(0, 1)
        return True
    except TypeError:
        return False


PYTHON_BACKENDS: bool = _python_backends_supported()


# --------------------------------------------------------------------------- options


if hasattr(_C.Backend, "Options"):
    _OptionsBase: Any = _C.Backend.Options
else:  # pragma: no cover - every torch 2.x has it

    class _OptionsBase:  # type: ignore[no-redef]
        def __init__(self, backend: str) -> None:
            self.backend = backend


class _BackendWrapperOptions(_OptionsBase):
    """Options of a torchcomms c10d backend (upstream's ``_BackendWrapperOptions``): what a split
    child's communicator is created with. Also accepted as ``pg_options`` of
    ``init_process_group``/``new_group`` for the ``ctran`` backend."""

    def __init__(
        self,
        abort_process_on_timeout_or_error: Optional[bool] = None,
        timeout: Optional[timedelta] = None,
        hints: Optional[dict] = None,
        is_high_priority_stream: bool = False,
        store: Any = None,
    ) -> None:
        super().__init__("torchcomms")
        self.abort_process_on_timeout_or_error = abort_process_on_timeout_or_error
        self.timeout = timeout
        self.hints = dict(hints or {})
        self.is_high_priority_stream = is_high_priority_stream
        self.store = store

    def __copy__(self) -> "_BackendWrapperOptions":
        return _BackendWrapperOptions(
            self.abort_process_on_timeout_or_error,
            self.timeout,
            self.hints,
            self.is_high_priority_stream,
            self.store,
        )

    def __deepcopy__(self, memo: Any) -> "_BackendWrapperOptions":
        # The store is shared, as the c10d options of torch's own backends share theirs.
        return self.__copy__()


def _option(opts: Any, name: str, default: Any = None) -> Any:
    return getattr(opts, name, default) if opts is not None else default


# --------------------------------------------------------------------------- the backend

_BackendBase: Any = _C.Backend if PYTHON_BACKENDS else object


def _one(tensors: Any, rank: int, where: str, arg: str = "tensors") -> torch.Tensor:
    """The single tensor of a c10d tensor list (one device per process)."""
    if isinstance(tensors, torch.Tensor):
        return tensors
    if len(tensors) != 1:
        raise ValueError(
            f"[rank {rank}] {where}: invalid argument `{arg}`: expected a list of one tensor "
            f"(one device per process), got {len(tensors)}"
        )
    return tensors[0]


class _BackendWrapper(_BackendBase):
    """A c10d backend over an existing ``TorchComm`` (upstream's ``torchcomms._BackendWrapper``):
    every c10d operation becomes the communicator's operation. ``get_comm()`` returns it."""

    supports_coalescing = True
    supports_splitting = True

    def __init__(self, comm: Any) -> None:
        rank, size = comm.get_rank(), comm.get_size()
        if PYTHON_BACKENDS:
            super().__init__(rank, size)
        self._comm = comm
        self._r = rank
        self._n = size
        device = comm.get_device()
        self._device = device
        self._cuda = device.type == "cuda"
        self._side: Any = None
        self._done: Optional[_Work] = None
        self._batch: Any = None
        self._options: Any = None
        self._seq = 0
        self._closed = False
        self._monitored = 0

    # ---------------------------------------------------------------- accessors

    def get_comm(self) -> Any:
        """The ``TorchComm`` this backend runs on."""
        return self._comm

    def get_mem_allocator(self) -> Any:
        return self._comm.get_mem_allocator()

    def name(self) -> str:
        return self._comm.get_backend()

    def getBackendName(self) -> str:  # noqa: N802 - the trampoline's name
        return self._comm.get_backend()

    def _get_backend_name(self) -> str:
        return self._comm.get_backend()

    def rank(self) -> int:
        return self._r

    def size(self) -> int:
        return self._n

    @property
    def options(self) -> Any:
        """The options a split child's communicator gets (upstream's ``BackendWrapper::Options``)."""
        if self._options is None:
            o = self._comm.get_options()
            self._options = _BackendWrapperOptions(
                abort_process_on_timeout_or_error=o.abort_process_on_timeout_or_error,
                timeout=o.timeout,
                hints=dict(o.hints),
                is_high_priority_stream=o.is_high_priority_stream,
            )
        return self._options

    def set_timeout(self, timeout: timedelta) -> None:
        self._comm.set_timeout(timeout)
        if self._options is not None:
            self._options.timeout = timeout

    _set_default_timeout = set_timeout

    def _verify_work_timeout(self, work: Any, timeout: timedelta) -> bool:
        """True when ``work`` (a work of this backend) runs under ``timeout``."""
        if not isinstance(work, _Work):
            raise RuntimeError("Work is not a WorkWrapper")
        own = work._timeout if work._timeout is not None else self._comm.get_options().timeout
        return own == timeout

    def _set_sequence_number_for_group(self) -> None:
        pass

    def _get_sequence_number_for_group(self) -> int:
        return self._seq

    def comm_split_count(self) -> int:
        return self._seq

    def eager_connect_single_device(self, device: Any = None) -> None:
        pass

    # ---------------------------------------------------------------- issuing

    def _completed(self, outputs: Any, timeout: Optional[timedelta]) -> _Work:
        """The work of a synchronous operation, which finished before it returns: one object per
        backend, reused (torch.distributed only waits on it), holding the latest outputs."""
        done = self._done
        if done is None:
            done = self._done = _Work(None, outputs, self._r, None, timeout)
        else:
            done._outputs = outputs
            done._timeout = timeout
            done._future = None
        return done

    def _side_stream(self) -> Any:
        s = self._side
        if s is None:
            s = self._side = torch.cuda.Stream(device=self._device)
        return s

    def _issue(
        self, call: Callable[[bool], Any], outputs: Any, async_op: bool, timeout: Any
    ) -> _Work:
        """Runs ``call(async_op)`` (one torchcomms operation or several) and wraps the result."""
        r = self._r
        try:
            if not async_op:
                call(False)
                return self._completed(outputs, timeout)
            # CUDA: the operation runs after the current stream; the work orders the stream
            # current at its wait() after the operation.
            side = self._side_stream if self._cuda else None
            return _Work(call(True), outputs, r, side, timeout)
        except BaseException as e:
            err = _dist_error(e)
            if err is e:
                raise
            raise err from e

    # ---------------------------------------------------------------- collectives

    def allreduce(self, tensors: Any, opts: Any = None) -> _Work:
        # The hot path of torch.distributed (dist.all_reduce, DDP): kept free of closures and
        # of per-call objects on synchronous CPU calls.
        if opts.__class__ is not _AllreduceOptions:
            opts = _allreduce_opts(opts)
        if tensors.__class__ is list and len(tensors) == 1:
            t = tensors[0]
        else:
            t = _one(tensors, self._r, "allreduce")
            tensors = [t]
        red = opts.reduceOp
        # Comparing with SUM costs less than reading the op's type (DDP and most code sum).
        if red == _RT_SUM:
            op = _TC_SUM
        else:
            op = _reduce_op(red, self._r, "allreduce")
        to = opts.timeout
        if not to > _ZERO:
            to = None
        comm = self._comm
        if not opts.asyncOp:
            # Synchronous (CPU: finished on return; CUDA: on the current stream).
            try:
                # Positional `hints, timeout`: keywords cost pyo3 a dict per call.
                comm.all_reduce(t, op, False, None, to)
            except BaseException as e:
                err = _dist_error(e)
                if err is e:
                    raise
                raise err from e
            return self._completed(tensors, to)
        return self._issue(lambda a: comm.all_reduce(t, op, a, None, to), tensors, opts.asyncOp, to)

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> _Work:
        opts = opts if opts is not None else _C.AllreduceCoalescedOptions()
        op = _reduce_op(opts.reduceOp, self._r, "allreduce_coalesced")
        to = _timeout(opts)
        comm = self._comm
        ts = list(tensors)
        return self._issue(
            lambda a: tuple(comm.all_reduce(t, op, a, timeout=to) for t in ts),
            ts,
            _async(opts),
            to,
        )

    def broadcast(self, tensors: Any, opts: Any = None) -> _Work:
        opts = opts if opts is not None else _C.BroadcastOptions()
        t = _one(tensors, self._r, "broadcast")
        root, to, comm = opts.rootRank, _timeout(opts), self._comm
        return self._issue(lambda a: comm.broadcast(t, root, a, timeout=to), [t], _async(opts), to)

    def reduce(self, tensors: Any, opts: Any = None) -> _Work:
        opts = opts if opts is not None else _C.ReduceOptions()
        t = _one(tensors, self._r, "reduce")
        op = _reduce_op(opts.reduceOp, self._r, "reduce")
        root, to, comm = opts.rootRank, _timeout(opts), self._comm
        return self._issue(lambda a: comm.reduce(t, root, op, a, timeout=to), [t], _async(opts), to)

    def allgather(self, output_lists: Any, inputs: Any, opts: Any = None) -> _Work:
        opts = opts if opts is not None else _C.AllgatherOptions()
        r = self._r
        t = _one(inputs, r, "allgather", "input_tensors")
        outs = list(_one(output_lists, r, "allgather", "output_tensors"))
        if len(outs) != self._n:
            raise ValueError(
                f"[rank {r}] allgather: invalid argument `output_tensors`: expected {self._n} "
                f"tensors (one per rank), got {len(outs)}"
            )
        to, comm = _timeout(opts), self._comm
        if len(outs) > 1 and len({o.data_ptr() for o in outs}) < len(outs) and t.numel() > 0:
            # Aliased outputs (one buffer listed for several ranks): gather into a staging
            # buffer, then copy each rank's row (synchronously, as upstream).
            staging = torch.empty((self._n, t.numel()), dtype=t.dtype, device=t.device)
            self._issue(
                lambda a: comm.all_gather_single(staging.view(-1), t.reshape(-1), a, timeout=to),
                [],
                False,
                to,
            )
            for i, o in enumerate(outs):
                o.copy_(staging[i].view_as(o))
            return _Work(None, [outs], r, None, to)
        equal = all(o.numel() == t.numel() for o in outs)
        gather = comm.all_gather if equal else comm.all_gather_v
        return self._issue(lambda a: gather(outs, t, a, timeout=to), [outs], _async(opts), to)

    def allgather_coalesced(self, output_lists: Any, inputs: Any, opts: Any = None) -> _Work:
        opts = opts if opts is not None else _C.AllgatherOptions()
        pairs = list(zip(output_lists, inputs))
        to, comm = _timeout(opts), self._comm
        return self._issue(
            lambda a: tuple(comm.all_gather_v(list(o), i, a, timeout=to) for o, i in pairs),
            list(output_lists),
            _async(opts),
            to,
        )

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> _Work:
        opts = opts if opts is not None else _C.AllgatherOptions()
        to, comm = _timeout(opts), self._comm
        return self._issue(
            lambda a: comm.all_gather_single(output, input, a, timeout=to),
            [output],
            _async(opts),
            to,
        )

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> _Work:
        opts = opts if opts is not None else _C.AllgatherOptions()
        pairs = list(zip(outputs, inputs))
        to, comm = _timeout(opts), self._comm
        return self._issue(
            lambda a: tuple(comm.all_gather_single(o, i, a, timeout=to) for o, i in pairs),
            list(outputs),
            _async(opts),
            to,
        )

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_lists: Any, inputs: Any, opts: Any = None) -> _Work:
        opts = opts if opts is not None else _C.GatherOptions()
        r = self._r
        t = _one(inputs, r, "gather", "input_tensors")
        root = opts.rootRank
        if r == root:
            outs = list(_one(output_lists, r, "gather", "output_tensors"))
        else:
            outs = list(output_lists[0]) if len(output_lists) == 1 else []
        to, comm = _timeout(opts), self._comm
        return self._issue(
            lambda a: comm.gather(outs, t, root, a, timeout=to), [outs], _async(opts), to
        )

    def gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Work:
        opts = opts if opts is not None else _C.GatherOptions()
        root, to, comm = opts.rootRank, _timeout(opts), self._comm
        return self._issue(
            lambda a: comm.gather_single(output, input, root, a, timeout=to),
            [output],
            _async(opts),
            to,
        )

    gather_into_tensor = gather_single

    def scatter(self, outputs: Any, input_lists: Any, opts: Any = None) -> _Work:
        opts = opts if opts is not None else _C.ScatterOptions()
        r = self._r
        t = _one(outputs, r, "scatter", "output_tensors")
        root = opts.rootRank
        if r == root:
            ins = list(_one(input_lists, r, "scatter", "input_tensors"))
        else:
            ins = list(input_lists[0]) if len(input_lists) == 1 else []
        to, comm = _timeout(opts), self._comm
        return self._issue(
            lambda a: comm.scatter(t, ins, root, a, timeout=to), [t], _async(opts), to
        )

    def reduce_scatter(self, outputs: Any, input_lists: Any, opts: Any = None) -> _Work:
        opts = opts if opts is not None else _C.ReduceScatterOptions()
        r = self._r
        t = _one(outputs, r, "reduce_scatter", "output_tensors")
        ins = list(_one(input_lists, r, "reduce_scatter", "input_tensors"))
        op = _reduce_op(opts.reduceOp, r, "reduce_scatter")
        to, comm = _timeout(opts), self._comm
        equal = all(i.numel() == t.numel() for i in ins)
        rs = comm.reduce_scatter if equal else comm.reduce_scatter_v
        return self._issue(lambda a: rs(t, ins, op, a, timeout=to), [t], _async(opts), to)

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> _Work:
        opts = opts if opts is not None else _C.ReduceScatterOptions()
        op = _reduce_op(opts.reduceOp, self._r, "reduce_scatter_tensor")
        to, comm = _timeout(opts), self._comm
        return self._issue(
            lambda a: comm.reduce_scatter_single(output, input, op, a, timeout=to),
            [output],
            _async(opts),
            to,
        )

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> _Work:
        opts = opts if opts is not None else _C.ReduceScatterOptions()
        op = _reduce_op(opts.reduceOp, self._r, "reduce_scatter_tensor_coalesced")
        pairs = list(zip(outputs, inputs))
        to, comm = _timeout(opts), self._comm
        return self._issue(
            lambda a: tuple(comm.reduce_scatter_single(o, i, op, a, timeout=to) for o, i in pairs),
            list(outputs),
            _async(opts),
            to,
        )

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def alltoall(self, outputs: Any, inputs: Any, opts: Any = None) -> _Work:
        opts = opts if opts is not None else _C.AllToAllOptions()
        outs, ins = list(outputs), list(inputs)
        to, comm = _timeout(opts), self._comm
        return self._issue(
            lambda a: comm.all_to_all(outs, ins, a, timeout=to), outs, _async(opts), to
        )

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> _Work:
        opts = opts if opts is not None else _C.AllToAllOptions()
        to, comm = _timeout(opts), self._comm
        if not output_split_sizes and not input_split_sizes:
            call: Callable[[bool], Any] = lambda a: comm.all_to_all_single(
                output, input, a, timeout=to
            )
        else:
            n = self._n
            dims = (output.size(0) if output.dim() else 0, input.size(0) if input.dim() else 0)
            osp = list(output_split_sizes) or _even(dims[0], n, self._r, "output_split_sizes")
            isp = list(input_split_sizes) or _even(dims[1], n, self._r, "input_split_sizes")
            call = lambda a: comm.all_to_all_v_single(output, input, osp, isp, a, timeout=to)
        return self._issue(call, [output], _async(opts), to)

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> _Work:
        opts = opts if opts is not None else _C.BarrierOptions()
        to, comm = _timeout(opts), self._comm
        return self._issue(lambda a: comm.barrier(a, timeout=to), [], _async(opts), to)

    def monitored_barrier(self, opts: Any = None, wait_all_ranks: bool = False) -> None:
        """gloo's health-checking barrier, over point-to-point: every rank reports to rank 0
        within the timeout; rank 0 raises naming the ranks that did not."""
        opts = opts if opts is not None else _C.BarrierOptions()
        _monitored_barrier(self, _timeout(opts), wait_all_ranks)

    # ---------------------------------------------------------------- point-to-point

    def send(self, tensors: Any, dst: int, tag: int = 0) -> _Work:
        t = _one(tensors, self._r, "send")
        if self._batch is not None:
            self._batch.send(t, dst)
            return _done_work([t], self._r)
        comm = self._comm
        return self._issue(lambda a: comm.send(t, dst, a), [t], True, None)

    def recv(self, tensors: Any, src: int, tag: int = 0) -> _Work:
        t = _one(tensors, self._r, "recv")
        if self._batch is not None:
            self._batch.recv(t, src)
            return _done_work([t], self._r)
        comm = self._comm
        return self._issue(lambda a: comm.recv(t, src, a), [t], True, None)

    def recv_anysource(self, tensors: Any, tag: int = 0) -> _Work:
        raise NotImplementedError(
            f"[rank {self._r}] recv: receiving from any source is not supported by torchcomms "
            "(as with ProcessGroupNCCL); pass `src`"
        )

    def start_coalescing(self, device: Any = None) -> None:
        """Collects the sends and receives that follow into one batch (``batch_isend_irecv``,
        ``_coalescing_manager``): they run concurrently, issued at ``end_coalescing``."""
        if self._batch is not None:
            raise RuntimeError(
                f"[rank {self._r}] start_coalescing: a coalescing batch is already open"
            )
        self._batch = self._comm.batch_op_create()

    def end_coalescing(self, device: Any = None) -> _Work:
        batch, self._batch = self._batch, None
        if batch is None:
            raise RuntimeError(
                f"[rank {self._r}] end_coalescing: called without a matching start_coalescing"
            )
        if not batch.ops:
            return _done_work([], self._r)
        outputs = [op.tensor for op in batch.ops]
        return self._issue(lambda a: batch.issue(a), outputs, True, None)

    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing

    # ---------------------------------------------------------------- lifecycle

    def split(self, store: Any, ranks: Sequence[int], opts: Any = None) -> Any:
        """A backend over ``comm.split(ranks)`` (collective over this backend's ranks; those not
        in ``ranks`` get None)."""
        name = _option(opts, "group_name") or f"{self._comm.get_name()}_split{self._seq}"
        self._seq += 1
        ranks = list(ranks)
        child = self._comm.split(
            ranks if self._r in ranks else [],
            name,
            hints=_option(opts, "hints"),
            timeout=_opt_timeout(opts),
        )
        return None if child is None else _BackendWrapper(child)

    def shutdown(self) -> None:
        """Finalizes the communicator (``destroy_process_group``); a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self._comm.finalize()
        except RuntimeError:
            pass  # already finalized or aborted: shutdown stays idempotent, as upstream's

    def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._comm.abort()
        except RuntimeError:
            pass

    def __repr__(self) -> str:
        return f"_BackendWrapper({self._comm!r})"


def _async(opts: Any) -> bool:
    return bool(getattr(opts, "asyncOp", True))


def _allreduce_opts(x: Any) -> Any:
    opts = _C.AllreduceOptions()
    if x is not None:
        if hasattr(x, "reduceOp"):
            opts.reduceOp = x.reduceOp
            opts.timeout = x.timeout
            opts.asyncOp = _async(x)
        else:
            opts.reduceOp = x  # a ReduceOp (ProcessGroup.allreduce(tensors, op) overload)
    return opts


def _even(rows: int, n: int, rank: int, arg: str) -> list[int]:
    if rows % n:
        raise ValueError(
            f"[rank {rank}] all_to_all_single: invalid argument `{arg}`: without split sizes "
            f"dim 0 ({rows}) must divide evenly among {n} ranks"
        )
    return [rows // n] * n


def _opt_timeout(opts: Any) -> Optional[timedelta]:
    t = _option(opts, "timeout")
    if t is None:
        t = _option(opts, "_timeout")
    if isinstance(t, timedelta) and t > _ZERO:
        return t
    return None


def _monitored_barrier(b: _BackendWrapper, timeout: Optional[timedelta], wait_all: bool) -> None:
    """``monitored_barrier`` over point-to-point, with gloo's protocol and messages: every rank
    reports to rank 0, which receives from all of them at once and names the ranks whose report
    did not arrive within ``timeout``, then answers the others. A late rank's receive times out,
    which fails the communicator (the job is broken anyway)."""
    comm, r, n = b._comm, b._r, b._n
    limit = timeout if timeout is not None else comm.get_options().timeout
    ms = int(limit.total_seconds() * 1000)
    if n == 1:
        return
    dev = b._device
    if r != 0:
        try:
            comm.send(torch.full((1,), r, dtype=torch.int64, device=dev), 0, False, timeout=limit)
            comm.recv(torch.empty(1, dtype=torch.int64, device=dev), 0, False)
        except RuntimeError as e:
            raise torch._C._DistBackendError(
                f"Rank {r} successfully reached monitoredBarrier, but received errors while "
                f"waiting for send/recv from rank 0. Please check rank 0 logs for the faulty "
                f"rank.\n Original exception: \n{e}"
            ) from e
        return
    bufs = [torch.empty(1, dtype=torch.int64, device=dev) for _ in range(n)]
    works = [(src, comm.recv(bufs[src], src, True, timeout=limit)) for src in range(1, n)]
    failed: list[tuple[int, BaseException]] = []
    for src, w in works:
        try:
            w.wait()
        except RuntimeError as e:
            failed.append((src, e))
    if failed and not wait_all:
        src, e = failed[0]
        raise torch._C._DistBackendError(
            f"[Rank 0]: Rank {src} failed to pass monitoredBarrier in {ms} ms\n Original "
            f"exception: \n{e}"
        ) from e
    if failed:
        raise torch._C._DistBackendError(
            f"[Rank 0]: Ranks {', '.join(str(s) for s, _ in failed)} failed to pass "
            f"monitoredBarrier in {ms} ms"
        ) from failed[0][1]
    for dst in range(1, n):
        comm.send(torch.zeros(1, dtype=torch.int64, device=dev), dst, False, timeout=limit)
