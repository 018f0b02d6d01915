"""``torchcomms.distwrap``: upstream's torch.distributed look-alike.

The functions take torch.distributed's arguments. Without torchcomms
(``init_process_group(..., use_torchcomms=False)``, the default) they pass through to
``torch.distributed``. With ``use_torchcomms=True`` every group also holds one ``TorchComm`` per
device type of its backend string, and the collectives run on those communicators: the tensor's
device type picks the communicator, global ranks become group ranks, and the result is the
``TorchWork`` when ``async_op`` is set, else None.

Backend strings: a name (``"ctran"``: CPU, and CUDA where torch sees a GPU; ``"nccl"``,
``"ncclx"``, ``"rccl"``, ``"rcclx"``: CUDA; ``"gloo"``: CPU; ``"hccl"``: MTIA) or a map
(``"cpu:ctran,cuda:nccl"``). The communicators are ``new_comm(backend, device, ...)`` of these
names (torchcomms-rs builds ``ctran`` and ``nccl``); the torch.distributed group gets the name
torch knows (``ncclx`` becomes ``nccl``; ``ctran`` is the c10d backend of this package).

Differences from upstream, by design: torch.distributed's own collectives are not blocked in
torchcomms mode (they run on the group's c10d backend); ``split_group`` creates the
torch.distributed subgroup of every split (each rank calls ``new_group`` with the same ranks, as
torch.distributed requires), then splits the communicators; ``batch_isend_irecv`` issues one
torchcomms batch (so transfers both ways cannot deadlock); there are no gloo fallbacks (our
backends have every operation).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed import (  # noqa: F401 - re-exported, as upstream
    GroupMember,
    HashStore,
    ProcessGroup,
    ReduceOp,
    Store,
    Work,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    is_available,
    is_initialized,
)

import torchcomms
from torchcomms import objcol
from torchcomms._c10d import _reduce_op
from torchcomms.distwrap.pginfo import (
    pg_info_assert_registered,
    pg_info_create,
    pg_info_destroy,
    pg_info_get,
    pg_info_get_data,
    pg_info_set_data,
)

_state = {"torchcomms": False, "eager": False}

# The device type a bare backend name means.
_DEFAULT_DEVICE = {
    "nccl": "cuda",
    "ncclx": "cuda",
    "rccl": "cuda",
    "rcclx": "cuda",
    "tc_nccl": "cuda",
    "gloo": "cpu",
    "hccl": "mtia",
}
# What torch.distributed calls a backend.
_DIST_NAME = {"ncclx": "nccl", "rcclx": "nccl", "rccl": "nccl"}


def torchcomms_is_enabled() -> bool:
    """Whether the collectives run on TorchComm objects (``use_torchcomms=True``)."""
    return _state["torchcomms"]


def eager_init_is_enabled() -> bool:
    return _state["eager"]


def parse_backend_string(backend: str) -> dict[str, str]:
    """{device type: backend} of ``"name"`` or ``"cpu:gloo,cuda:nccl"``."""
    backend = str(backend)
    out: dict[str, str] = {}
    if ":" in backend:
        for part in backend.split(","):
            pieces = part.split(":")
            if len(pieces) != 2:
                raise ValueError(
                    f"Invalid backend format: '{part}'. Each part in merged form must have exactly "
                    f"one colon (e.g., 'cpu:gloo,cuda:nccl'), got {len(pieces) - 1} colons."
                )
            device = torch.device(pieces[0].strip()).type
            if device in out:
                raise ValueError(f"Duplicate device type '{device}' in backend string '{backend}'")
            out[device] = pieces[1].strip()
        return out
    if backend == "ctran":
        out["cpu"] = "ctran"
        if torch.cuda.is_available():
            out["cuda"] = "ctran"
        return out
    if backend not in _DEFAULT_DEVICE:
        known = sorted([*_DEFAULT_DEVICE, "ctran"])
        raise ValueError(f"Unknown backend: '{backend}'. Known backends are: {', '.join(known)}")
    return {_DEFAULT_DEVICE[backend]: backend}


def format_backend_string(device_backends: dict[str, str]) -> str:
    return ",".join(f"{d}:{b}" for d, b in device_backends.items())


def _dist_backend(device_backends: dict[str, str]) -> str:
    return format_backend_string({d: _DIST_NAME.get(b, b) for d, b in device_backends.items()})


def get_rank_and_world_size(rank: int, world_size: int) -> tuple[int, int]:
    """``rank``/``world_size``, or from the launcher's environment (Open MPI, torchrun, SLURM,
    PMI) when -1."""
    pairs = [
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("RANK", "WORLD_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
        ("PMI_RANK", "PMI_SIZE"),
    ]
    if rank == -1:
        rank = next((int(os.environ[r]) for r, _ in pairs if r in os.environ), -1)
    if world_size == -1:
        world_size = next((int(os.environ[s]) for _, s in pairs if s in os.environ), -1)
    if rank == -1:
        raise AssertionError(
            "rank must be specified either as a parameter or via environment variables (RANK, "
            "OMPI_COMM_WORLD_RANK, SLURM_PROCID, or PMI_RANK)"
        )
    if world_size == -1:
        raise AssertionError(
            "world_size must be specified either as a parameter or via environment variables "
            "(WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS, or PMI_SIZE)"
        )
    return rank, world_size


def _shared_store(rank: int, world_size: int) -> Store:
    """The store every rank reaches: torchrun's agent store, else one rank 0 serves at
    ``MASTER_ADDR:MASTER_PORT``."""
    addr = os.environ.get("MASTER_ADDR", "localhost")
    port = int(os.environ.get("MASTER_PORT", "29500"))
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    return dist.TCPStore(
        addr, port, world_size, is_master=rank == 0 and not agent, wait_for_workers=not agent
    )


# --------------------------------------------------------------------------- groups


def init_process_group(
    backend: Optional[str] = None,
    init_method: Optional[str] = None,
    timeout: Optional[timedelta] = None,
    world_size: int = -1,
    rank: int = -1,
    store: Optional[Store] = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
    use_torchcomms: bool = False,
) -> None:
    """torch.distributed's ``init_process_group``; with ``use_torchcomms`` the default group
    also gets one communicator per device type of ``backend`` (``device_id`` is then ignored,
    as upstream)."""
    if backend is None:
        raise ValueError("backend must be specified")
    _state["torchcomms"] = bool(use_torchcomms)
    rank, world_size = get_rank_and_world_size(rank, world_size)
    tc_store = None
    if use_torchcomms:
        device_id = None
        if store is None:
            store = _shared_store(rank, world_size)
        tc_store = store
    _state["eager"] = device_id is not None
    device_backends = parse_backend_string(backend)
    dist.init_process_group(
        backend=_dist_backend(device_backends),
        init_method=init_method,
        timeout=timeout,
        world_size=world_size,
        rank=rank,
        store=dist.PrefixStore("distwrap_dist/", store) if store is not None else None,
        group_name=group_name,
        pg_options=pg_options,
        device_id=device_id,
    )
    world = dist.group.WORLD
    if world is None:
        raise AssertionError("World process group is not initialized")
    pg_info_create(world, list(range(world_size)), group_name)
    pg_info_set_data(world, "device_backends", device_backends)
    if use_torchcomms:
        pg_info_set_data(world, "tc_store", tc_store)
        comms = {}
        shared = [b for b in device_backends.values()]
        for device, be in device_backends.items():
            name = group_name or f"default_torchcomm_{be}"
            if shared.count(be) > 1:  # names are unique in a process
                name = f"{name}_{device}"
            comms[device] = torchcomms.new_comm(
                be,
                torch.device(device),
                name=name,
                timeout=timeout,
                store=dist.PrefixStore(f"distwrap_tc/{device}/", tc_store),
            )
        pg_info_set_data(world, "torchcomms", comms)


def new_group(
    ranks: Optional[Sequence[int]] = None,
    timeout: Optional[timedelta] = None,
    backend: Optional[str] = None,
    pg_options: Any = None,
    use_local_synchronization: bool = False,
    group_desc: Optional[str] = None,
    device_id: Any = None,
) -> ProcessGroup:
    if not dist.is_initialized():
        raise AssertionError("new_group called before init_process_group")
    pg_info_assert_registered(dist.group.WORLD)
    if torchcomms_is_enabled():
        raise AssertionError("new_group is not supported with torchcomms. Use split_group instead.")
    if backend is None:
        raise ValueError("backend must be specified")
    ranks = list(ranks) if ranks is not None else list(range(dist.get_world_size()))
    device_backends = parse_backend_string(backend)
    pg = dist.new_group(
        ranks=ranks,
        timeout=timeout,
        backend=_dist_backend(device_backends),
        pg_options=pg_options,
        use_local_synchronization=use_local_synchronization,
        group_desc=group_desc,
        device_id=device_id,
    )
    if pg is not None and pg != GroupMember.NON_GROUP_MEMBER:
        pg_info_create(pg, ranks, group_desc)
        pg_info_set_data(pg, "device_backends", device_backends)
    return pg


def split_group(
    parent_pg: Optional[ProcessGroup] = None,
    split_ranks: Optional[list[list[int]]] = None,
    timeout: Optional[timedelta] = None,
    pg_options: Any = None,
    group_desc: Optional[str] = None,
    backend: Optional[str] = None,
) -> Optional[ProcessGroup]:
    """The group of ``split_ranks`` (ranks of ``parent_pg``) that holds this rank; with
    torchcomms its communicators are the parent's, split (``comm.split``, with ``pg_options``'
    attributes as hints)."""
    if not dist.is_initialized():
        raise AssertionError("split_group called before init_process_group")
    parent = parent_pg if parent_pg is not None else dist.group.WORLD
    pg_info_assert_registered(parent)
    if split_ranks is None:
        split_ranks = [list(range(dist.get_world_size(parent)))]
    me = dist.get_rank(parent)
    mine = next((list(r) for r in split_ranks if me in r), None)
    if mine is None:
        raise ValueError(f"Rank {me} not found in any split_ranks group")
    device_backends = (
        parse_backend_string(backend)
        if backend is not None
        else pg_info_get_data(parent, "device_backends")
    )
    parent_global = get_process_group_ranks(parent)
    if not torchcomms_is_enabled() and hasattr(dist, "split_group"):
        try:
            pg = dist.split_group(parent, split_ranks, timeout, pg_options, group_desc)
        except RuntimeError as e:
            if "No device associated with the default pg" not in str(e):
                raise
            pg = _new_groups(parent_global, split_ranks, mine, timeout, group_desc, device_backends)
    else:
        pg = _new_groups(parent_global, split_ranks, mine, timeout, group_desc, device_backends)
    if pg is None or pg == GroupMember.NON_GROUP_MEMBER:
        return None
    pg_info_create(pg, [parent_global[r] for r in mine], group_desc)
    pg_info_set_data(pg, "device_backends", device_backends)
    if torchcomms_is_enabled():
        hints = _hints(pg_options)
        comms = {}
        for device, comm in pg_info_get_data(parent, "torchcomms").items():
            if device in device_backends:
                child = comm.split(mine, group_desc or "", hints=hints, timeout=timeout)
                if child is not None:
                    comms[device] = child
        pg_info_set_data(pg, "torchcomms", comms)
    return pg


def _new_groups(
    parent_global: list[int],
    split_ranks: list[list[int]],
    mine: list[int],
    timeout: Any,
    desc: Any,
    device_backends: dict[str, str],
) -> Any:
    """torch.distributed subgroups for every split (every rank calls new_group with the same
    ranks, in the same order); returns this rank's."""
    out = None
    for ranks in split_ranks:
        g = dist.new_group(
            [parent_global[r] for r in ranks],
            timeout=timeout,
            backend=_dist_backend(device_backends),
            group_desc=desc,
        )
        if list(ranks) == mine:
            out = g
    return out


