"""device_alltoallv_single (upstream's DeviceAllToAllvSingleTest cases) and MoE dispatch and
combine, checked bit for bit against a reference built from all_to_all_single,
all_to_all_v_single and indexing."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from conftest import RANK, WORLD, dtype_id
from torchcomms.moe import MoeBuffer

DTYPES = [torch.float32, torch.bfloat16, torch.int32, torch.int64]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("chunk", [0, 1, 1000])
def test_device_alltoallv_uniform(world: Any, dtype: torch.dtype, chunk: int) -> None:
    inp = torch.full((chunk * WORLD,), RANK, dtype=dtype)
    out = torch.zeros(chunk * WORLD, dtype=dtype)
    send = torch.full((WORLD,), chunk, dtype=torch.int64)
    recv = torch.zeros(WORLD, dtype=torch.int64)
    world.get_backend_impl().device_alltoallv_single(out, inp, recv, send, False)
    assert recv.tolist() == [chunk] * WORLD
    for j in range(WORLD):
        assert torch.all(out[j * chunk : (j + 1) * chunk] == j)


@pytest.mark.parametrize("async_op", [False, True])
def test_device_alltoallv_variable_and_multidim(world: Any, async_op: bool) -> None:
    cols = 16
    # Rank i sends 3 + i * 5 rows to every rank; the output has room to spare.
    send_rows = 3 + RANK * 5
    recv_rows = [3 + j * 5 for j in range(WORLD)]
    inp = torch.full((send_rows * WORLD, cols), RANK, dtype=torch.float32)
    out = torch.full((sum(recv_rows) + 7, cols), -1.0)
    send = torch.full((WORLD,), send_rows, dtype=torch.int64)
    recv = torch.zeros(WORLD, dtype=torch.int64)
    work = world.device_alltoallv_single(out, inp, recv, send, async_op)
    if async_op:
        work.wait()
    assert recv.tolist() == recv_rows
    at = 0
    for j, n in enumerate(recv_rows):
        assert torch.all(out[at : at + n] == j)
        at += n
    assert torch.all(out[at:] == -1.0), "rows past the received ones must keep their values"


def test_device_alltoallv_counts_read_when_it_runs(world: Any) -> None:
    """Counts that an earlier asynchronous collective writes are the ones used: at issue the
    send counts are still zeros."""
    inp = torch.arange(2 * WORLD, dtype=torch.float32) + 100 * RANK
    send = torch.zeros(WORLD, dtype=torch.int64)
    w1 = world.all_to_all_single(send, torch.full((WORLD,), 2, dtype=torch.int64), True)
    out = torch.zeros(2 * WORLD)
    recv = torch.zeros(WORLD, dtype=torch.int64)
    w2 = world.device_alltoallv_single(out, inp, recv, send, True)
    w1.wait()
    w2.wait()
    assert recv.tolist() == [2] * WORLD
    want = torch.cat([torch.arange(2 * RANK, 2 * RANK + 2) + 100 * j for j in range(WORLD)])
    assert torch.equal(out, want.float())


def test_device_alltoallv_bad_arguments(world: Any) -> None:
    t = torch.zeros(WORLD * 2)
    good = torch.full((WORLD,), 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="input_split_sizes"):
        world.device_alltoallv_single(t, t.clone(), good, good.to(torch.int32), False)
    with pytest.raises(ValueError, match="output_split_sizes"):
        world.device_alltoallv_single(t, t.clone(), torch.zeros(WORLD + 1, dtype=torch.int64), good, False)


# ---------------------------------------------------------------------------------------- MoE

HIDDEN = 64
TOP_K = 4
MAX_TOKENS = 12


def routing(rank: int, seed: int, experts: int, kind: str) -> tuple[torch.Tensor, ...]:
    """Rank ``rank``'s tokens: x, topk_idx (distinct experts, some -1), topk_weights."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    tokens = 0 if (kind == "random" and rank == 1 and seed == 2) else MAX_TOKENS - rank % 3
    x = (torch.randn(tokens, HIDDEN, generator=g) * 4).to(torch.bfloat16)
    if kind == "one":
        idx = torch.full((tokens, TOP_K), -1, dtype=torch.int64)
        idx[:, 0] = 0
    else:
        scores = torch.rand(tokens, experts, generator=g)
        idx = scores.topk(TOP_K, dim=1).indices.to(torch.int64)
        drop = torch.rand(tokens, TOP_K, generator=g) < 0.15
        idx[drop] = -1
    w = torch.rand(tokens, TOP_K, generator=g)
    return x, idx, w


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.float()
    amax = xf.abs().amax(dim=1) if xf.numel() else torch.zeros(0)
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    return (xf / scale[:, None]).to(torch.float8_e4m3fn), scale


def exchange(comm: Any, rows: torch.Tensor, splits: list[int]) -> tuple[torch.Tensor, list[int]]:
    """all_to_all_v_single of ``rows`` (split by ``splits``), counts by all_to_all_single."""
    send = torch.tensor(splits, dtype=torch.int64)
    recv = torch.zeros(WORLD, dtype=torch.int64)
    comm.all_to_all_single(recv, send, False)
    got = recv.tolist()
    out = torch.empty((sum(got),) + tuple(rows.shape[1:]), dtype=rows.dtype)
    comm.all_to_all_v_single(out, rows.contiguous(), got, splits, False)
    return out, got


