"""MoE dispatch and combine on CUDA tensors (``MoeBuffer`` on a ``ctran`` CUDA communicator),
checked bit for bit against a reference every rank computes alone from every rank's routing
(each rank's inputs come from a seeded generator, so any rank can rebuild them). Runs with any
number of GPUs, ranks sharing them round robin::

    torchrun --nproc_per_node 2 -m pytest bindings/python/gpu_tests/test_moe_cuda.py \\
        -q -p no:cacheprovider

Both transports run: ``mapped`` (peers write into each other's buffers: GPUs over NVLink, or
ranks sharing a GPU) and ``staged`` (``CTRAN_BACKENDS=socket,shm``: records move through
``device_alltoallv_single`` over host transports).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL = int(os.environ.get("LOCAL_RANK", "0"))

import torchcomms  # noqa: E402
from conftest import new_comm_on  # noqa: E402
from torchcomms.moe import MoeBuffer  # noqa: E402

DEV = torch.device("cuda", LOCAL % torch.cuda.device_count())
torch.cuda.set_device(DEV)

HIDDEN = 128
TOP_K = 4
MAX_TOKENS = 24


@pytest.fixture(scope="module", params=["mapped", "staged"])
def moe(request: Any) -> Iterator[SimpleNamespace]:
    """A communicator (``moe.comm``) whose MoE buffers take transport ``moe.transport``."""
    backends = "socket,shm" if request.param == "staged" else None
    c = new_comm_on(backends, DEV, f"moe_{request.param}", timeout=timedelta(seconds=60))
    yield SimpleNamespace(comm=c, transport=request.param)
    torch.cuda.synchronize()
    c.finalize()


def routing(rank: int, seed: int, experts: int, kind: str) -> tuple[torch.Tensor, ...]:
    """Rank ``rank``'s tokens (on the CPU): x, topk_idx (distinct experts, some -1), weights."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    tokens = MAX_TOKENS - rank % 3
    if kind == "empty" and rank == 1:
        tokens = 0
    x = (torch.randn(tokens, HIDDEN, generator=g) * 4).to(torch.bfloat16)
    if kind == "one":
        idx = torch.full((tokens, TOP_K), -1, dtype=torch.int64)
        idx[:, 0] = 0
    else:
        idx = torch.rand(tokens, experts, generator=g).topk(TOP_K, dim=1).indices.to(torch.int64)
        idx[torch.rand(tokens, TOP_K, generator=g) < 0.15] = -1
    w = torch.rand(tokens, TOP_K, generator=g)
    if tokens:
        x[0] = 0  # a token of zeros: FP8 scale 1
    return x, idx, w


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.float()
    amax = xf.abs().amax(dim=1) if xf.numel() else torch.zeros(0)
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    return (xf / scale[:, None]).to(torch.float8_e4m3fn), scale


def expected_dispatch(seed: int, experts: int, kind: str, fp8: bool):
    """Per local expert of this rank: rows (grouped by source, then token), weights, scales."""
    local = experts // WORLD
    out = []
    for e in range(local):
        g = RANK * local + e
        rows, weights, scales = [], [], []
        for src in range(WORLD):
            x, idx, w = routing(src, seed, experts, kind)
            hit = idx == g
            pick = torch.nonzero(hit.any(dim=1)).flatten()
            slot = hit[pick].float().argmax(dim=1)
            q, s = quantize(x)
            rows.append(q.view(torch.uint8)[pick] if fp8 else x[pick])
            weights.append(w[pick, slot])
            scales.append(s[pick])
        out.append((torch.cat(rows), torch.cat(weights), torch.cat(scales)))
    return out


def expert_fn(global_expert: int, rows: torch.Tensor) -> torch.Tensor:
    return (rows.float() * (global_expert + 1) * 0.25).to(torch.bfloat16)


def expected_combine(x, idx, w, fp8: bool) -> torch.Tensor:
    xs = (quantize(x)[0].float() * quantize(x)[1][:, None]) if fp8 else x
    acc = torch.zeros(x.shape[0], HIDDEN)
    for k in range(TOP_K):
        for t in range(x.shape[0]):
            e = int(idx[t, k])
            if e >= 0:
                acc[t] += w[t, k] * expert_fn(e, xs[t : t + 1])[0].float()
    return acc.to(torch.bfloat16)


def run_experts(buf: MoeBuffer, recv_x, scales, counts: list[int], fp8: bool) -> torch.Tensor:
    """Every local expert's output, in the layout dispatch returned (on the device)."""
    local = buf.num_local_experts
    y = torch.zeros_like(recv_x, dtype=torch.bfloat16)
    at = 0
    for e in range(local):
        n = counts[e]
        g = RANK * local + e
        if buf.mode == "low_latency":
            rows = recv_x[e, :n].float() * scales[e, :n, None] if fp8 else recv_x[e, :n]
            y[e, :n] = expert_fn(g, rows)
        else:
            rows = recv_x[at : at + n].float() * scales[at : at + n, None] if fp8 else recv_x[at : at + n]
            y[at : at + n] = expert_fn(g, rows)
        at += n
    return y


