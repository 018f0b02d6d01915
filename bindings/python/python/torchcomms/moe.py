"""Mixture-of-experts dispatch and combine over a torchcomms communicator.

``MoeBuffer`` holds the buffers of an expert-parallel exchange, allocated once (in the spirit of
DeepEP's ``Buffer`` and pplx-garden's ``AllToAll``). A communicator of ``size`` ranks holds
``num_experts`` experts, ``num_experts // size`` per rank: rank ``r`` holds experts
``r * local`` to ``(r + 1) * local - 1``.

.. code-block:: python

    buf = MoeBuffer(comm, num_experts=16, hidden=1024, max_tokens_per_rank=128, top_k=4)
    recv_x, recv_scales, recv_weights, tokens_per_expert, handle = buf.dispatch(
        x, topk_idx, topk_weights)                    # x: [tokens, hidden] bfloat16
    y = run_experts(recv_x, tokens_per_expert)        # one bfloat16 row per received row
    out = buf.combine(y, handle)                      # [tokens, hidden] bfloat16

``dispatch`` sends each token once to every rank holding one of its ``top_k`` experts
(``topk_idx`` int64, -1 for an unused slot) and returns the rows each local expert received,
grouped by expert, then by source rank, then by token, each with its slot's weight. With
``use_fp8=True`` the rows travel as ``float8_e4m3fn`` with one float32 scale per token
(``recv_x * recv_scales[:, None]`` restores them). ``combine`` returns, per token,
``sum_k topk_weights[t, k] * y[t, k]``, accumulated in float32 in slot order and rounded to
bfloat16.

Layouts (``mode``): ``"high_throughput"`` packs the rows, ``recv_x`` is ``[rows, hidden]``;
``"low_latency"`` gives each local expert a slab of ``size * max_tokens_per_rank`` rows,
``recv_x`` is ``[local, slab, hidden]`` and only the first ``tokens_per_expert[e]`` rows of slab
``e`` hold tokens. ``combine`` takes ``y`` in the same layout.

The returned ``recv_*`` tensors are views of the buffers: valid until the next ``dispatch``.
Every rank calls ``dispatch`` and ``combine`` in the same order, as with any collective.

On a CPU communicator the buffer packs on the host. On a CUDA communicator (``ctran``) every
step is a kernel on the current stream and nothing waits for the device:

- ``tokens_per_expert`` is a CUDA tensor, and in ``"high_throughput"`` mode ``recv_x`` holds
  room for every row that may arrive (its first ``tokens_per_expert.sum()`` rows are used);
  ``combine`` takes at least the rows that arrived.
- Peers that map each other's memory (GPUs of one host over NVLink, or ranks sharing a GPU)
  write straight into each other's buffers (``is_mapped``): capturable in CUDA graphs. Across
  hosts the records move through ``device_alltoallv_single``.
- Only the latest dispatch can be combined (its routing stays in the buffer).
- An error the kernels find (an expert id out of range, a peer that never answers) is raised
  by ``check()`` after a stream synchronize; one that broke the exchange (a timeout, an abort)
  also by the next call.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from torchcomms._comms import _MoeBuffer, _MoeHandle

__all__ = ["MoeBuffer", "MoeHandle"]

MoeHandle = _MoeHandle

_DTYPES = {
    "uint8": torch.uint8,
    "int64": torch.int64,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}


class MoeBuffer:
    """Buffers and calls of expert-parallel dispatch and combine on ``comm``."""

    def __init__(
        self,
        comm: Any,
        num_experts: int,
        hidden: int,
        max_tokens_per_rank: int,
        top_k: int,
        mode: str = "high_throughput",
    ) -> None:
        self.comm = comm
        self.num_experts = num_experts
        self.hidden = hidden
        self.max_tokens_per_rank = max_tokens_per_rank
        self.top_k = top_k
        self.mode = mode
        size = comm.get_size()
        device = comm.get_device()
        self.num_local_experts = num_experts // size
        self.slab_rows = size * max_tokens_per_rank
        specs = _MoeBuffer.buffer_specs(num_experts, hidden, max_tokens_per_rank, top_k, mode, size)
        self._cuda = device.type == "cuda"
        if self._cuda:
            # The kernels keep their own scratch; only what dispatch returns is allocated here.
            names = ["recv_x", "recv_x_fp8", "recv_scales", "recv_weights"]
            specs = [s for s in specs if s[0] in names]
            specs.append(("tokens_per_expert", "int64", self.num_local_experts))
        self._buffers = {
            name: torch.zeros(numel, dtype=_DTYPES[dtype], device=device)
            for name, dtype, numel in specs
        }
        self._impl = _MoeBuffer(
            comm,
            num_experts,
            hidden,
            max_tokens_per_rank,
            top_k,
            mode,
            [self._buffers[name] for name, _, _ in specs],
        )
        self._recv_rows = specs[0][2] // hidden if self._cuda else 0
        self._views: dict = {}

    @property
    def is_mapped(self) -> bool:
        """CUDA: peers write into each other's buffers directly (capturable in CUDA graphs)."""
        return bool(self._impl.is_mapped)

    def check(self) -> None:
        """Raises the first error the kernels reported (synchronize the stream first)."""
        self._impl.check()

    def _rows(self, t: torch.Tensor, rows: int, width: int) -> torch.Tensor:
        if self.mode == "low_latency":
            return t[: self.num_local_experts * self.slab_rows * width].view(
                self.num_local_experts, self.slab_rows, *((width,) if width > 1 else ())
            )
        return t[: rows * width].view(rows, *((width,) if width > 1 else ()))

    def dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        use_fp8: bool = False,
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor, torch.Tensor, MoeHandle]:
        """Sends each token to the ranks of its experts. Returns ``(recv_x, recv_scales,
        recv_weights, tokens_per_expert, handle)``; ``recv_scales`` is None without FP8."""
        counts, handle = self._impl.dispatch(x, topk_idx, topk_weights, use_fp8)
        if counts is None:
            # CUDA: the counts stay on the device, so the returned views are always the same.
            views = self._views.get(use_fp8)
            if views is None:
                views = self._views[use_fp8] = self._returns(self._recv_rows, use_fp8)
            return (*views, handle)
        recv_x, scales, weights = self._returns(sum(counts), use_fp8)
        return recv_x, scales, weights, torch.tensor(counts, dtype=torch.int64), handle

    def _returns(self, rows: int, use_fp8: bool) -> Tuple[Any, ...]:
        """The received rows, scales and weights (and, on CUDA, tokens_per_expert) as views."""
        h = self.hidden
        if use_fp8:
            recv_x = self._rows(self._buffers["recv_x_fp8"], rows, h).view(torch.float8_e4m3fn)
            scales: Optional[torch.Tensor] = self._rows(self._buffers["recv_scales"], rows, 1)
        else:
            recv_x = self._rows(self._buffers["recv_x"], rows, h)
            scales = None
        weights = self._rows(self._buffers["recv_weights"], rows, 1)
        if self._cuda:
            return recv_x, scales, weights, self._buffers["tokens_per_expert"]
        return recv_x, scales, weights

    def combine(
        self, expert_out: torch.Tensor, handle: MoeHandle, out: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Each dispatched token's weighted sum of its experts' rows in ``expert_out`` (the
        layout ``dispatch`` returned); into ``out`` when given."""
        if out is None:
            out = torch.empty(
                handle.num_tokens, self.hidden, dtype=torch.bfloat16, device=expert_out.device
            )
        self._impl.combine(expert_out, handle, out)
        return out