def _hints(pg_options: Any) -> Optional[dict[str, str]]:
    if pg_options is None:
        return None
    if isinstance(pg_options, dict):
        return {str(k): str(v) for k, v in pg_options.items()}
    hints = {}
    for attr in dir(pg_options):
        if not attr.startswith("_"):
            try:
                value = getattr(pg_options, attr)
            except Exception:
                continue
            if not callable(value):
                hints[attr] = str(value)
    return hints or None


def destroy_process_group(group: Optional[ProcessGroup] = None) -> None:
    """Finalizes the group's communicators (torchcomms), then torch.distributed's
    ``destroy_process_group``."""
    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise AssertionError("Process group is not initialized")
    info = pg_info_get(pg)
    if torchcomms_is_enabled() and info is not None:
        for comm in info.data.get("torchcomms", {}).values():
            comm.finalize()
        info.data["tc_store"] = None
    pg_info_destroy(pg)
    dist.destroy_process_group(group)
    if group is None:
        _state["torchcomms"] = False


# --------------------------------------------------------------------------- collectives


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


# --------------------------------------------------------------------------- objects


def all_gather_object(
    object_list: list[Any], obj: Any, group: Optional[ProcessGroup] = None
) -> None:
    pg = _pg(group)
    if torchcomms_is_enabled():
        return objcol.all_gather_object(_comm(pg), object_list, obj)
    return dist.all_gather_object(object_list, obj, pg)


