"""Every bad argument of every operation raises the documented type, ``CommValueError`` for a
value out of range and ``CommTypeError`` for a wrong type, with a message naming the argument;
never pyo3's ``PanicException`` (a ``BaseException``, which ``except Exception`` misses), a plain
``TypeError``/``OverflowError``, or a crash. Each call fails on every rank alike before anything
is sent, so the communicator stays usable."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import pytest
import torch

import torchcomms
from conftest import RANK, WORLD
from torchcomms import ReduceOp

VALUE = torchcomms.CommValueError
TYPE = torchcomms.CommTypeError
BIG = [2**63, 2**64, 10**30, -(2**63) - 1]


def T(n: int = WORLD) -> torch.Tensor:
    return torch.ones(n)


def _valid_args() -> dict[str, dict[str, Any]]:
    """Arguments every bindings-level check accepts, per operation (keyword names as in the
    stubs); a test replaces one at a time."""
    peer = (RANK + 1) % WORLD
    lst = lambda: [T() for _ in range(WORLD)]  # noqa: E731
    return {
        "send": dict(tensor=T(), dst=peer),
        "recv": dict(tensor=T(), src=peer),
        "broadcast": dict(tensor=T(), root=0),
        "all_reduce": dict(tensor=T(), op=ReduceOp.SUM),
        "reduce": dict(tensor=T(), root=0, op=ReduceOp.SUM),
        "all_gather": dict(tensor_list=lst(), tensor=T()),
        "all_gather_v": dict(tensor_list=lst(), tensor=T()),
        "all_gather_single": dict(output=T(WORLD * WORLD), input=T()),
        "reduce_scatter": dict(output=T(), input_list=lst(), op=ReduceOp.SUM),
        "reduce_scatter_v": dict(output=T(), input_list=lst(), op=ReduceOp.SUM),
        "reduce_scatter_single": dict(output=T(), input=T(WORLD * WORLD), op=ReduceOp.SUM),
        "all_to_all_single": dict(output=T(), input=T()),
        "all_to_all_v_single": dict(
            output=T(), input=T(), output_split_sizes=[1] * WORLD, input_split_sizes=[1] * WORLD
        ),
        "all_to_all": dict(output_tensor_list=lst(), input_tensor_list=lst()),
        "device_alltoallv_single": dict(
            output=T(),
            input=T(),
            output_split_sizes=torch.ones(WORLD, dtype=torch.int64),
            input_split_sizes=torch.ones(WORLD, dtype=torch.int64),
        ),
        "barrier": dict(),
        "scatter": dict(output_tensor=T(), input_tensor_list=lst(), root=0),
        "gather": dict(output_tensor_list=lst(), input_tensor=T(), root=0),
        "gather_single": dict(output=T(WORLD * WORLD), input=T(), root=0),
    }


RANK_ARGS = {"dst", "src", "root"}
SPLIT_ARGS = {"output_split_sizes", "input_split_sizes"}
LIST_ARGS = {"tensor_list", "input_list", "output_tensor_list", "input_tensor_list"}


def _bad_values(arg: str, op: str = "") -> list[tuple[Any, type]]:
    """Bad values for an argument of ``op``, each with the type it must raise."""
    if op == "device_alltoallv_single" and arg in SPLIT_ARGS:
        # Counts in int64 tensors, one per rank.
        return _bad_values("tensor") + [
            (torch.ones(WORLD, dtype=torch.int32), VALUE),
            (torch.ones(WORLD + 1, dtype=torch.int64), VALUE),
            ([1] * WORLD, TYPE),
        ]
    if arg in RANK_ARGS:
        return [(b, VALUE) for b in BIG + [WORLD, -1]] + [("0", TYPE), (1.0, TYPE), (None, TYPE)]
    if arg in SPLIT_ARGS:
        return [
            ([2**63] * WORLD, VALUE),
            ([-1] * WORLD, VALUE),
            ([2**64 + 1] * WORLD, VALUE),
            ([2**62 + 1] * WORLD, VALUE),  # sums past any tensor (and wrapped once)
            ([2**63 - 1] * WORLD, VALUE),
            ([1] * (WORLD + 1), VALUE),
            (["1"] * WORLD, TYPE),
            ([1.5] * WORLD, TYPE),
            ("abc", TYPE),
            (5, TYPE),
            (None, TYPE),
        ]
    if arg == "op":
        return [("sum", TYPE), (1, TYPE), (None, TYPE), (torchcomms.RedOpType.PREMUL_SUM, VALUE)]
    if arg in LIST_ARGS:
        return [
            (T(), TYPE),
            (["x"] * WORLD, TYPE),
            ([torch.float32] * WORLD, TYPE),
            (None, TYPE),
            ([T()] * (WORLD + 1), VALUE),
        ]
    # A single tensor.
    return [
        ("x", TYPE),
        (None, TYPE),
        (1, TYPE),
        ([T()], TYPE),
        (torch.float32, TYPE),  # a dtype object where a tensor belongs
        (torch.zeros(WORLD, dtype=torch.complex64), TYPE),
        (torch.empty(WORLD, device="meta"), VALUE),
    ]


COMMON: list[tuple[str, Any, type]] = [
    ("async_op", 1, TYPE),
    ("async_op", None, TYPE),
    ("async_op", "yes", TYPE),
    ("hints", [], TYPE),
    ("hints", {"a": 1}, TYPE),
    ("hints", "x", TYPE),
    ("timeout", "soon", TYPE),
    ("timeout", [1], TYPE),
    ("timeout", -1.0, VALUE),
    ("timeout", float("nan"), VALUE),
    ("timeout", 10**400, VALUE),
    ("timeout", timedelta(seconds=-1), VALUE),
]


def _cases() -> list[tuple[str, str, Any, type]]:
    out = []
    for op, args in _valid_args().items():
        for arg in args:
            if op in ("scatter", "gather") and arg in LIST_ARGS:
                continue  # off the root the list is ignored: covered in test_rooted_lists
            for bad, typ in _bad_values(arg, op):
                out.append((op, arg, bad, typ))
        for arg, bad, typ in COMMON:
            out.append((op, arg, bad, typ))
    return out


def _call(world: Any, opname: str, /, **replace: Any) -> None:
    args = _valid_args()[opname]
    kw: dict[str, Any] = dict(async_op=False, timeout=timedelta(seconds=60))
    kw.update(args)
    kw.update(replace)
    getattr(world, opname)(**kw)


def _assert_raises(call: Callable[[], Any], typ: type, arg: str) -> None:
    try:
        call()
    except BaseException as e:  # noqa: B036 - a PanicException is what this test hunts
        assert type(e) is typ, f"{type(e).__name__}: {e} (expected {typ.__name__})"
        assert f"`{arg}" in str(e), f"message does not name `{arg}`: {e}"
        return
    pytest.fail(f"no error (expected {typ.__name__} naming `{arg}`)")


def _case_id(c: tuple[str, str, Any, type]) -> str:
    text = repr(c[2])
    return f"{c[0]}-{c[1]}-{text[:24]}"


@pytest.mark.parametrize("op,arg,bad,typ", _cases(), ids=[_case_id(c) for c in _cases()])
def test_bad_argument(world: Any, op: str, arg: str, bad: Any, typ: type) -> None:
    _assert_raises(lambda: _call(world, op, **{arg: bad}), typ, arg)


def test_every_operation_is_covered(world: Any) -> None:
    ops = {o for o in dir(world) if isinstance(getattr(type(world), o, None), type(type(world).barrier))}
    management = {"split", "new_window", "finalize", "batch_op_issue"}
    table = set(torchcomms.OpName.__members__) - management
    covered = set(_valid_args()) | {"all_gather_p_exec"}
    assert (table & ops) - covered == set()


def test_rooted_lists(world: Any) -> None:
    for bad, typ in [(T(), TYPE), (["x"] * WORLD, TYPE), (None, TYPE)]:
        _assert_raises(lambda: _call(world, "scatter", input_tensor_list=bad), typ, "input_tensor_list")
        _assert_raises(lambda: _call(world, "gather", output_tensor_list=bad), typ, "output_tensor_list")


def test_overflowing_split_sizes(world: Any) -> None:
    """Sums that wrap around 2**64 used to pass; sizes at 2**63 used to panic."""
    out, inp = torch.empty(4 * WORLD), torch.empty(4 * WORLD)
    for splits in ([2**62 + 1] * 4, [2**63 - 1, 2**63 - 1, 1, 1], [2**64 - 1] * 2):
        if len(splits) != WORLD:
            splits = (splits * WORLD)[:WORLD]
        for arg in ("output_split_sizes", "input_split_sizes"):
            kw = dict(output_split_sizes=[1] * WORLD, input_split_sizes=[1] * WORLD)
            kw[arg] = splits
            _assert_raises(lambda: world.all_to_all_v_single(out, inp, async_op=False, **kw), VALUE, arg)


def test_own_block_mismatch_is_refused(world: Any) -> None:
    """A rank copies the block it sends itself locally: sending itself more than it receives
    used to panic the engine's progress thread (a hang for Python)."""
    out, inp = torch.empty(WORLD), torch.empty(2 * WORLD)
    _assert_raises(
        lambda: world.all_to_all_v_single(out, inp, [1] * WORLD, [2] * WORLD, async_op=False),
        VALUE,
        "input_split_sizes",
    )