@pytest.mark.parametrize("mode", ["high_throughput", "low_latency"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("kind", ["random", "one", "empty"])
def test_moe_cuda_matches_the_reference(moe: SimpleNamespace, mode: str, fp8: bool, kind: str) -> None:
    experts = 4 * WORLD
    local = experts // WORLD
    buf = MoeBuffer(moe.comm, experts, HIDDEN, MAX_TOKENS, TOP_K, mode=mode)
    assert buf.is_mapped == (moe.transport == "mapped")
    for seed in range(3):
        x, idx, w = routing(RANK, seed, experts, kind)
        recv_x, scales, weights, tpe, handle = buf.dispatch(x.to(DEV), idx.to(DEV), w.to(DEV), use_fp8=fp8)
        want = expected_dispatch(seed, experts, kind, fp8)
        counts = tpe.tolist()
        assert counts == [len(r) for r, _, _ in want]
        at = 0
        for e, (rows, ws, ss) in enumerate(want):
            n = counts[e]
            sl = (e, slice(0, n)) if mode == "low_latency" else (slice(at, at + n),)
            got = recv_x[sl]
            assert torch.equal((got.view(torch.uint8) if fp8 else got).cpu(), rows), f"expert {e} rows"
            assert torch.equal(weights[sl].cpu(), ws), f"expert {e} weights"
            if fp8:
                assert torch.equal(scales[sl].cpu(), ss), f"expert {e} scales"
            at += n
        y = run_experts(buf, recv_x, scales, counts, fp8)
        out = buf.combine(y, handle)
        torch.cuda.synchronize()
        buf.check()
        assert torch.equal(out.cpu(), expected_combine(x, idx, w, fp8)), f"combine (seed {seed})"


def test_moe_cuda_packed_combine_takes_the_rows_that_arrived(moe: SimpleNamespace) -> None:
    """high_throughput: expert_out may hold just the rows that arrived (their count is on the
    device), as a user slicing recv_x by tokens_per_expert passes it."""
    experts = 2 * WORLD
    k = min(TOP_K, experts)
    buf = MoeBuffer(moe.comm, experts, HIDDEN, MAX_TOKENS, k)
    x, idx, w = routing(RANK, 7, experts, "one")
    idx, w = idx[:, :k].contiguous(), w[:, :k].contiguous()
    recv_x, _, _, tpe, handle = buf.dispatch(x.to(DEV), idx.to(DEV), w.to(DEV))
    n = int(tpe.sum())
    out = buf.combine(recv_x[:n].clone(), handle)
    torch.cuda.synchronize()
    buf.check()
    want = torch.zeros(x.shape[0], HIDDEN)
    for t in range(x.shape[0]):
        want[t] = w[t, 0] * x[t].float()
    assert torch.equal(out.cpu(), want.to(torch.bfloat16))


def test_moe_cuda_bad_expert_id_is_reported_and_dropped(moe: SimpleNamespace) -> None:
    """The bad slot is dropped and reported by check(), not by the next call (combine): the
    exchange completed on every rank, and refusing one rank's combine would leave the others
    waiting for it. On GPUs of their own the kernels have run by the time combine is called."""
    experts = 2 * WORLD
    k = min(TOP_K, experts)
    buf = MoeBuffer(moe.comm, experts, HIDDEN, MAX_TOKENS, k)
    x = torch.ones(2, HIDDEN, dtype=torch.bfloat16, device=DEV)
    w = torch.ones(2, k, device=DEV)
    idx = torch.full((2, k), -1, dtype=torch.int64, device=DEV)
    idx[:, 0] = 0
    if RANK == 0:
        idx[1, 0] = experts  # out of range: dropped, reported
    recv_x, _, _, tpe, handle = buf.dispatch(x, idx, w)
    torch.cuda.synchronize()
    out = buf.combine(recv_x.clone(), handle)
    torch.cuda.synchronize()
    if RANK == 0:
        with pytest.raises(ValueError, match=r"topk_idx\[1, 0\]"):
            buf.check()
        assert torch.equal(out[1].cpu(), torch.zeros(HIDDEN, dtype=torch.bfloat16))
    else:
        buf.check()
    # Host-side checks name the argument.
    with pytest.raises(ValueError, match="max_tokens_per_rank"):
        buf.dispatch(torch.zeros(MAX_TOKENS + 1, HIDDEN, dtype=torch.bfloat16, device=DEV),
                     torch.full((MAX_TOKENS + 1, k), -1, dtype=torch.int64, device=DEV),
                     torch.ones(MAX_TOKENS + 1, k, device=DEV))
    with pytest.raises(ValueError, match="dtype"):
        buf.dispatch(x.float(), idx, w)
    with pytest.raises(ValueError, match="hidden"):
        buf.dispatch(torch.zeros(2, HIDDEN + 8, dtype=torch.bfloat16, device=DEV), idx, w)
    with pytest.raises(ValueError, match="cuda"):
        buf.dispatch(x.cpu(), idx, w)
    with pytest.raises(ValueError, match="multiple of 8"):
        MoeBuffer(moe.comm, experts, HIDDEN + 4, MAX_TOKENS, k)
    with pytest.raises(ValueError, match="top_k"):
        MoeBuffer(moe.comm, 257 * WORLD, HIDDEN, MAX_TOKENS, 257)
    # Still usable afterwards.
    none = torch.full((2, k), -1, dtype=torch.int64, device=DEV)
    recv_x, _, _, tpe, handle = buf.dispatch(x, none, w)
    out = buf.combine(recv_x.clone(), handle)
    torch.cuda.synchronize()
    buf.check()
    assert int(tpe.sum()) == 0
    assert torch.equal(out.cpu(), torch.zeros(2, HIDDEN, dtype=torch.bfloat16))


def test_moe_cuda_graph_capture_and_replay(moe: SimpleNamespace) -> None:
    if moe.transport != "mapped":
        pytest.skip("staged exchanges go through the host (the GPU progress engine refuses capture)")
    experts = 4 * WORLD
    buf = MoeBuffer(moe.comm, experts, HIDDEN, MAX_TOKENS, TOP_K, mode="low_latency")
    x, idx, w = routing(RANK, 11, experts, "random")
    sx, sidx, sw = x.to(DEV), idx.to(DEV), w.to(DEV)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        # Warm up outside the graph (kernels loaded), then capture one dispatch and combine.
        recv_x, _, _, tpe, handle = buf.dispatch(sx, sidx, sw)
        out = buf.combine(recv_x.clone(), handle)
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            recv_x, _, _, tpe, handle = buf.dispatch(sx, sidx, sw)
            y = (recv_x.float() * 0.5).to(torch.bfloat16)
            out = buf.combine(y, handle)
    torch.cuda.synchronize()
    for seed in (11, 12, 13):
        x, idx, w = routing(RANK, seed, experts, "random")
        sx.copy_(x.to(DEV))
        sidx.copy_(idx.to(DEV))
        sw.copy_(w.to(DEV))
        graph.replay()
        torch.cuda.synchronize()
        buf.check()
        acc = torch.zeros(x.shape[0], HIDDEN)
        for k in range(TOP_K):
            for t in range(x.shape[0]):
                if int(idx[t, k]) >= 0:
                    acc[t] += w[t, k] * (x[t].float() * 0.5).to(torch.bfloat16).float()
        assert torch.equal(out.cpu(), acc.to(torch.bfloat16)), f"replay with seed {seed}"
        want = expected_dispatch(seed, experts, "random", False)
        assert tpe.tolist() == [len(r) for r, _, _ in want]


def test_moe_cuda_abort_ends_a_waiting_dispatch(moe: SimpleNamespace) -> None:
    """Rank 0 dispatches and rank 1 never does: rank 0's kernels wait for it. abort() ends the
    wait at once (not at the two-minute timeout), and the buffer reports it. Rank 0's dispatch
    also carries a bad expert id: that input error and the abort are both reported (they take
    different slots of the error words), the input error first."""
    if moe.transport != "mapped":
        pytest.skip("the staged transport's waits are the GPU progress engine's")
    c = torchcomms.new_comm(
        "ctran", DEV, "moe_abort", timeout=timedelta(seconds=120),
        abort_process_on_timeout_or_error=False,
    )
    buf = MoeBuffer(c, 2 * WORLD, HIDDEN, MAX_TOKENS, 2)
    if RANK == 0:
        x = torch.ones(4, HIDDEN, dtype=torch.bfloat16, device=DEV)
        idx = torch.zeros(4, 2, dtype=torch.int64, device=DEV)
        idx[:, 1] = 1
        idx[3, 0] = 2 * WORLD  # out of range
        buf.dispatch(x, idx, torch.ones(4, 2, device=DEV))
        time.sleep(1.0)
        start = time.monotonic()
        c.abort()
        torch.cuda.synchronize()
        assert time.monotonic() - start < 30, "the kernels waited past the abort"
        with pytest.raises(ValueError, match=r"topk_idx\[3, 0\]"):
            buf.check()
        with pytest.raises(Exception, match="abort"):
            buf.check()
    else:
        time.sleep(2.0)
        c.abort()
    del buf
