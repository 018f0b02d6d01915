"""Every operation x dtype (x reduce op for reductions), synchronous and asynchronous, checked
against a reference computed in Python from every rank's (deterministic) input."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest
import torch

from conftest import ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, RANK, WORLD, dtype_id, need_ranks
from torchcomms import ReduceOp

# Reduce ops valid for each kind of dtype (the invalid pairs are checked in test_errors.py).
FLOAT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM"]
INT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM"]
BOOL_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
FACTOR = 2.0


def _combos() -> list[Any]:
    out = []
    for d in FLOAT_DTYPES:
        out += [pytest.param(d, op, id=f"{dtype_id(d)}-{op}") for op in FLOAT_OPS]
    for d in INT_DTYPES:
        out += [pytest.param(d, op, id=f"{dtype_id(d)}-{op}") for op in INT_OPS]
    out += [pytest.param(torch.bool, op, id=f"bool-{op}") for op in BOOL_OPS]
    return out


def reduce_op(name: str) -> ReduceOp:
    return ReduceOp.PREMUL_SUM(FACTOR) if name == "PREMUL_SUM" else getattr(ReduceOp, name)


def value(rank: int, n: int, dtype: torch.dtype, op: str, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input of ``n`` elements: small values whose reduction is exact in every
    dtype (products stay within 2**WORLD, sums within 5 * WORLD)."""
    i = torch.arange(n, dtype=torch.int64) + salt
    if dtype == torch.bool:
        return ((i + rank) % 3 != 0).to(torch.bool)
    if op == "PRODUCT":
        v = (i + rank) % 2 + 1
    else:
        v = ((rank + 1) * (i + 1)) % 5 + 1
    return v.to(dtype)


def reference(inputs: list[torch.Tensor], op: str, dtype: torch.dtype) -> torch.Tensor:
    """The reduction of ``inputs`` with the engine's semantics (computed in 64 bits)."""
    if dtype == torch.bool:
        s = torch.stack([t.to(torch.int64) for t in inputs])
        if op in ("SUM", "MAX", "BOR"):
            return s.amax(0).to(torch.bool) if s.numel() else s.sum(0).to(torch.bool)
        if op in ("PRODUCT", "MIN", "BAND"):
            return s.amin(0).to(torch.bool) if s.numel() else s.sum(0).to(torch.bool)
        return (s.sum(0) % 2).to(torch.bool)  # BXOR
    is_float = dtype.is_floating_point
    s = torch.stack([t.to(torch.float64 if is_float else torch.int64) for t in inputs])
    n = len(inputs)
    if op == "SUM":
        r = s.sum(0)
    elif op == "PRODUCT":
        r = s.prod(0)
    elif op == "MIN":
        r = s.amin(0) if s.shape[1] else s.sum(0)
    elif op == "MAX":
        r = s.amax(0) if s.shape[1] else s.sum(0)
    elif op == "BAND":
        r = s[0].clone()
        for t in s[1:]:
            r &= t
    elif op == "BOR":
        r = s[0].clone()
        for t in s[1:]:
            r |= t
    elif op == "BXOR":
        r = s[0].clone()
        for t in s[1:]:
            r ^= t
    elif op == "AVG":
        r = s.sum(0) / n if is_float else torch.div(s.sum(0), n, rounding_mode="trunc")
    elif op == "PREMUL_SUM":
        r = (s * FACTOR).sum(0) if is_float else (s * int(FACTOR)).sum(0)
    else:
        raise AssertionError(op)
    return r.to(dtype)


def check(actual: torch.Tensor, expected: torch.Tensor, op: str = "SUM") -> None:
    assert actual.dtype == expected.dtype
    if actual.dtype in (torch.float16, torch.bfloat16) and op == "AVG":
        # AVG prescales by 1/n rounded to the dtype (NCCL's semantics): not exact for n = 3.
        torch.testing.assert_close(actual, expected, rtol=2e-2, atol=2e-2)
    elif actual.dtype.is_floating_point and op == "AVG":
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(actual, expected), f"{actual} != {expected}"


def run(fn: Callable[[bool], Any], async_op: bool) -> None:
    """Calls ``fn(async_op)`` and waits for the work it returns."""
    work = fn(async_op)
    assert work is not None
    if async_op:
        work.wait()
    assert work.is_completed()


SIZES = [0, 1, 7, 1000]