def test_huge_roots_and_peers(world: Any) -> None:
    for bad in (2**63, 2**63 - 1 + WORLD, 2**64, -(2**63)):
        with pytest.raises(VALUE, match=rf"root must be in range \[0, {WORLD}\), but got {bad}"):
            world.broadcast(T(), bad, False)
        _assert_raises(lambda: world.send(T(), bad, False), VALUE, "dst")
        _assert_raises(lambda: world.recv(T(), bad, False), VALUE, "src")
        _assert_raises(lambda: world.reduce(T(), bad, ReduceOp.SUM, False), VALUE, "root")


def test_persistent_all_gather_handle(world: Any) -> None:
    for bad in (None, 1, T()):
        _assert_raises(
            lambda: world.all_gather_p_exec(bad, T(), async_op=False), TYPE, "handle"
        )


def test_batch_arguments(world: Any) -> None:
    b = world.batch_op_create()
    _assert_raises(lambda: b.send(T(), "1"), TYPE, "dst")
    _assert_raises(lambda: b.recv(T(), None), TYPE, "src")
    _assert_raises(lambda: b.issue(1), TYPE, "async_op")
    _assert_raises(lambda: b.issue(False, options=5), TYPE, "options")
    for bad in BIG:
        b = world.batch_op_create()
        b.send(T(), bad)
        _assert_raises(lambda: b.issue(False), VALUE, "ops[0].peer")
    b = world.batch_op_create()
    b.recv("not a tensor", (RANK + 1) % WORLD)
    _assert_raises(lambda: b.issue(False), TYPE, "ops[0].tensor")
    _assert_raises(lambda: torchcomms.P2POp(torchcomms.P2POpType.SEND, T(), "x"), TYPE, "peer")
    _assert_raises(lambda: torchcomms.P2POp("SEND", T(), 0), TYPE, "type")
    b = world.batch_op_create()
    b.ops = [torchcomms.P2POp(torchcomms.P2POpType.SEND, T(), 2**64)]
    _assert_raises(lambda: b.issue(False), VALUE, "ops[0].peer")


