"""The Python surface itself (§1-5, §7 accessors, §11, §13): names, enums, ReduceOp, options,
backend discovery and Python backends."""

from __future__ import annotations

import copy
import pickle
from datetime import timedelta
from typing import Any

import pytest
import torch

import torchcomms
from conftest import RANK, WORLD
from torchcomms import ReduceOp
from torchcomms._comms import OpName, P2POpType, RedOpType, WorkStatus


def test_all_names_exist_with_module_torchcomms() -> None:
    assert torchcomms.__all__ == [
        "new_comm", "TorchComm", "ReduceOp", "TorchWork", "Timeout", "BatchP2POptions",
        "BatchSendRecv", "P2POp", "CommOptions", "TorchCommWindow", "register_backend",
        "TorchCommBackend",
    ]
    for name in torchcomms.__all__:
        assert getattr(torchcomms, name).__module__ == "torchcomms", name
    for name in ("clog", "FlightRecorderHook", "NanCheckHook"):
        assert getattr(torchcomms.hooks, name).__module__ == "torchcomms.hooks"
    assert issubclass(torchcomms.Timeout, timedelta)
    assert torchcomms.Timeout(seconds=3) == timedelta(seconds=3)
    assert torchcomms.objcol.all_gather_object


def test_enums() -> None:
    assert [m.name for m in RedOpType.__members__.values()] == [
        "SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM", "AVG"
    ]
    assert [int(m.value) for m in RedOpType.__members__.values()] == list(range(9))
    assert list(WorkStatus.__members__) == ["NOT_STARTED", "INPROGRESS", "COMPLETED", "TIMEDOUT", "ERROR"]
    assert list(P2POpType.__members__) == ["SEND", "RECV"]
    assert list(torchcomms._comms.TorchCommWinAccessType.__members__) == [
        "WIN_ACCESS_TYPE_UNIFIED", "WIN_ACCESS_TYPE_SEPARATE"
    ]
    names = list(OpName.__members__)
    for n in ("send", "recv", "broadcast", "all_reduce", "reduce", "all_gather", "all_gather_v",
              "all_gather_single", "reduce_scatter", "reduce_scatter_v", "reduce_scatter_single",
              "all_to_all_single", "all_to_all_v_single", "all_to_all", "barrier", "scatter",
              "gather", "gather_single", "split", "new_window", "finalize", "batch_op_issue"):
        assert n in names
    assert str(OpName.all_reduce) == "OpName.all_reduce" and OpName.all_reduce.name == "all_reduce"
    assert len({OpName.send, OpName.send, OpName.recv}) == 2


def test_reduce_op() -> None:
    assert ReduceOp.SUM == ReduceOp.SUM and ReduceOp.SUM != ReduceOp.MAX
    assert hash(ReduceOp.SUM) == hash(ReduceOp.SUM)
    assert ReduceOp.SUM is ReduceOp.SUM  # the same object each time, like pybind
    assert {ReduceOp.SUM: 1}[ReduceOp.SUM] == 1
    for name in ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG"):
        op = getattr(ReduceOp, name)
        assert op.type == getattr(RedOpType, name)
        assert ReduceOp(getattr(RedOpType, name)) == op
        assert copy.copy(op) == op and copy.deepcopy(op) == op
        assert pickle.loads(pickle.dumps(op)) == op
    p = ReduceOp.PREMUL_SUM(2.5)
    assert p.type == RedOpType.PREMUL_SUM
    assert p == ReduceOp.PREMUL_SUM(2.5) and p != ReduceOp.PREMUL_SUM(3.0)
    assert copy.deepcopy(p) == p
    pt = ReduceOp.PREMUL_SUM(torch.tensor(2.0, dtype=torch.bfloat16))
    assert pt.type == RedOpType.PREMUL_SUM
    with pytest.raises(ValueError, match="PREMUL_SUM"):
        ReduceOp(RedOpType.PREMUL_SUM)
    with pytest.raises(ValueError, match="one-element"):
        ReduceOp.PREMUL_SUM(torch.ones(2))
    with pytest.raises(TypeError):
        ReduceOp.PREMUL_SUM("x")


def test_comm_options() -> None:
    o = torchcomms.CommOptions()
    assert o.abort_process_on_timeout_or_error in (True, False)
    assert isinstance(o.timeout, timedelta)
    assert o.store is None and o.enable_reconfigure is False and o.hints == {}
    o.timeout = timedelta(seconds=5)
    o.hints = {"a": "b"}
    o.abort_process_on_timeout_or_error = False
    assert o.timeout == timedelta(seconds=5) and o.hints == {"a": "b"}
    assert not hasattr(o, "name")
    b = torchcomms.BatchP2POptions()
    assert b.timeout == timedelta(0) and b.hints == {}
    r = torchcomms._comms.ReconfigureOptions(uuid=3, init_handles=["a"], timeout=timedelta(seconds=1))
    assert r.uuid == 3 and r.init_handles == ["a"]