@pytest.mark.parametrize("dtype,op", _combos())
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_reductions(world: Any, dtype: torch.dtype, op: str, async_op: bool) -> None:
    """all_reduce, reduce, reduce_scatter(_v, _single) for one dtype and reduce op."""
    n, r = WORLD, RANK
    rop = reduce_op(op)
    k = 7

    # all_reduce
    t = value(r, k, dtype, op)
    run(lambda a: world.all_reduce(t, rop, a), async_op)
    check(t, reference([value(q, k, dtype, op) for q in range(n)], op, dtype), op)

    # reduce onto the last rank; other ranks keep their input
    root = n - 1
    t = value(r, k, dtype, op, salt=3)
    run(lambda a: world.reduce(t, root, rop, a), async_op)
    if r == root:
        check(t, reference([value(q, k, dtype, op, salt=3) for q in range(n)], op, dtype), op)
    else:
        assert torch.equal(t, value(r, k, dtype, op, salt=3))

    # reduce_scatter: block j of every rank's input list reduces onto rank j
    ins = [value(r, k, dtype, op, salt=10 * j) for j in range(n)]
    out = torch.empty(k, dtype=dtype)
    run(lambda a: world.reduce_scatter(out, ins, rop, a), async_op)
    check(out, reference([value(q, k, dtype, op, salt=10 * r) for q in range(n)], op, dtype), op)

    # reduce_scatter_v: block j has j + 1 elements
    ins = [value(r, j + 1, dtype, op, salt=j) for j in range(n)]
    out = torch.empty(r + 1, dtype=dtype)
    run(lambda a: world.reduce_scatter_v(out, ins, rop, a), async_op)
    check(out, reference([value(q, r + 1, dtype, op, salt=r) for q in range(n)], op, dtype), op)

    # reduce_scatter_single: the input is n blocks of the output's size
    inp = torch.cat([value(r, k, dtype, op, salt=j) for j in range(n)])
    out = torch.empty(k, dtype=dtype)
    run(lambda a: world.reduce_scatter_single(out, inp, rop, a), async_op)
    check(out, reference([value(q, k, dtype, op, salt=r) for q in range(n)], op, dtype), op)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_all_reduce_sizes(world: Any, size: int, async_op: bool) -> None:
    t = value(RANK, size, torch.float32, "SUM")
    run(lambda a: world.all_reduce(t, ReduceOp.SUM, a), async_op)
    check(t, reference([value(q, size, torch.float32, "SUM") for q in range(WORLD)], "SUM", torch.float32))


def test_all_reduce_large(world: Any) -> None:
    """Several staging chunks (1 MiB each by default) and an odd element count."""
    n = (3 << 20) // 4 + 13
    t = torch.full((n,), float(RANK + 1), dtype=torch.float32)
    world.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert torch.all(t == WORLD * (WORLD + 1) / 2)


