"""CUDA tensors through ``torchcomms``, one process per GPU, on the backend named by
``TORCHCOMMS_TEST_BACKEND`` (``nccl``, the default, or ``ctran``: our engine, whose GPU
progress engine carries device buffers over the host transports)::

    TORCHCOMMS_TEST_BACKEND=ctran torchrun --nproc_per_node NGPU -m pytest bindings/python/gpu_tests -q -p no:cacheprovider

Run by ``scripts/gpu-test.sh`` on a GPU machine. Every result is computed by torch on the device
and compared with what the communicator produced. Stream semantics follow ProcessGroupNCCL: an
operation runs after the work issued so far on the caller's current stream, and ``wait()`` makes
the current stream wait for it without blocking the host.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import pytest
import torch

import torchcomms
from torchcomms import ReduceOp

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL = int(os.environ.get("LOCAL_RANK", "0"))
BACKEND = os.environ.get("TORCHCOMMS_TEST_BACKEND", "nccl")

if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

DEV = torch.device("cuda", LOCAL % torch.cuda.device_count())
torch.cuda.set_device(DEV)

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8]
DTYPES = FLOATS + INTS
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"]


def dname(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


@pytest.fixture(scope="module")
def comm() -> Any:
    c = torchcomms.new_comm(
        BACKEND,
        DEV,
        "gpu_pytest",
        abort_process_on_timeout_or_error=False,
        timeout=timedelta(seconds=120),
    )
    assert c.get_rank() == RANK and c.get_size() == WORLD
    assert c.get_backend() == BACKEND
    yield c
    c.finalize()


def values(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Small values that every op keeps exact (products too), distinct per rank."""
    i = torch.arange(n, dtype=torch.int64)
    v = (i * 7 + rank * 3) % 5 + 1
    if dtype == torch.int8 or dtype == torch.uint8:
        v = (i + rank) % 3 + 1
    return v.to(dtype)


def expected(op: str, dtype: torch.dtype, n: int) -> torch.Tensor:
    xs = [values(r, n, dtype).to(torch.float64 if dtype.is_floating_point else torch.int64)
          for r in range(WORLD)]
    acc = xs[0].clone()
    for x in xs[1:]:
        if op == "SUM" or op == "AVG":
            acc = acc + x
        elif op == "PRODUCT":
            acc = acc * x
        elif op == "MIN":
            acc = torch.minimum(acc, x)
        elif op == "MAX":
            acc = torch.maximum(acc, x)
        elif op == "BAND":
            acc = acc & x
        elif op == "BOR":
            acc = acc | x
        elif op == "BXOR":
            acc = acc ^ x
    if op == "AVG":
        acc = acc / WORLD if dtype.is_floating_point else torch.div(acc, WORLD, rounding_mode="floor")
    return acc.to(dtype)


# Bitwise ops are defined for integers only (torch and NCCL refuse them on floats).
REDUCTIONS = [
    (d, op) for d in DTYPES for op in OPS
    if not (d.is_floating_point and op in ("BAND", "BOR", "BXOR"))
]


@pytest.mark.parametrize("dtype,op", REDUCTIONS, ids=lambda v: dname(v) if isinstance(v, torch.dtype) else v)
def test_all_reduce_every_dtype_and_op(comm: Any, dtype: torch.dtype, op: str) -> None:
    n = 1031
    t = values(RANK, n, dtype).to(DEV)
    comm.all_reduce(t, getattr(ReduceOp, op), async_op=False)
    want = expected(op, dtype, n)
    got = t.cpu()
    if dtype.is_floating_point:
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-2, atol=1e-2)
    else:
        assert torch.equal(got, want), f"{op} {dtype}"


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_data_movement_ops(comm: Any, dtype: torch.dtype) -> None:
    n = 257
    mine = values(RANK, n, dtype).to(DEV)
    allv = [values(r, n, dtype) for r in range(WORLD)]
    # broadcast from the last rank
    b = mine.clone()
    comm.broadcast(b, WORLD - 1, async_op=False)
    assert torch.equal(b.cpu(), allv[WORLD - 1])
    # all_gather, all_gather_single
    outs = [torch.empty(n, dtype=dtype, device=DEV) for _ in range(WORLD)]
    comm.all_gather(outs, mine, async_op=False)
    for r in range(WORLD):
        assert torch.equal(outs[r].cpu(), allv[r])
    flat = torch.empty(WORLD * n, dtype=dtype, device=DEV)
    comm.all_gather_single(flat, mine, async_op=False)
    assert torch.equal(flat.cpu(), torch.cat(allv))
    # all_to_all_single: block j of rank r holds values(r) shifted by j
    inp = torch.cat([values(RANK + 10 * j, n, dtype) for j in range(WORLD)]).to(DEV)
    out = torch.empty_like(inp)
    comm.all_to_all_single(out, inp, async_op=False)
    want = torch.cat([values(s + 10 * RANK, n, dtype) for s in range(WORLD)])
    assert torch.equal(out.cpu(), want)
    # scatter / gather from/to rank 0
    blocks = [values(100 + r, n, dtype).to(DEV) for r in range(WORLD)]
    got = torch.empty(n, dtype=dtype, device=DEV)
    comm.scatter(got, blocks if RANK == 0 else [], 0, async_op=False)
    assert torch.equal(got.cpu(), values(100 + RANK, n, dtype))
    gathered = [torch.empty(n, dtype=dtype, device=DEV) for _ in range(WORLD)] if RANK == 0 else []
    comm.gather(gathered, mine, 0, async_op=False)
    if RANK == 0:
        for r in range(WORLD):
            assert torch.equal(gathered[r].cpu(), allv[r])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=dname)