def reference_dispatch(comm: Any, x, idx, w, experts: int, fp8: bool):
    local = experts // WORLD
    dest = torch.where(idx >= 0, idx // local, torch.full_like(idx, -1))
    order = [torch.nonzero((dest == r).any(dim=1)).flatten() for r in range(WORLD)]
    sel = torch.cat(order)
    splits = [len(o) for o in order]
    payload = quantize(x)[0].view(torch.uint8) if fp8 else x
    rx, came = exchange(comm, payload[sel], splits)
    ridx, _ = exchange(comm, idx[sel], splits)
    rw, _ = exchange(comm, w[sel], splits)
    rs, _ = exchange(comm, quantize(x)[1][sel], splits) if fp8 else (None, None)
    rows, weights, scales, counts = [], [], [], []
    for e in range(local):
        g = RANK * local + e
        hit = ridx == g
        pick = torch.nonzero(hit.any(dim=1)).flatten()
        slot = hit[pick].float().argmax(dim=1)
        rows.append(rx[pick])
        weights.append(rw[pick, slot])
        if fp8:
            scales.append(rs[pick])
        counts.append(len(pick))
    return rows, weights, scales, counts


def expert_fn(global_expert: int, rows: torch.Tensor) -> torch.Tensor:
    return (rows.float() * (global_expert + 1) * 0.25).to(torch.bfloat16)


@pytest.mark.parametrize("mode", ["high_throughput", "low_latency"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("kind", ["random", "one"])
def test_moe_dispatch_combine_match_the_reference(world: Any, mode: str, fp8: bool, kind: str) -> None:
    experts = 4 * WORLD
    local = experts // WORLD
    buf = MoeBuffer(world, experts, HIDDEN, MAX_TOKENS, TOP_K, mode=mode)
    assert not buf.is_mapped, "a cpu buffer packs on the host"
    for seed in range(3):
        x, idx, w = routing(RANK, seed, experts, kind)
        recv_x, scales, weights, tpe, handle = buf.dispatch(x, idx, w, use_fp8=fp8)
        ref_rows, ref_w, ref_s, ref_counts = reference_dispatch(world, x, idx, w, experts, fp8)
        assert tpe.tolist() == ref_counts
        ys = []
        at = 0
        for e in range(local):
            n = ref_counts[e]
            if mode == "low_latency":
                got_x, got_w = recv_x[e, :n], weights[e, :n]
                got_s = scales[e, :n] if fp8 else None
            else:
                got_x, got_w = recv_x[at : at + n], weights[at : at + n]
                got_s = scales[at : at + n] if fp8 else None
            at += n
            raw = got_x.view(torch.uint8) if fp8 else got_x
            assert torch.equal(raw, ref_rows[e]), f"expert {e} rows differ"
            assert torch.equal(got_w, ref_w[e])
            rows = got_x.float() * got_s[:, None] if fp8 else got_x
            if fp8:
                assert torch.equal(got_s, ref_s[e])
            ys.append(expert_fn(RANK * local + e, rows))
        if mode == "low_latency":
            y = torch.zeros(local, buf.slab_rows, HIDDEN, dtype=torch.bfloat16)
            for e in range(local):
                y[e, : ref_counts[e]] = ys[e]
        else:
            y = torch.cat(ys) if ys else torch.zeros(0, HIDDEN, dtype=torch.bfloat16)
        out = buf.combine(y, handle)
        # The reference: each slot's expert output, summed in f32 in slot order.
        xs = (quantize(x)[0].float() * quantize(x)[1][:, None]) if fp8 else x
        acc = torch.zeros(x.shape[0], HIDDEN)
        for k in range(TOP_K):
            for t in range(x.shape[0]):
                e = int(idx[t, k])
                if e >= 0:
                    acc[t] += w[t, k] * expert_fn(e, xs[t : t + 1])[0].float()
        assert torch.equal(out, acc.to(torch.bfloat16)), f"combine differs (seed {seed})"
        buf.check()  # nothing to report on the host path


def test_moe_bad_input(world: Any) -> None:
    experts = 2 * WORLD
    buf = MoeBuffer(world, experts, HIDDEN, MAX_TOKENS, TOP_K if TOP_K <= experts else experts)
    k = buf.top_k
    x = torch.zeros(2, HIDDEN, dtype=torch.bfloat16)
    w = torch.ones(2, k)
    idx = torch.zeros(2, k, dtype=torch.int64) - 1
    idx[0, 0] = experts  # out of range
    with pytest.raises(ValueError, match=r"topk_idx\[0, 0\]"):
        buf.dispatch(x, idx, w)
    with pytest.raises(ValueError, match="max_tokens_per_rank"):
        buf.dispatch(torch.zeros(MAX_TOKENS + 1, HIDDEN, dtype=torch.bfloat16),
                     torch.full((MAX_TOKENS + 1, k), -1, dtype=torch.int64), torch.ones(MAX_TOKENS + 1, k))
    with pytest.raises(ValueError, match="dtype bf16"):
        buf.dispatch(x.float(), torch.full((2, k), -1, dtype=torch.int64), w)
    with pytest.raises(ValueError, match="hidden"):
        buf.dispatch(torch.zeros(2, HIDDEN + 1, dtype=torch.bfloat16), torch.full((2, k), -1, dtype=torch.int64), w)
    with pytest.raises(ValueError, match="num_experts"):
        MoeBuffer(world, WORLD + 1 if WORLD > 1 else 0, HIDDEN, MAX_TOKENS, 1)
    with pytest.raises(ValueError, match="mode"):
        MoeBuffer(world, experts, HIDDEN, MAX_TOKENS, 1, mode="fast")
    # Still usable: an exchange with nothing routed.
    none = torch.full((2, k), -1, dtype=torch.int64)
    _, _, _, tpe, handle = buf.dispatch(x, none, w)
    assert int(tpe.sum()) == 0
    out = buf.combine(torch.zeros(0, HIDDEN, dtype=torch.bfloat16), handle)
    assert torch.equal(out, torch.zeros(2, HIDDEN, dtype=torch.bfloat16))