def test_management_arguments(world: Any) -> None:
    _assert_raises(lambda: world.split([2**63], "s"), VALUE, "ranks[0]")
    _assert_raises(lambda: world.split([-1], "s"), VALUE, "ranks[0]")
    _assert_raises(lambda: world.split(["0"], "s"), TYPE, "ranks[0]")
    _assert_raises(lambda: world.split("0", "s"), TYPE, "ranks")
    _assert_raises(lambda: world.split(list(range(WORLD)), 5), TYPE, "name")
    _assert_raises(lambda: world.split(list(range(WORLD)), "s", hints=[1]), TYPE, "hints")
    _assert_raises(lambda: world.split(list(range(WORLD)), "s", timeout="x"), TYPE, "timeout")
    _assert_raises(lambda: world.reconfigure(2**63, []), VALUE, "uuid")
    _assert_raises(lambda: world.reconfigure("u", []), TYPE, "uuid")
    _assert_raises(lambda: world.reconfigure(0, [], hints=5), TYPE, "hints")
    _assert_raises(lambda: world.set_timeout("x"), TYPE, "timeout")
    _assert_raises(lambda: world.set_timeout(-5), VALUE, "timeout")
    _assert_raises(lambda: world.set_hints([1]), TYPE, "hints")
    _assert_raises(lambda: world.register_pre_hook(5), TYPE, "callback")
    _assert_raises(lambda: world.register_post_hook(None), TYPE, "callback")
    _assert_raises(lambda: world.register_abort_hook("f"), TYPE, "callback")
    _assert_raises(lambda: world.tensor_register([1]), TYPE, "tensor")
    _assert_raises(lambda: world.dump_trace(dir=5), TYPE, "dir")
    _assert_raises(lambda: world.all_gather_p_init(T(), hints=[]), TYPE, "hints")
    _assert_raises(lambda: world.all_gather_p_init(T(), timeout=-1.0), VALUE, "timeout")