def test_reductions_to_blocks(comm: Any, dtype: torch.dtype) -> None:
    n = 129
    want = expected("SUM", dtype, WORLD * n)
    inp = values(RANK, WORLD * n, dtype).to(DEV)
    out = torch.empty(n, dtype=dtype, device=DEV)
    comm.reduce_scatter_single(out, inp, ReduceOp.SUM, async_op=False)
    assert torch.equal(out.cpu(), want[RANK * n:(RANK + 1) * n])
    out2 = torch.empty(n, dtype=dtype, device=DEV)
    comm.reduce_scatter(out2, list(inp.chunk(WORLD)), ReduceOp.SUM, async_op=False)
    assert torch.equal(out2.cpu(), want[RANK * n:(RANK + 1) * n])
    r = inp.clone()
    comm.reduce(r, 0, ReduceOp.SUM, async_op=False)
    if RANK == 0:
        assert torch.equal(r.cpu(), want)


def test_send_recv_ring_and_batch(comm: Any) -> None:
    if WORLD < 2:
        pytest.skip("needs 2 ranks")
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    x = torch.full((1000,), float(RANK), device=DEV)
    y = torch.empty(1000, device=DEV)
    if RANK % 2 == 0:
        comm.send(x, nxt, async_op=False)
        comm.recv(y, prv, async_op=False)
    else:
        w = comm.recv(y, prv, async_op=True)
        comm.send(x, nxt, async_op=False)
        w.wait()
    assert torch.equal(y.cpu(), torch.full((1000,), float(prv)))
    batch = comm.batch_op_create()
    z = torch.empty(1000, device=DEV)
    batch.send(x * 2, nxt)
    batch.recv(z, prv)
    batch.issue(async_op=False)
    assert torch.equal(z.cpu(), torch.full((1000,), 2.0 * prv))
    comm.barrier(async_op=False)


def test_premul_sum_with_device_tensor_factor(comm: Any) -> None:
    factor = torch.tensor([0.5], device=DEV) * 3  # 1.5, computed on the device
    t = torch.full((4096,), float(RANK + 1), device=DEV)
    comm.all_reduce(t, ReduceOp.PREMUL_SUM(factor), async_op=False)
    want = 1.5 * sum(range(1, WORLD + 1))
    assert torch.equal(t.cpu(), torch.full((4096,), want))


def test_runs_on_the_current_stream(comm: Any) -> None:
    """On a side stream: x = x * 2; all_reduce(x); x = x + 1 — only stream order gives the
    right answer; wait() returns without blocking the host."""
    s = torch.cuda.Stream(device=DEV)
    x = torch.full((1 << 22,), float(RANK + 1), device=DEV)
    torch.cuda.synchronize(DEV)
    with torch.cuda.stream(s):
        x.mul_(2)
        w = comm.all_reduce(x, ReduceOp.SUM, async_op=True)
        w.wait()
        x.add_(1)
    s.synchronize()
    want = 2 * sum(range(1, WORLD + 1)) + 1
    assert torch.equal(x.cpu(), torch.full((1 << 22,), float(want)))
    assert w.is_completed()


