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
from torchcomms.distwrap.mode import (  # noqa: F401 - eager_init_is_enabled is public
    _state,
    eager_init_is_enabled,
    torchcomms_is_enabled,
)
from torchcomms.distwrap.pginfo import (
    pg_info_assert_registered,
    pg_info_create,
    pg_info_destroy,
    pg_info_get,
    pg_info_get_data,
    pg_info_set_data,
)
from torchcomms.distwrap.collectives import (  # noqa: F401 - the public surface
    _pg,
    _comm,
    _group_rank,
    _ret,
    _make_nccl_premul_sum,
    all_reduce,
    broadcast,
    reduce,
    all_gather,
    all_gather_into_tensor,
    reduce_scatter,
    reduce_scatter_tensor,
    all_to_all,
    all_to_all_single,
    scatter,
    gather,
    barrier,
    send,
    recv,
    isend,
    irecv,
    P2POp,
    batch_isend_irecv,
)


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