def test_constructor_arguments() -> None:
    _assert_raises(lambda: torchcomms.ReduceOp("SUM"), TYPE, "opType")
    _assert_raises(lambda: ReduceOp.PREMUL_SUM(2**2000), VALUE, "factor")
    _assert_raises(lambda: ReduceOp.PREMUL_SUM(torch.ones(3)), VALUE, "factor")
    _assert_raises(lambda: ReduceOp.PREMUL_SUM("2"), TYPE, "factor")
    _assert_raises(lambda: torchcomms.register_backend(5, object), TYPE, "name")
    _assert_raises(lambda: torchcomms.register_backend("bad_args_backend", 5), TYPE, "backend_class")
    _assert_raises(lambda: torchcomms._comms.get_mem_allocator(5), TYPE, "backend")
    _assert_raises(lambda: torchcomms.ReconfigureOptions(uuid=-1), VALUE, "uuid")
    _assert_raises(lambda: torchcomms.ReconfigureOptions(uuid=2**64), VALUE, "uuid")
    _assert_raises(lambda: torchcomms.ReconfigureOptions(hints=[]), TYPE, "hints")
    _assert_raises(lambda: torchcomms.ReconfigureOptions(timeout="x"), TYPE, "timeout")
    # new_comm checks its arguments before any rendezvous, so one rank failing alone is fine.
    for kw, typ, arg in [
        (dict(name=5), TYPE, "name"),
        (dict(backend=None), TYPE, "backend"),
        (dict(abort_process_on_timeout_or_error=1), TYPE, "abort_process_on_timeout_or_error"),
        (dict(is_high_priority_stream="no"), TYPE, "is_high_priority_stream"),
        (dict(enable_reconfigure=0), TYPE, "enable_reconfigure"),
        (dict(hints=[("a", "b")]), TYPE, "hints"),
        (dict(timeout=-3), VALUE, "timeout"),
        (dict(timeout=object()), TYPE, "timeout"),
    ]:
        args: dict[str, Any] = dict(backend="ctran", device="cpu", name="bad_args")
        args.update(kw)
        _assert_raises(lambda: torchcomms.new_comm(**args), typ, arg)


def test_a_panic_is_a_normal_exception() -> None:
    """The last line of defence: a Rust panic inside an entry point (a bug) arrives as
    CommInternalError, which `except Exception` (and `except RuntimeError`) catch."""
    assert issubclass(torchcomms.CommInternalError, RuntimeError)
    try:
        torchcomms._comms._panic_for_test("a bug")
    except Exception as e:
        assert type(e) is torchcomms.CommInternalError
        assert "a bug" in str(e) and "_panic_for_test" in str(e)
    else:
        pytest.fail("no exception")


def test_comm_usable_after_bad_arguments(world: Any) -> None:
    t = torch.ones(3)
    world.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert torch.all(t == WORLD)