def test_wait_orders_the_stream_current_at_the_wait(comm: Any) -> None:
    """Issued on one stream, waited on another: wait() orders the stream current at the wait
    (upstream's TorchWork), and wait_blocking() blocks the host until the operation is done."""
    issue, consume = torch.cuda.Stream(device=DEV), torch.cuda.Stream(device=DEV)
    n = 1 << 22
    x = torch.full((n,), float(RANK + 1), device=DEV)
    torch.cuda.synchronize(DEV)
    with torch.cuda.stream(issue):
        torch.cuda._sleep(50_000_000)  # the operation starts late: only ordering helps
        w = comm.all_reduce(x, ReduceOp.SUM, async_op=True)
    with torch.cuda.stream(consume):
        w.wait()
        y = x * 2
    consume.synchronize()
    assert torch.equal(y.cpu(), torch.full((n,), float(2 * sum(range(1, WORLD + 1)))))
    with torch.cuda.stream(issue):
        torch.cuda._sleep(50_000_000)
        w = comm.all_reduce(x, ReduceOp.SUM, async_op=True)
    w.wait_blocking()
    assert w.is_completed()
    torch.cuda.synchronize(DEV)


def test_sync_ops_on_two_streams_keep_their_order(comm: Any) -> None:
    """Synchronous ops may run on the caller's stream itself (ctran over NVLink): alternating
    two streams, with an async op between them, every op must still follow its stream's work
    and the comm's earlier ops on every rank."""
    a, b = torch.cuda.Stream(device=DEV), torch.cuda.Stream(device=DEV)
    n = 1 << 16
    x = torch.full((n,), float(RANK + 1), device=DEV)
    y = torch.full((n,), float(RANK + 1), device=DEV)
    torch.cuda.synchronize(DEV)
    s = sum(range(1, WORLD + 1))
    with torch.cuda.stream(a):
        x.mul_(2)
        comm.all_reduce(x, ReduceOp.SUM, async_op=False)
    with torch.cuda.stream(b):
        y.add_(1)
        comm.all_reduce(y, ReduceOp.SUM, async_op=False)
    with torch.cuda.stream(a):
        w = comm.all_reduce(x, ReduceOp.SUM, async_op=True)
        w.wait()
        x.add_(1)
        comm.all_reduce(x, ReduceOp.SUM, async_op=False)
    with torch.cuda.stream(b):
        comm.all_reduce(y, ReduceOp.MAX, async_op=False)
        y.mul_(3)
    torch.cuda.synchronize(DEV)
    assert torch.equal(x.cpu(), torch.full((n,), float((2 * s * WORLD + 1) * WORLD)))
    assert torch.equal(y.cpu(), torch.full((n,), float(3 * (s + WORLD))))


def test_async_tensor_kept_alive(comm: Any) -> None:
    works = []
    for i in range(8):
        t = torch.full((1 << 16,), float(i), device=DEV)
        works.append((comm.all_reduce(t, ReduceOp.SUM, async_op=True), t.data_ptr()))
        del t  # the op keeps the tensor alive until it completes
    for w, _ in works:
        w.wait()
    torch.cuda.synchronize(DEV)


def test_async_issue_does_not_block_the_host(comm: Any) -> None:
    """Issuing 100 async all_reduces of 1 MB returns in well under the time they take: the
    host thread only enqueues (the GPE thread or NCCL drives them)."""
    ts = [torch.full((1 << 18,), float(i), device=DEV) for i in range(100)]
    torch.cuda.synchronize(DEV)
    comm.barrier(async_op=False)
    start = time.perf_counter()
    works = [comm.all_reduce(t, ReduceOp.SUM, async_op=True) for t in ts]
    issued = time.perf_counter() - start
    for w in works:
        w.wait()
    torch.cuda.synchronize(DEV)
    print(f"rank {RANK}: 100 async all_reduce (1 MB) issued in {issued * 1e3:.2f} ms")
    assert issued < 0.010, f"issuing took {issued * 1e3:.1f} ms"
    for i, t in enumerate(ts):
        assert torch.equal(t[:4].cpu(), torch.full((4,), float(i * WORLD)))


def test_frees_on_another_thread_during_async_ops(comm: Any) -> None:
    """``cudaFree`` waits for the whole device, so a free on another thread can stall the
    issuing thread's next CUDA call until the ops already on the stream finish. Those ops must
    finish without anything more from the issuing thread (ctran's GPE once deadlocked here)."""
    import threading

    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            scratch = torch.empty(1 << 22, device=DEV)
            del scratch
            torch.cuda.empty_cache()

    freer = threading.Thread(target=churn, daemon=True)
    freer.start()
    try:
        for i in range(100):
            t = torch.full((1 << 14,), float(i), device=DEV)
            w = comm.all_reduce(t, ReduceOp.SUM, async_op=True)
            w.wait()
            assert torch.equal(t[:4].cpu(), torch.full((4,), float(i * WORLD)))
    finally:
        stop.set()
        freer.join(timeout=60)
    assert not freer.is_alive(), "the freeing thread is stuck"


