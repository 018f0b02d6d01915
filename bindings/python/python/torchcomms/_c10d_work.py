"""c10d works over torchcomms works (``_Work``: waits, futures, CUDA stream order), the
errors torch.distributed raises, and the mapping of c10d reduce ops (see ``_c10d``)."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
from torch._C import _distributed_c10d as _C

from torchcomms._comms import ReduceOp as _TcOp
from torchcomms._comms import WorkStatus as _WorkStatus

_ZERO = timedelta(0)


class DistTimeoutError(torch._C._DistBackendError, TimeoutError):  # type: ignore[misc]
    """A torchcomms operation behind torch.distributed missed its deadline: a
    ``torch.distributed.DistBackendError`` (what ProcessGroupNCCL raises) that is also a
    ``TimeoutError``."""


def _dist_error(e: BaseException) -> BaseException:
    """The exception torch.distributed users expect for a torchcomms error: bad arguments keep
    their type (``ValueError``, ``TypeError``, ``NotImplementedError``); a timeout becomes
    :class:`DistTimeoutError`, any other failure of the communicator ``DistBackendError``. The
    torchcomms exception is the ``__cause__``."""
    if isinstance(e, (ValueError, TypeError, NotImplementedError)) or isinstance(
        e, torch._C._DistBackendError
    ):
        return e
    if isinstance(e, TimeoutError):
        new: BaseException = DistTimeoutError(str(e))
    elif isinstance(e, RuntimeError):
        new = torch._C._DistBackendError(str(e))
    else:
        return e
    new.__cause__ = e
    return new


# --------------------------------------------------------------------------- reduce ops

_AllreduceOptions = _C.AllreduceOptions
_RT = _C.ReduceOp.RedOpType
_RT_SUM = _RT.SUM
_TC_SUM = _TcOp.SUM
_REDUCE = {
    _RT.SUM: _TcOp.SUM,
    _RT.AVG: _TcOp.AVG,
    _RT.PRODUCT: _TcOp.PRODUCT,
    _RT.MIN: _TcOp.MIN,
    _RT.MAX: _TcOp.MAX,
    _RT.BAND: _TcOp.BAND,
    _RT.BOR: _TcOp.BOR,
    _RT.BXOR: _TcOp.BXOR,
}


def _reduce_op(op: Any, rank: int, where: str) -> Any:
    """The torchcomms ``ReduceOp`` of a c10d ``ReduceOp`` (or ``RedOpType``); PREMUL_SUM keeps its
    factor (a float or a tensor)."""
    kind = getattr(op, "op", op)
    tc = _REDUCE.get(kind)
    if tc is not None:
        return tc
    if kind == _RT.PREMUL_SUM:
        try:
            factor = op.__getstate__()[1]
        except Exception:
            raise ValueError(
                f"[rank {rank}] {where}: invalid argument `op`: PREMUL_SUM needs its factor "
                "(make it with torch.distributed._make_nccl_premul_sum(factor))"
            ) from None
        return _TcOp.PREMUL_SUM(factor)
    raise ValueError(f"[rank {rank}] {where}: invalid argument `op`: unsupported reduce op {op!r}")


def _timeout(opts: Any) -> Optional[timedelta]:
    """The per-operation timeout of c10d options (``kUnsetTimeout``, -1 ms, means the group's)."""
    t = opts.timeout
    return t if t > _ZERO else None


# --------------------------------------------------------------------------- works


def _complete(fut: Any, value: Any, err: Optional[BaseException]) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(value)
    else:
        fut.set_exception(_dist_error(err))


class _Work(_C.Work):  # type: ignore[misc]
    """The c10d work of one torchcomms operation (or of several, for coalesced calls).

    ``tc`` is a ``TorchWork``, a tuple of them, or None when the operation already finished (a
    synchronous call). On CUDA the operation runs after the stream current when it was issued,
    and ``wait()`` makes the stream current at the wait wait for it, without blocking the host
    (ProcessGroupNCCL's semantics). ``side`` (CUDA only) gives the stream on which
    ``get_future()`` records its events, so the future's consumers wait for the operation
    without ordering the caller's stream after it.
    """

    def __init__(
        self,
        tc: Any,
        outputs: Any,
        rank: int,
        side: Optional[Callable[[], Any]] = None,
        timeout: Optional[timedelta] = None,
    ) -> None:
        super().__init__()
        self._tc = tc
        self._outputs = outputs
        self._rank = rank
        self._side = side
        self._timeout = timeout
        self._future: Any = None
        self._error: Optional[BaseException] = None

    def _torch_works(self) -> tuple:
        tc = self._tc
        if tc is None:
            return ()
        return tc if isinstance(tc, tuple) else (tc,)

    def wait(self, timeout: Any = None) -> bool:
        """Waits for the operation (CPU) or orders the current stream after it (CUDA); raises
        its error as ``DistBackendError``. ``timeout`` is ignored: the operation's own timeout
        bounds the wait (as upstream's WorkWrapper)."""
        if self._error is not None:
            raise self._error
        if self._tc is not None:
            try:
                for w in self._torch_works():
                    w.wait()
            except BaseException as e:
                self._error = _dist_error(e)
                if self._error is e:
                    raise
                raise self._error from e
            if self._side is None:
                self._tc = None  # finished (CUDA keeps it: another stream may wait later)
        return True

    def synchronize(self) -> None:
        self.wait()

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._torch_works())

    def is_success(self) -> bool:
        if self._error is not None:
            return False
        return all(w._status() == _WorkStatus.COMPLETED for w in self._torch_works())

    def exception(self) -> Optional[BaseException]:
        """The error of a failed operation (None while it runs or when it succeeded)."""
        if self._error is None:
            for w in self._torch_works():
                if w.is_completed() and w._status() != _WorkStatus.COMPLETED:
                    try:
                        w.wait()  # finished: raises its error at once
                    except BaseException as e:
                        self._error = _dist_error(e)
                        break
        return self._error

    def result(self) -> Any:
        return self._outputs

    def source_rank(self) -> int:
        raise RuntimeError(
            f"[rank {self._rank}] source_rank() is only available for recv_anysource, which "
            "torchcomms does not support"
        )

    def get_future(self) -> Any:
        fut = self._future
        if fut is None:
            fut = self._future = self._make_future()
        return fut

    def _make_future(self) -> Any:
        outputs = self._outputs
        if self._side is not None:
            return self._cuda_future(outputs)
        fut = torch.futures.Future()
        if self._error is not None:
            fut.set_exception(self._error)
            return fut
        works = self._torch_works()
        if not works:
            fut.set_result(outputs)
            return fut
        if len(works) == 1:
            works[0]._add_done_callback(lambda err: _complete(fut, outputs, err))
            return fut
        left = [len(works)]
        lock = threading.Lock()

        def one_done(err: Optional[BaseException]) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if err is not None or last:
                _complete(fut, outputs, err)

        for w in works:
            w._add_done_callback(one_done)
        return fut

    def _cuda_future(self, outputs: Any) -> Any:
        """A future completed on the side stream once that stream waits for the operation:
        its consumers wait for the operation through the future's CUDA events."""
        side = self._side()
        fut = torch.futures.Future(devices=[side.device])
        with torch.cuda.stream(side):
            try:
                for w in self._torch_works():
                    w.wait()
            except BaseException as e:
                self._error = _dist_error(e)
                fut.set_exception(self._error)
                return fut
            fut.set_result(outputs)
        return fut


def _done_work(outputs: Any, rank: int) -> _Work:
    return _Work(None, outputs, rank)
