"""Tensors that lie: ``torch.Tensor`` subclasses whose ``numel()``, ``data_ptr()``,
``element_size()``, ``shape``, ``stride()``, ``is_contiguous()``, ``dtype`` or ``device``
misreport the tensor, through overridden methods or through ``__torch_function__``. The
bindings read tensors through torch's base class and check the bytes against the storage, so
each case either runs on the tensor's true contents or is refused with a ``CommValueError``
naming the argument, on every rank alike; none may crash a rank (the old bindings believed
the attributes: SIGSEGV or a malloc abort on every rank)."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import torchcomms
from conftest import RANK, WORLD

N = 4


def _values() -> torch.Tensor:
    return torch.arange(N, dtype=torch.float32) + 100 * RANK


def _expected() -> torch.Tensor:
    return torch.cat([torch.arange(N, dtype=torch.float32) + 100 * r for r in range(WORLD)])


# A decoy whose address a lying data_ptr() reports: reading it would gather the wrong values.
_DECOY = torch.full((N * 1024,), -1.0)


class _LyingNumel(torch.Tensor):
    def numel(self) -> int:  # type: ignore[override]
        return 10**12


class _LyingDataPtr(torch.Tensor):
    def data_ptr(self) -> int:  # type: ignore[override]
        return _DECOY.data_ptr()


class _LyingElementSize(torch.Tensor):
    def element_size(self) -> int:  # type: ignore[override]
        return 1 << 20


class _LyingShape(torch.Tensor):
    @property
    def shape(self) -> torch.Size:  # type: ignore[override]
        return torch.Size([10**9])

    def size(self, *dim: Any) -> Any:  # type: ignore[override]
        return 10**9 if dim else torch.Size([10**9])

    def dim(self) -> int:  # type: ignore[override]
        return 3


class _LyingDtype(torch.Tensor):
    @property
    def dtype(self) -> torch.dtype:  # type: ignore[override]
        return torch.float64


class _LyingDevice(torch.Tensor):
    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("meta")


class _LyingStorage(torch.Tensor):
    def untyped_storage(self) -> Any:  # type: ignore[override]
        return torch.empty(10**6, dtype=torch.uint8).untyped_storage()


class _LyingTorchFunction(torch.Tensor):
    """Lies about everything through ``__torch_function__``, which also sees calls made through
    the base class (``torch.Tensor.numel(t)``)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        lies = {
            "numel": 10**12,
            "data_ptr": _DECOY.data_ptr(),
            "dim": 2,
            "size": 10**9,
            "is_contiguous": True,
        }
        if name in lies:
            return lies[name]
        if name == "__get__":  # dtype, device, shape getters
            return torch.float64
        return super().__torch_function__(func, types, args, kwargs or {})


READ_TRUTHFULLY = [
    _LyingNumel,
    _LyingDataPtr,
    _LyingElementSize,
    _LyingShape,
    _LyingDtype,
    _LyingDevice,
    _LyingStorage,
    _LyingTorchFunction,
]


@pytest.mark.parametrize("cls", READ_TRUTHFULLY, ids=lambda c: c.__name__.lstrip("_"))
def test_a_lying_subclass_is_read_through_the_base_class(world: Any, cls: type) -> None:
    liar = _values().as_subclass(cls)
    out = torch.zeros(N * WORLD)
    world.all_gather_single(out, liar, async_op=False)
    assert torch.equal(out, _expected())


@pytest.mark.parametrize("cls", READ_TRUTHFULLY, ids=lambda c: c.__name__.lstrip("_"))
def test_a_lying_subclass_as_output_receives_the_data(world: Any, cls: type) -> None:
    out = torch.zeros(N * WORLD).as_subclass(cls)
    world.all_gather_single(out, _values(), async_op=False)
    assert torch.equal(out.as_subclass(torch.Tensor), _expected())


