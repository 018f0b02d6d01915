"""The collectives and point-to-point calls of ``torchcomms.distwrap``: torch.distributed's
signatures, run on the group's TorchComm (the tensor's device type picks it; global ranks
become group ranks) in torchcomms mode, else passed through to torch.distributed."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup, ReduceOp, get_process_group_ranks

from torchcomms._c10d import _reduce_op
from torchcomms.distwrap.mode import torchcomms_is_enabled
from torchcomms.distwrap.pginfo import pg_info_assert_registered, pg_info_get_data

def _pg(group: Optional[ProcessGroup]) -> ProcessGroup:
    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise AssertionError("Process group is not initialized")
    pg_info_assert_registered(pg)
    return pg


def _comm(pg: ProcessGroup, tensor: Optional[torch.Tensor] = None) -> Any:
    comms = pg_info_get_data(pg, "torchcomms")
    if not comms:
        raise AssertionError(f"No torchcomms instances found for process group {pg}")
    if tensor is None:
        return comms.get("cpu") or next(iter(comms.values()))
    comm = comms.get(tensor.device.type)
    if comm is None:
        raise ValueError(
            f"no communicator for {tensor.device.type} tensors in this group (it has "
            f"{', '.join(comms)})"
        )
    return comm


def _group_rank(pg: ProcessGroup, rank: Optional[int], group_rank: Optional[int], what: str) -> int:
    if group_rank is None:
        if rank is None:
            raise ValueError(f"Either {what} or group_{what} must be specified")
        return dist.get_group_rank(pg, rank)
    if rank is not None:
        raise ValueError(f"Cannot specify both {what} and group_{what}")
    return group_rank


def _ret(work: Any, async_op: bool) -> Any:
    return work if async_op else None


def _make_nccl_premul_sum(mul_factor: Any) -> ReduceOp:
    return dist._make_nccl_premul_sum(mul_factor)


def all_reduce(
    tensor: torch.Tensor,
    op: Any = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        comm = _comm(pg, tensor)
        return _ret(
            comm.all_reduce(tensor, _reduce_op(op, comm.get_rank(), "all_reduce"), async_op),
            async_op,
        )
    return dist.all_reduce(tensor, op, pg, async_op)


def broadcast(
    tensor: torch.Tensor,
    src: Optional[int] = None,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    group_src: Optional[int] = None,
) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        root = _group_rank(pg, src, group_src, "src")
        return _ret(_comm(pg, tensor).broadcast(tensor, root, async_op), async_op)
    return dist.broadcast(tensor, src, pg, async_op, group_src=group_src)


def reduce(
    tensor: torch.Tensor,
    dst: Optional[int] = None,
    op: Any = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    group_dst: Optional[int] = None,
) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        root = _group_rank(pg, dst, group_dst, "dst")
        comm = _comm(pg, tensor)
        return _ret(
            comm.reduce(tensor, root, _reduce_op(op, comm.get_rank(), "reduce"), async_op), async_op
        )
    return dist.reduce(tensor, dst, op, pg, async_op, group_dst=group_dst)


def all_gather(
    tensor_list: list[torch.Tensor],
    tensor: torch.Tensor,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        comm = _comm(pg, tensor)
        equal = all(t.numel() == tensor.numel() for t in tensor_list)
        gather = comm.all_gather if equal else comm.all_gather_v
        return _ret(gather(tensor_list, tensor, async_op), async_op)
    return dist.all_gather(tensor_list, tensor, pg, async_op)


def all_gather_into_tensor(
    output_tensor: torch.Tensor,
    input_tensor: torch.Tensor,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        return _ret(
            _comm(pg, input_tensor).all_gather_single(output_tensor, input_tensor, async_op),
            async_op,
        )
    return dist.all_gather_into_tensor(output_tensor, input_tensor, pg, async_op)


def reduce_scatter(
    output: torch.Tensor,
    input_list: list[torch.Tensor],
    op: Any = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        comm = _comm(pg, output)
        equal = all(t.numel() == output.numel() for t in input_list)
        rs = comm.reduce_scatter if equal else comm.reduce_scatter_v
        return _ret(
            rs(output, input_list, _reduce_op(op, comm.get_rank(), "reduce_scatter"), async_op),
            async_op,
        )
    return dist.reduce_scatter(output, input_list, op, pg, async_op)


def reduce_scatter_tensor(
    output: torch.Tensor,
    input: torch.Tensor,
    op: Any = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        comm = _comm(pg, input)
        return _ret(
            comm.reduce_scatter_single(
                output, input, _reduce_op(op, comm.get_rank(), "reduce_scatter_tensor"), async_op
            ),
            async_op,
        )
    return dist.reduce_scatter_tensor(output, input, op, pg, async_op)


def all_to_all(
    output_tensor_list: list[torch.Tensor],
    input_tensor_list: list[torch.Tensor],
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        return _ret(
            _comm(pg, input_tensor_list[0]).all_to_all(
                output_tensor_list, input_tensor_list, async_op
            ),
            async_op,
        )
    return dist.all_to_all(output_tensor_list, input_tensor_list, pg, async_op)


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Optional[list[int]] = None,
    input_split_sizes: Optional[list[int]] = None,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        comm = _comm(pg, input)
        if output_split_sizes is None and input_split_sizes is None:
            return _ret(comm.all_to_all_single(output, input, async_op), async_op)
        n = comm.get_size()
        osp = output_split_sizes or [output.size(0) // n] * n
        isp = input_split_sizes or [input.size(0) // n] * n
        return _ret(comm.all_to_all_v_single(output, input, osp, isp, async_op), async_op)
    return dist.all_to_all_single(
        output, input, output_split_sizes, input_split_sizes, pg, async_op
    )


def scatter(
    tensor: torch.Tensor,
    scatter_list: Optional[list[torch.Tensor]] = None,
    src: Optional[int] = None,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    group_src: Optional[int] = None,
) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        root = _group_rank(pg, src, group_src, "src")
        return _ret(
            _comm(pg, tensor).scatter(tensor, list(scatter_list or []), root, async_op), async_op
        )
    return dist.scatter(tensor, scatter_list, src, pg, async_op, group_src=group_src)


def gather(
    tensor: torch.Tensor,
    gather_list: Optional[list[torch.Tensor]] = None,
    dst: Optional[int] = None,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    group_dst: Optional[int] = None,
) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        root = _group_rank(pg, dst, group_dst, "dst")
        return _ret(
            _comm(pg, tensor).gather(list(gather_list or []), tensor, root, async_op), async_op
        )
    return dist.gather(tensor, gather_list, dst, pg, async_op, group_dst=group_dst)


def barrier(
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    device_ids: Optional[list[int]] = None,
) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        return _ret(_comm(pg).barrier(async_op), async_op)
    return dist.barrier(pg, async_op, device_ids)


def send(
    tensor: torch.Tensor,
    dst: Optional[int] = None,
    group: Optional[ProcessGroup] = None,
    tag: int = 0,
    group_dst: Optional[int] = None,
) -> None:
    pg = _pg(group)
    if torchcomms_is_enabled():
        _comm(pg, tensor).send(tensor, _group_rank(pg, dst, group_dst, "dst"), False)
        return
    dist.send(tensor, dst=dst, group=pg, tag=tag, group_dst=group_dst)


def recv(
    tensor: torch.Tensor,
    src: Optional[int] = None,
    group: Optional[ProcessGroup] = None,
    tag: int = 0,
    group_src: Optional[int] = None,
) -> int:
    """Receives from ``src`` (no wildcard with torchcomms); returns the sender's global rank."""
    pg = _pg(group)
    if torchcomms_is_enabled():
        if src is None and group_src is None:
            raise ValueError("torchcomms does not support wildcard recv (src=None)")
        peer = _group_rank(pg, src, group_src, "src")
        _comm(pg, tensor).recv(tensor, peer, False)
        return src if src is not None else get_process_group_ranks(pg)[peer]
    return dist.recv(tensor, src=src, group=pg, tag=tag, group_src=group_src)