def gather_object(
    obj: Any,
    object_gather_list: Optional[list[Any]] = None,
    dst: Optional[int] = None,
    group: Optional[ProcessGroup] = None,
    group_dst: Optional[int] = None,
) -> None:
    pg = _pg(group)
    if torchcomms_is_enabled():
        root = _group_rank(pg, dst, group_dst, "dst")
        return objcol.gather_object(_comm(pg), obj, root, object_gather_list)
    return dist.gather_object(obj, object_gather_list, dst, pg, group_dst=group_dst)


def scatter_object_list(
    scatter_object_output_list: list[Any],
    scatter_object_input_list: Optional[list[Any]] = None,
    src: Optional[int] = None,
    group: Optional[ProcessGroup] = None,
    group_src: Optional[int] = None,
) -> None:
    pg = _pg(group)
    if torchcomms_is_enabled():
        root = _group_rank(pg, src, group_src, "src")
        return objcol.scatter_object_list(
            _comm(pg), root, scatter_object_output_list, scatter_object_input_list
        )
    return dist.scatter_object_list(
        scatter_object_output_list, scatter_object_input_list, src, pg, group_src=group_src
    )


def broadcast_object_list(
    object_list: list[Any],
    src: Optional[int] = None,
    group: Optional[ProcessGroup] = None,
    device: Any = None,
    group_src: Optional[int] = None,
) -> None:
    pg = _pg(group)
    if torchcomms_is_enabled():
        root = _group_rank(pg, src, group_src, "src")
        return objcol.broadcast_object_list(_comm(pg), object_list, root)
    return dist.broadcast_object_list(object_list, src, pg, device, group_src=group_src)


