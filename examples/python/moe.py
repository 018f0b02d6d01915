"""A mixture-of-experts layer over torchcomms: each rank holds ``experts // world`` experts
(small linear layers), routes its tokens to their top-k experts with ``MoeBuffer.dispatch``, runs
its local experts on what arrived, and gathers each token's weighted sum with ``combine``.
Checked against the same layer computed densely on one rank (every expert's weights are
derived from a seed, so any rank can compute any expert).

    torchrun --nproc_per_node 4 examples/python/moe.py            # CPU tensors
    torchrun --nproc_per_node 4 examples/python/moe.py --cuda     # CUDA: kernels on the stream

On CUDA the counts stay on the device: ``tokens_per_expert`` is read back here only to slice
each expert's rows (a real model would use a grouped GEMM over ``recv_x`` instead).
"""

from __future__ import annotations

import os
import sys

import torch

import torchcomms
from torchcomms.moe import MoeBuffer

HIDDEN, EXPERTS, TOP_K, TOKENS = 64, 16, 4, 32


def expert_weight(e: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + e)
    return (torch.randn(HIDDEN, HIDDEN, generator=g) / HIDDEN**0.5).to(torch.bfloat16)


def main() -> None:
    if "--cuda" in sys.argv:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    comm = torchcomms.new_comm("ctran", dev, name="moe_example")
    rank, world = comm.get_rank(), comm.get_size()
    local = EXPERTS // world
    weights = [expert_weight(rank * local + e).to(dev) for e in range(local)]
    buf = MoeBuffer(comm, EXPERTS, HIDDEN, TOKENS, TOP_K)

    g = torch.Generator().manual_seed(rank)
    x = torch.randn(TOKENS, HIDDEN, generator=g).to(torch.bfloat16)
    gate = torch.randn(TOKENS, EXPERTS, generator=g).softmax(dim=1)
    topk_w, topk_idx = gate.topk(TOP_K, dim=1)

    recv_x, _, _, tokens_per_expert, handle = buf.dispatch(x.to(dev), topk_idx.to(dev), topk_w.to(dev))
    outs, at = [], 0
    for e, n in enumerate(tokens_per_expert.tolist()):
        outs.append(recv_x[at : at + n] @ weights[e])  # this rank's expert e on its tokens
        at += n
    y = torch.cat(outs) if outs else torch.zeros(0, HIDDEN, dtype=torch.bfloat16, device=dev)
    out = buf.combine(y, handle).cpu()

    # The same layer, densely, on this rank alone.
    want = torch.zeros(TOKENS, HIDDEN)
    for k in range(TOP_K):
        for t in range(TOKENS):
            e = int(topk_idx[t, k])
            want[t] += topk_w[t, k] * (x[t : t + 1] @ expert_weight(e))[0].float()
    err = (out.float() - want).abs().max().item()
    assert err < 0.05, f"rank {rank}: MoE layer differs from the dense one by {err}"
    print(
        f"rank {rank}: {int(tokens_per_expert.sum())} rows for experts "
        f"{rank * local}..{rank * local + local - 1}; layer matches the dense one (max diff {err:.4f})"
    )
    comm.finalize()


if __name__ == "__main__":
    main()