def test_all_reduce_2d_and_views(world: Any) -> None:
    """Tensors of any shape, and contiguous views into larger tensors (data_ptr offsets)."""
    base = torch.zeros(4, 6, dtype=torch.int32)
    view = base[1:3]  # contiguous rows
    view.fill_(RANK + 1)
    world.all_reduce(view, ReduceOp.SUM, async_op=False)
    assert torch.all(base[1:3] == WORLD * (WORLD + 1) // 2)
    assert torch.all(base[0] == 0) and torch.all(base[3] == 0)


def test_premul_sum_tensor_factor(world: Any) -> None:
    """PREMUL_SUM's factor can be a tensor (upstream tests use a bf16 one)."""
    factor = torch.tensor(3.0, dtype=torch.bfloat16)
    t = torch.full((5,), float(RANK + 1))
    world.all_reduce(t, ReduceOp.PREMUL_SUM(factor), async_op=False)
    assert torch.all(t == 3.0 * WORLD * (WORLD + 1) / 2)


def _data(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Distinct data per (rank, salt) for the data-movement operations."""
    i = torch.arange(n, dtype=torch.int64)
    v = (rank * 31 + salt * 7 + i * 3) % 101
    if dtype == torch.bool:
        return (v % 2 == 1).to(torch.bool)
    if dtype in (torch.int8,):
        return (v % 100).to(dtype)
    return v.to(dtype)


DT = [pytest.param(d, id=dtype_id(d)) for d in ALL_DTYPES]
MODES = pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])


@pytest.mark.parametrize("dtype", DT)
@MODES
def test_broadcast(world: Any, dtype: torch.dtype, async_op: bool) -> None:
    for root in range(WORLD):
        t = _data(RANK, 9, dtype, salt=root) if RANK == root else torch.zeros(9, dtype=dtype)
        run(lambda a: world.broadcast(t, root, a), async_op)
        assert torch.equal(t, _data(root, 9, dtype, salt=root))


@pytest.mark.parametrize("dtype", DT)
@MODES
def test_all_gather(world: Any, dtype: torch.dtype, async_op: bool) -> None:
    out = [torch.empty(5, dtype=dtype) for _ in range(WORLD)]
    run(lambda a: world.all_gather(out, _data(RANK, 5, dtype), a), async_op)
    for q in range(WORLD):
        assert torch.equal(out[q], _data(q, 5, dtype))


@pytest.mark.parametrize("dtype", DT)
@MODES
def test_all_gather_v(world: Any, dtype: torch.dtype, async_op: bool) -> None:
    out = [torch.empty(q + 2, dtype=dtype) for q in range(WORLD)]
    run(lambda a: world.all_gather_v(out, _data(RANK, RANK + 2, dtype), a), async_op)
    for q in range(WORLD):
        assert torch.equal(out[q], _data(q, q + 2, dtype))


@pytest.mark.parametrize("dtype", DT)
@MODES
def test_all_gather_single(world: Any, dtype: torch.dtype, async_op: bool) -> None:
    out = torch.empty(WORLD * 6, dtype=dtype)
    run(lambda a: world.all_gather_single(out, _data(RANK, 6, dtype), a), async_op)
    assert torch.equal(out, torch.cat([_data(q, 6, dtype) for q in range(WORLD)]))


@pytest.mark.parametrize("dtype", DT)
@MODES
def test_all_gather_p(world: Any, dtype: torch.dtype, async_op: bool) -> None:
    """A persistent all-gather: one bound output, filled by every execution."""
    out = torch.empty(WORLD * 7, dtype=dtype)
    handle = world.all_gather_p_init(out, hints={"window": "true"})
    assert handle.output is out
    # CPU windows exist on every transport: more than one rank runs on one-sided puts.
    assert handle.uses_window == (WORLD > 1)
    for salt in range(20):
        run(lambda a: world.all_gather_p_exec(handle, _data(RANK, 7, dtype, salt=salt), a), async_op)
        assert torch.equal(out, torch.cat([_data(q, 7, dtype, salt=salt) for q in range(WORLD)]))
    world.all_gather_p_free(handle)


def test_all_gather_p_in_place_and_with_a_slow_reader(world: Any) -> None:
    """Input aliasing this rank's block; a rank that reads its output late still sees its own
    round (peers wait for its "free" signal before they overwrite it)."""
    n = 1000
    out = torch.zeros(WORLD * n, dtype=torch.float32)
    handle = world.all_gather_p_init(out, hints={"window": "true"})
    mine = out[RANK * n : (RANK + 1) * n]
    for it in range(10):
        mine.fill_(float(it * 100 + RANK))
        world.all_gather_p_exec(handle, mine, False)
        if RANK == 0:
            time.sleep(0.02)
        want = torch.cat([torch.full((n,), float(it * 100 + q)) for q in range(WORLD)])
        torch.testing.assert_close(out, want)
    world.all_gather_p_free(handle)


@pytest.mark.parametrize("window", [None, "auto", "false", "0"])
def test_all_gather_p_on_cpu_runs_an_all_gather_unless_asked(world: Any, window: Any) -> None:
    out = torch.zeros(WORLD * 3, dtype=torch.int64)
    hints = None if window is None else {"window": window}
    handle = world.all_gather_p_init(out, hints=hints)
    assert not handle.uses_window
    world.all_gather_p_exec(handle, torch.full((3,), RANK), False)
    assert torch.equal(out, torch.arange(WORLD).repeat_interleave(3))
    world.all_gather_p_free(handle)


def test_all_gather_p_refuses_a_bad_window_hint(world: Any) -> None:
    with pytest.raises(ValueError, match="all_gather_p_init: invalid argument `hints`: expected `window` set to auto, true or false"):
        world.all_gather_p_init(torch.zeros(WORLD), hints={"window": "sometimes"})


def test_all_gather_p_refuses_a_mismatched_input(world: Any) -> None:
    handle = world.all_gather_p_init(torch.empty(WORLD * 4, dtype=torch.float32))
    with pytest.raises(ValueError, match="all_gather_p_exec: invalid argument `input`: expected dtype f32"):
        world.all_gather_p_exec(handle, torch.zeros(4, dtype=torch.int32), False)
    with pytest.raises(ValueError, match=f"all_gather_p_exec: invalid argument `handle`: expected {WORLD * 3} elements"):
        world.all_gather_p_exec(handle, torch.zeros(3, dtype=torch.float32), False)
    with pytest.raises(TypeError, match="must be an AllGatherPHandle"):
        world.all_gather_p_exec(object(), torch.zeros(4), False)
    world.all_gather_p_free(handle)


def _a2a_size(src: int, dst: int) -> int:
    return (src + 2 * dst) % 3 + 1


@pytest.mark.parametrize("dtype", DT)
@MODES
def test_all_to_all(world: Any, dtype: torch.dtype, async_op: bool) -> None:
    ins = [_data(RANK, _a2a_size(RANK, j), dtype, salt=j) for j in range(WORLD)]
    outs = [torch.empty(_a2a_size(i, RANK), dtype=dtype) for i in range(WORLD)]
    run(lambda a: world.all_to_all(outs, ins, a), async_op)
    for i in range(WORLD):
        assert torch.equal(outs[i], _data(i, _a2a_size(i, RANK), dtype, salt=RANK))


@pytest.mark.parametrize("dtype", DT)
@MODES
def test_all_to_all_single(world: Any, dtype: torch.dtype, async_op: bool) -> None:
    k = 4
    inp = torch.cat([_data(RANK, k, dtype, salt=j) for j in range(WORLD)])
    out = torch.empty(WORLD * k, dtype=dtype)
    run(lambda a: world.all_to_all_single(out, inp, a), async_op)
    assert torch.equal(out, torch.cat([_data(i, k, dtype, salt=RANK) for i in range(WORLD)]))


@pytest.mark.parametrize("dtype", DT)
@MODES
def test_all_to_all_v_single(world: Any, dtype: torch.dtype, async_op: bool) -> None:
    """Split sizes count rows of dimension 0 (rows of 3 elements here); output comes first."""
    w = 3
    in_splits = [_a2a_size(RANK, j) for j in range(WORLD)]
    out_splits = [_a2a_size(i, RANK) for i in range(WORLD)]
    inp = torch.cat([_data(RANK, s * w, dtype, salt=j).reshape(s, w) for j, s in enumerate(in_splits)])
    out = torch.full((sum(out_splits), w), 0, dtype=dtype)
    run(lambda a: world.all_to_all_v_single(out, inp, out_splits, in_splits, a), async_op)
    want = torch.cat([_data(i, s * w, dtype, salt=RANK).reshape(s, w) for i, s in enumerate(out_splits)])
    assert torch.equal(out, want)


@pytest.mark.parametrize("dtype", DT)
@MODES
def test_scatter(world: Any, dtype: torch.dtype, async_op: bool) -> None:
    root = WORLD - 1
    ins = [_data(root, 6, dtype, salt=j) for j in range(WORLD)] if RANK == root else []
    out = torch.empty(6, dtype=dtype)
    run(lambda a: world.scatter(out, ins, root, a), async_op)
    assert torch.equal(out, _data(root, 6, dtype, salt=RANK))


@pytest.mark.parametrize("dtype", DT)
@MODES
def test_gather(world: Any, dtype: torch.dtype, async_op: bool) -> None:
    root = 0
    outs = [torch.empty(6, dtype=dtype) for _ in range(WORLD)] if RANK == root else []
    run(lambda a: world.gather(outs, _data(RANK, 6, dtype), root, a), async_op)
    if RANK == root:
        for q in range(WORLD):
            assert torch.equal(outs[q], _data(q, 6, dtype))


@pytest.mark.parametrize("dtype", DT)
@MODES
def test_gather_single(world: Any, dtype: torch.dtype, async_op: bool) -> None:
    root = WORLD // 2
    out = torch.empty(WORLD * 5, dtype=dtype)
    run(lambda a: world.gather_single(out, _data(RANK, 5, dtype), root, a), async_op)
    if RANK == root:
        assert torch.equal(out, torch.cat([_data(q, 5, dtype) for q in range(WORLD)]))


@pytest.mark.parametrize("dtype", DT)
@MODES
def test_send_recv_ring(world: Any, dtype: torch.dtype, async_op: bool) -> None:
    need_ranks(2)
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    got = torch.empty(8, dtype=dtype)
    if async_op:
        ws = world.send(_data(RANK, 8, dtype), nxt, True)
        wr = world.recv(got, prv, True)
        ws.wait()
        wr.wait()
    elif RANK % 2 == 0:
        world.send(_data(RANK, 8, dtype), nxt, False)
        world.recv(got, prv, False)
    else:
        world.recv(got, prv, False)
        world.send(_data(RANK, 8, dtype), nxt, False)
    assert torch.equal(got, _data(prv, 8, dtype))


@MODES
def test_barrier(world: Any, async_op: bool) -> None:
    run(lambda a: world.barrier(a), async_op)


def test_keyword_and_positional_arguments(world: Any) -> None:
    """Every argument is positional-or-keyword; hints and timeout are accepted."""
    from datetime import timedelta

    t = torch.ones(3)
    world.all_reduce(t, ReduceOp.SUM, False)
    world.all_reduce(tensor=t, op=ReduceOp.SUM, async_op=False, hints={"algo": "ring"}, timeout=timedelta(seconds=30))
    world.all_reduce(t, op=ReduceOp.SUM, async_op=False, timeout=30.0)
    assert torch.all(t == WORLD**3)
    out = torch.empty(WORLD)
    world.all_gather_single(output=out, input=torch.tensor([float(RANK)]), async_op=False)
    assert out.tolist() == [float(q) for q in range(WORLD)]
    world.broadcast(tensor=t, root=0, async_op=False)
    world.barrier(async_op=False, hints=None, timeout=None)