def test_accessors(world: Any) -> None:
    assert world.get_rank() == RANK and world.get_size() == WORLD
    assert world.get_name() == "pytest_world"
    assert world.get_backend() == "ctran"
    assert world.get_backend_version().startswith("ctran ")
    assert world.get_device() == torch.device("cpu")
    assert isinstance(world.get_options(), torchcomms.CommOptions)
    assert world.get_options() is not world.get_options()  # a copy
    assert world.is_abort_supported() and not world.is_aborted()
    assert copy.copy(world) is world and copy.deepcopy(world) is world
    assert world.get_backend_impl() is not None
    with pytest.warns(DeprecationWarning):
        world.unsafe_get_backend()
    assert not hasattr(world, "get_ranks")
    world.tensor_register(torch.ones(2))
    world.tensor_deregister(torch.ones(2))


def test_entry_points() -> None:
    """The installed package registers ctran in the torchcomms.backends group."""
    assert torchcomms.is_backend_built("ctran"), "install the package (pip install ./bindings/python)"
    assert "ctran" in torchcomms.built_backends()
    torchcomms._load_backend("ctran")
    with pytest.raises(ModuleNotFoundError, match="failed to find backend nope"):
        torchcomms._load_backend("nope")
    assert not torchcomms.is_backend_built("nope")
    assert torchcomms._is_backend_registered("ctran")


# ----- Python backends (§13) -----


class _Work:
    def __init__(self) -> None:
        self.waited = 0

    def wait(self) -> None:
        self.waited += 1


class LoopbackBackend(torchcomms.TorchCommBackend):
    """A one-rank backend in Python: every collective copies input to output."""

    calls: list[tuple[str, tuple]] = []

    def init(self, device: Any, name: str, options: Any) -> None:
        self.device, self.name, self.options = device, name, options

    def finalize(self) -> None:
        LoopbackBackend.calls.append(("finalize", ()))

    def get_rank(self) -> int:
        return 0

    def get_size(self) -> int:
        return 1

    def get_backend_name(self) -> str:
        return "loopback"

    def get_comm_name(self) -> str:
        return self.name

    def split(self, ranks: list[int], name: str, options: Any) -> Any:
        if not ranks:
            return None
        child = LoopbackBackend()
        child.init(self.device, name, options)
        return child

    def all_reduce(self, tensor: torch.Tensor, op: Any, async_op: bool) -> Any:
        LoopbackBackend.calls.append(("all_reduce", (op, async_op)))
        tensor.mul_(1)
        return _Work() if async_op else None

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, async_op: bool) -> Any:
        output.copy_(input)
        return None

    def all_to_all_v_single(self, output: Any, input: Any, out_splits: Any, in_splits: Any, async_op: bool) -> Any:
        LoopbackBackend.calls.append(("all_to_all_v_single", (list(out_splits), list(in_splits))))
        output.copy_(input)
        return None


def test_python_backend() -> None:
    torchcomms.register_backend("loopback", LoopbackBackend)
    assert torchcomms._is_backend_registered("loopback")
    comm = torchcomms.new_comm("loopback", "cpu", "py_comm", hints={"h": "1"})
    assert isinstance(comm.get_backend_impl(), LoopbackBackend)
    assert comm.get_backend_impl().options.hints == {"h": "1"}
    assert comm.get_rank() == 0 and comm.get_size() == 1 and comm.get_name() == "py_comm"
    assert comm.get_backend() == "loopback"
    seen = []
    comm.register_pre_hook(lambda n, i, a: seen.append(n))
    t = torch.ones(3)
    assert comm.all_reduce(t, ReduceOp.MAX, async_op=False).is_completed()
    w = comm.all_reduce(t, ReduceOp.SUM, async_op=True)
    assert not w.is_completed()
    w._set_status(WorkStatus.INPROGRESS)
    w.wait()
    assert w.is_completed()
    assert LoopbackBackend.calls[0] == ("all_reduce", (ReduceOp.MAX, False))
    out = torch.empty(3)
    comm.all_gather_single(out, t, async_op=False)
    assert torch.equal(out, t)
    comm.all_to_all_v_single(out, t, [3], [3], async_op=False)
    assert LoopbackBackend.calls[-1] == ("all_to_all_v_single", ([3], [3]))
    with pytest.raises(NotImplementedError, match="broadcast not implemented for communicator:py_comm"):
        comm.broadcast(t, 0, async_op=False)
    with pytest.raises(NotImplementedError, match="batch_op_issue not implemented"):
        b = comm.batch_op_create()
        b.send(t, 0)
        b.issue(False)
    child = comm.split([0], "py_child")
    assert child is not None and child.get_name() == "py_child" and child.get_backend() == "loopback"
    assert comm.split([], "none") is None
    comm.finalize()
    assert LoopbackBackend.calls[-1] == ("finalize", ())
    assert seen[:2] == [OpName.all_reduce, OpName.all_reduce]