class _LyingContiguous(torch.Tensor):
    def is_contiguous(self, *a: Any, **k: Any) -> bool:  # type: ignore[override]
        return True

    def stride(self, *dim: Any) -> Any:  # type: ignore[override]
        return 1 if dim else (1,) * self.dim()


def _strided() -> torch.Tensor:
    # The transpose of a 2 x N tensor: N * 2 elements, not dense in memory.
    return torch.arange(2 * N, dtype=torch.float32).reshape(2, N).t()


def test_a_strided_tensor_claiming_contiguity_is_refused(world: Any) -> None:
    liar = _strided().as_subclass(_LyingContiguous)
    with pytest.raises(torchcomms.CommValueError, match=r"all_reduce: invalid argument `tensor`.*contiguous"):
        world.all_reduce(liar, torchcomms.ReduceOp.SUM, async_op=False)


def test_torch_function_claiming_contiguity_is_refused(world: Any) -> None:
    liar = _strided().as_subclass(_LyingTorchFunction)
    with pytest.raises(torchcomms.CommValueError, match=r"`tensor`.*contiguous"):
        world.all_reduce(liar, torchcomms.ReduceOp.SUM, async_op=False)


class _NoStorage(torch.Tensor):
    """A wrapper subclass: sizes come from the subclass, there is no memory behind them."""

    @staticmethod
    def __new__(cls, n: int) -> Any:
        return torch.Tensor._make_wrapper_subclass(cls, (n,), dtype=torch.float32)  # type: ignore[attr-defined]

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise NotImplementedError(str(func))


@pytest.mark.parametrize(
    "call",
    [
        lambda w, t: w.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=False),
        lambda w, t: w.broadcast(t, 0, async_op=False),
        lambda w, t: w.all_gather_single(torch.zeros(10**6 * WORLD), t, async_op=False),
    ],
    ids=["all_reduce", "broadcast", "all_gather_single"],
)
def test_a_tensor_without_memory_is_refused_naming_it(world: Any, call: Callable[..., Any]) -> None:
    with pytest.raises(torchcomms.CommValueError, match=r"invalid argument `(tensor|input)`"):
        call(world, _NoStorage(10**6))


def test_a_lie_inside_a_list_names_the_item(world: Any) -> None:
    items = [torch.zeros(N) for _ in range(WORLD)]
    items[-1] = _NoStorage(N)  # type: ignore[call-arg]
    with pytest.raises(torchcomms.CommValueError, match=rf"`tensor_list\[{WORLD - 1}\]`"):
        world.all_gather(items, _values(), async_op=False)


def test_an_object_posing_as_a_tensor_is_a_type_error(world: Any) -> None:
    class Impostor:
        __class__ = property(lambda self: torch.Tensor)  # fools isinstance()

        def numel(self) -> int:
            return 10**12

        def data_ptr(self) -> int:
            return 8

    assert isinstance(Impostor(), torch.Tensor)
    with pytest.raises(torchcomms.CommTypeError, match="argument `tensor` must be a torch.Tensor, got Impostor"):
        world.all_reduce(Impostor(), torchcomms.ReduceOp.SUM, async_op=False)


def test_parameters_and_views_still_work(world: Any) -> None:
    p = torch.nn.Parameter(torch.ones(N), requires_grad=False)
    world.all_reduce(p, torchcomms.ReduceOp.SUM, async_op=False)
    assert torch.all(p == WORLD)
    base = torch.zeros(3 * N)
    view = base[N : 2 * N]  # a view inside a larger storage
    view.fill_(1.0)
    world.all_reduce(view, torchcomms.ReduceOp.SUM, async_op=False)
    assert torch.all(view == WORLD) and torch.all(base[:N] == 0) and torch.all(base[2 * N :] == 0)
    empty = torch.empty(0)
    world.all_reduce(empty, torchcomms.ReduceOp.SUM, async_op=False)


def test_comm_usable_after_refusals(world: Any) -> None:
    t = torch.ones(3)
    world.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=False)
    assert torch.all(t == WORLD)