def over_nvl() -> bool:
    """Whether ctran carries this job's CUDA tensors over NVLink (or, alone, needs no
    transport): only when every rank is on this host (torchrun's node) with a GPU of its own,
    and the transport is allowed (ranks sharing a GPU run over the host transports)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", WORLD))
    own_gpus = local == WORLD and torch.cuda.device_count() >= local
    return own_gpus and "nvl" in os.environ.get("CTRAN_BACKENDS", "socket,shm,nvl").split(",")


def test_cuda_graph_capture_and_replay(comm: Any) -> None:
    """Captured in a torch.cuda.graph (global capture mode, PyTorch's default) and replayed
    three times with new inputs written before each replay. ctran over host transports cannot
    be captured (its host half runs per issue) and says so; over NVLink it can, in both modes
    (a 32 MB all_reduce runs direct between user buffers, the small all_gather staged, the small
    all_reduce on the low-latency path)."""
    if BACKEND == "ctran" and not over_nvl():
        g = torch.cuda.CUDAGraph()
        x = torch.zeros(16, device=DEV)
        with pytest.raises(NotImplementedError, match="CUDA graph"):
            with torch.cuda.graph(g):
                comm.all_reduce(x, ReduceOp.SUM, async_op=False)
        return
    x = torch.zeros(1 << (23 if BACKEND == "ctran" else 16), device=DEV)
    small = torch.zeros(33, device=DEV)
    outs = [torch.empty(16, device=DEV) for _ in range(WORLD)]
    mine = torch.zeros(16, device=DEV)
    s = torch.cuda.Stream(device=DEV)
    s.wait_stream(torch.cuda.current_stream(DEV))
    with torch.cuda.stream(s):  # warm up what is captured, outside the capture (PyTorch's advice)
        comm.all_reduce(x, ReduceOp.SUM, async_op=False)
        comm.all_reduce(small, ReduceOp.MAX, async_op=False)
        comm.all_gather(outs, mine, async_op=True).wait()
    torch.cuda.current_stream(DEV).wait_stream(s)
    torch.cuda.synchronize(DEV)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        comm.all_reduce(x, ReduceOp.SUM, async_op=False)
        comm.all_reduce(small, ReduceOp.MAX, async_op=False)
        w = comm.all_gather(outs, mine, async_op=True)
        w.wait()
    for replay in range(3):
        x.fill_(float(RANK + 1 + 10 * replay))
        small.fill_(float(RANK * 7 + replay))
        mine.fill_(float(100 * RANK + replay))
        g.replay()
        torch.cuda.synchronize(DEV)
        want = sum(r + 1 + 10 * replay for r in range(WORLD))
        assert torch.equal(x.cpu(), torch.full_like(x, float(want)).cpu()), f"replay {replay}"
        top = float((WORLD - 1) * 7 + replay)
        assert torch.equal(small.cpu(), torch.full((33,), top)), f"replay {replay}"
        for r in range(WORLD):
            assert torch.equal(outs[r].cpu(), torch.full((16,), float(100 * r + replay)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.uint8, torch.float32, torch.float64], ids=dname)
def test_small_all_reduce_of_unaligned_views_is_exact_and_the_same_on_every_rank(
    comm: Any, dtype: torch.dtype
) -> None:
    """Views one element into their storage (not 8-byte aligned, as the low-latency path's
    word loads would like) and sizes that end inside a word: every element reduced, nothing
    around the view touched, and every rank holding the same bits (float sums reduced in one
    order everywhere)."""
    for n in (1, 3, 7, 129, 4097):
        base = torch.full((n + 2,), 99, dtype=dtype, device=DEV)
        t = base[1 : n + 1]
        if dtype.is_floating_point:
            t.copy_(torch.rand(n, generator=torch.Generator().manual_seed(RANK * 1000 + n)).to(dtype))
        else:
            t.copy_(values(RANK, n, dtype))
        inputs = torch.empty((WORLD, n), dtype=dtype, device=DEV)
        comm.all_gather_single(inputs.view(-1), t.contiguous(), async_op=False)
        comm.all_reduce(t, ReduceOp.SUM, async_op=False)
        if dtype.is_floating_point:
            want = inputs.double().sum(0)
            torch.testing.assert_close(t.double(), want, rtol=1e-2, atol=1e-2)
        else:
            assert torch.equal(t, inputs.sum(0, dtype=dtype)), f"n={n}"
        assert base[0].item() == 99 and base[n + 1].item() == 99, f"n={n}: a neighbour changed"
        every = torch.empty((WORLD, n), dtype=dtype, device=DEV)
        comm.all_gather_single(every.view(-1), t.contiguous(), async_op=False)
        bits = every.view(torch.uint8).view(WORLD, -1)
        assert all(torch.equal(bits[0], bits[r]) for r in range(WORLD)), f"n={n}: ranks differ"


def test_large_all_reduce_of_different_sizes_fails_on_every_rank(comm: Any) -> None:
    """Over NVLink a large all_reduce (direct, or pipelined) exchanges every rank's buffer
    first: a rank passing another size makes it fail on every rank, naming the sizes, and no
    rank is left waiting in a kernel, so the comm goes on working."""
    if BACKEND != "ctran" or not over_nvl() or WORLD < 2:
        pytest.skip("only ctran over NVLink sees every rank's size before moving data (2+ ranks)")
    # Above CTRAN_NVL_STAGED_MAX_BYTES (16 MiB) on every rank: 16 MiB plus 4 KiB per rank + 1.
    t = torch.ones((4 << 20) + 1024 * (RANK + 1), device=DEV)
    with pytest.raises(ValueError, match="bytes"):
        comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    x = torch.ones(1024, device=DEV)
    comm.all_reduce(x, ReduceOp.SUM, async_op=False)
    torch.cuda.synchronize(DEV)
    assert torch.equal(x.cpu(), torch.full((1024,), float(WORLD)))


def test_wrong_device_is_a_clear_error(comm: Any) -> None:
    with pytest.raises(ValueError, match="device"):
        comm.all_reduce(torch.ones(4), ReduceOp.SUM, async_op=False)


def test_device_alltoallv_single_counts_on_the_device(comm: Any) -> None:
    """Split sizes in CUDA int64 tensors, read in stream order (upstream's NCCLX
    DeviceAllToAllvSingleTest cases: uniform, variable, 2-D rows); received counts written
    back; rows past what arrived keep their values. The vendor nccl backend has no form of it
    (NCCL has no device-count all_to_all) and says so."""
    if BACKEND != "ctran":
        with pytest.raises(NotImplementedError):
            comm.device_alltoallv_single(
                torch.zeros(WORLD, device=DEV),
                torch.zeros(WORLD, device=DEV),
                torch.ones(WORLD, dtype=torch.int64, device=DEV),
                torch.ones(WORLD, dtype=torch.int64, device=DEV),
                False,
            )
        return
    cols = 4
    send_rows = 3 + RANK * 5
    recv_rows = [3 + j * 5 for j in range(WORLD)]
    inp = torch.full((send_rows * WORLD, cols), float(RANK), device=DEV)
    out = torch.full((sum(recv_rows) + 7, cols), -1.0, device=DEV)
    # The counts are computed on the device by earlier work on the stream.
    send = torch.zeros(WORLD, dtype=torch.int64, device=DEV) + send_rows
    recv = torch.zeros(WORLD, dtype=torch.int64, device=DEV)
    comm.device_alltoallv_single(out, inp, recv, send, False)
    torch.cuda.synchronize(DEV)
    assert recv.cpu().tolist() == recv_rows
    at = 0
    for j, n in enumerate(recv_rows):
        assert torch.all(out[at : at + n] == j).item(), f"rows from {j}"
        at += n
    assert torch.all(out[at:] == -1.0).item()


@pytest.mark.parametrize("algo", [None, "pipelined", "direct"])
def test_large_broadcast_on_copy_engines(comm: Any, algo: str | None) -> None:
    """A large broadcast over NVLink: on two GPUs auto runs it on the root's copy engine
    (`CTRAN_NVL_PIPE_BCAST_MIN_BYTES`); asked for, pipelined runs it so on any number of
    ranks. Every root, twice in a row (the second finds the first's flags), equal to the
    direct kernel's result."""
    if BACKEND != "ctran" or not over_nvl() or WORLD < 2:
        pytest.skip("the copy-engine broadcast is ctran's NVLink transport (2+ ranks)")
    hints = None if algo is None else {"algo": algo}
    # Above the 128 MiB threshold (auto takes copy engines), not a multiple of a vector.
    n = (130 << 20) // 4 + 7
    for root in range(WORLD):
        for again in range(2):
            t = torch.full((n,), float(RANK), device=DEV)
            if RANK == root:
                t = torch.arange(n, dtype=torch.float32, device=DEV) + again
            comm.broadcast(t, root, async_op=False, hints=hints)
            torch.cuda.synchronize(DEV)
            want = torch.arange(n, dtype=torch.float32) + again
            assert torch.equal(t.cpu(), want), (root, again)