# --------------------------------------------------------------------------- extensions


def get_mem_allocator(group: Optional[ProcessGroup] = None, device: Any = None) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        comms = pg_info_get_data(pg, "torchcomms")
        comm = (
            comms.get(torch.device(device).type)
            if device is not None
            else next(iter(comms.values()))
        )
        return comm.get_mem_allocator()
    return pg._get_backend(
        torch.device(device) if device is not None else torch.device("cuda")
    ).mem_allocator


def register_mem_pool(group: Optional[ProcessGroup], device: Any, pool: Any) -> None:
    """Nothing to do with torchcomms (its allocator registers its memory); otherwise the group's
    backend registers ``pool``."""
    if torchcomms_is_enabled():
        return
    pg = _pg(group)
    pg._get_backend(torch.device(device)).register_mem_pool(pool)


def new_window(group: Optional[ProcessGroup] = None, backend: Optional[str] = None) -> Any:
    pg = _pg(group)
    if torchcomms_is_enabled():
        return _comm(pg).new_window()
    raise NotImplementedError(
        "new_window needs torchcomms (init_process_group(..., use_torchcomms=True))"
    )


def reduce_scatter_quantized(
    output: torch.Tensor,
    input: torch.Tensor,
    op: Any,
    seed: Any,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
) -> Any:
    raise NotImplementedError(
        "reduce_scatter_quantized is an ncclx extension; torchcomms-rs has no ncclx backend"
    )


# torch.distributed's `group` namespace, re-exported as upstream does (after the functions, whose
# `group` parameters would otherwise shadow it).
group = dist.group

__all__ = [
    "P2POp",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "destroy_process_group",
    "gather",
    "gather_object",
    "get_mem_allocator",
    "init_process_group",
    "irecv",
    "isend",
    "new_group",
    "new_window",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_quantized",
    "reduce_scatter_tensor",
    "register_mem_pool",
    "scatter",
    "scatter_object_list",
    "send",
    "split_group",
]