def isend(
    tensor: torch.Tensor,
    dst: Optional[int] = None,
    group: Optional[ProcessGroup] = None,
    tag: int = 0,
    group_dst: Optional[int] = None,
) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        return _comm(pg, tensor).send(tensor, _group_rank(pg, dst, group_dst, "dst"), True)
    return dist.isend(tensor, dst=dst, group=pg, tag=tag, group_dst=group_dst)


def irecv(
    tensor: torch.Tensor,
    src: Optional[int] = None,
    group: Optional[ProcessGroup] = None,
    tag: int = 0,
    group_src: Optional[int] = None,
) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        if src is None and group_src is None:
            raise ValueError("torchcomms does not support wildcard recv (src=None)")
        return _comm(pg, tensor).recv(tensor, _group_rank(pg, src, group_src, "src"), True)
    return dist.irecv(tensor, src=src, group=pg, tag=tag, group_src=group_src)


class P2POp:
    """torch.distributed's ``P2POp`` that also takes distwrap's ``isend``/``irecv``."""

    def __init__(
        self,
        op: Any,
        tensor: torch.Tensor,
        peer: Optional[int] = None,
        group: Optional[ProcessGroup] = None,
        tag: int = 0,
        group_peer: Optional[int] = None,
    ) -> None:
        if op not in (isend, irecv, dist.isend, dist.irecv):
            raise ValueError(
                "Invalid ``op``. Expected ``op`` to be of type ``torch.distributed.isend`` or ``torch.distributed.irecv``."
            )
        self.op = op
        self.tensor = tensor
        self.peer = peer
        self.group = group
        self.tag = tag
        self.group_peer = group_peer

    def _dist(self) -> Any:
        op = dist.isend if self.op in (isend, dist.isend) else dist.irecv
        return dist.P2POp(
            op, self.tensor, self.peer, self.group, self.tag, group_peer=self.group_peer
        )


def batch_isend_irecv(p2p_op_list: list[Any]) -> list[Any]:
    """The sends and receives of ``p2p_op_list`` at once. With torchcomms: one batch per
    communicator (so transfers both ways cannot deadlock); a work per operation (the batch's)."""
    if not p2p_op_list:
        raise ValueError("batch_isend_irecv expects a non-empty list of P2POp")
    if not torchcomms_is_enabled():
        ops = [op._dist() if isinstance(op, P2POp) else op for op in p2p_op_list]
        return dist.batch_isend_irecv(ops)
    batches: dict[int, tuple[Any, Any]] = {}
    order = []
    for op in p2p_op_list:
        pg = _pg(op.group)
        comm = _comm(pg, op.tensor)
        key = id(comm)
        if key not in batches:
            batches[key] = (comm, comm.batch_op_create())
        batch = batches[key][1]
        sending = op.op in (isend, dist.isend)
        peer = _group_rank(
            pg, op.peer, getattr(op, "group_peer", None), "dst" if sending else "src"
        )
        (batch.send if sending else batch.recv)(op.tensor, peer)
        order.append(key)
    works = {key: b.issue(True) for key, (_, b) in batches.items()}
    return [works[key] for key in order]
