"""``DeviceMesh`` over torchcomms communicators (upstream's ``torchcomms.device_mesh``).

``init_device_mesh(mesh_dim_comms=(comm, ...), mesh_dim_names=(...))`` makes one process group
per mesh dimension, each running on the given communicator (a
:class:`torchcomms._c10d.TorchCommsProcessGroup`), registers them with torch.distributed under
the dimension names, and returns a ``torch.distributed.DeviceMesh`` over them: DDP, FSDP2,
DTensor/tensor parallelism and functional collectives then run on those communicators. No
``init_process_group`` is needed; the first group (or ``_global_comm``'s) becomes the default
group.

Groups made here have no store: DeviceMesh operations that create new groups through
torch.distributed (``_flatten()``, ``new_group``) need ``_flatten_with_comm`` and a communicator
made with ``comm.split``, as upstream.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from torchcomms import _c10d
from torchcomms._c10d import TorchCommsProcessGroup, _BackendWrapper

__all__ = ["init_device_mesh"]

# The c10d backend name groups made here report (``torch.distributed.get_backend``).
_BACKEND_STR = "torchcomm"


def _register_backend_name(name: str) -> None:
    """Makes ``name`` a known c10d backend, so torch.distributed accepts it in the bookkeeping
    of these groups. Its creator refuses: groups of this name are made from communicators."""
    if name.upper() in dist.Backend._plugins:
        return

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise ValueError(
            f"invalid argument `backend`: groups of backend {name!r} are made from torchcomms "
            "communicators (torchcomms.device_mesh, comm.split); torch.distributed cannot "
            "create one through a store"
        )

    dist.Backend.register_backend(name, refuse, extended_api=True, devices=["cpu", "cuda"])


def _create_torchcomm_process_group(
    comm: Any,
    group_name: str,
    backend_str: str = _BACKEND_STR,
    global_ranks_mapping: Optional[dict[int, int]] = None,
) -> dist.ProcessGroup:
    """A process group running on ``comm``, registered with torch.distributed as
    ``group_name`` (``_resolve_process_group``, ``get_process_group_ranks``, the ``ptd:`` tag).
    ``global_ranks_mapping`` maps global ranks to the group's ranks (identity by default)."""
    _register_backend_name(backend_str)
    device = comm.get_device()
    pg = TorchCommsProcessGroup(
        None,
        comm.get_rank(),
        comm.get_size(),
        {device.type: _BackendWrapper(comm)},
        devices=[device.type],
        backend_name=comm.get_backend(),
        group_name=group_name,
        group_desc=group_name,
    )
    if device.type == "cuda" and device.index is not None:
        pg._device_id = device
        if _c10d._may_bind_device():
            pg.bound_device_id = device
    world = c10d._world
    # The bookkeeping wants a store; these groups meet through their communicator.
    world.pg_map[pg] = (backend_str, dist.HashStore())
    world.pg_names[pg] = group_name
    world.pg_backend_config[pg] = f"{device.type}:{backend_str}"
    c10d._register_process_group(group_name, pg)
    world.pg_group_ranks[pg] = (
        dict(global_ranks_mapping)
        if global_ranks_mapping is not None
        else {i: i for i in range(comm.get_size())}
    )
    tag = f"ptd:{group_name}"
    world.tags_to_pg.setdefault(tag, []).append(pg)
    world.pg_to_tag[pg] = tag
    return pg


def init_device_mesh(
    mesh_dim_comms: Sequence[Any],
    mesh_dim_names: Sequence[str],
    _global_comm: Optional[Any] = None,
) -> dist.DeviceMesh:
    """A ``DeviceMesh`` whose dimension ``i`` (named ``mesh_dim_names[i]``) runs on the
    communicator ``mesh_dim_comms[i]``. The mesh's shape is the communicators' sizes; a rank's
    coordinates are its ranks in them. With several dimensions, ``_global_comm`` (over every
    rank) becomes the default group."""
    comms = tuple(mesh_dim_comms)
    names = tuple(mesh_dim_names)
    if not comms:
        raise ValueError("init_device_mesh: invalid argument `mesh_dim_comms`: no communicator")
    if len(names) != len(comms):
        raise ValueError(
            f"init_device_mesh: invalid argument `mesh_dim_names`: {len(names)} names for "
            f"{len(comms)} communicators"
        )
    if len(comms) > 1 and _global_comm is None:
        raise RuntimeError(
            "More than one torch comm objects are passed but no global comm(_global_comm) is "
            "provided. Please provide a global comm object via _global_comm."
        )
    device = comms[0].get_device()
    shape = tuple(c.get_size() for c in comms)
    world = math.prod(shape)
    if _global_comm is not None and _global_comm.get_size() != world:
        raise ValueError(
            f"init_device_mesh: invalid argument `_global_comm`: its size "
            f"{_global_comm.get_size()} is not the mesh's {world} ({' x '.join(map(str, shape))})"
        )
    mesh = torch.arange(world, dtype=torch.int, device="cpu").view(shape)
    coords = tuple(c.get_rank() for c in comms)
    global_rank = int(mesh[coords].item())

    default_pg = None
    if _global_comm is not None:
        default_pg = _create_torchcomm_process_group(_global_comm, _global_comm.get_name())
    for dim, (comm, name) in enumerate(zip(comms, names)):
        # The ranks of this dimension's group that contains this rank, in group order.
        rows = mesh.transpose(dim, -1).reshape(-1, mesh.size(dim))
        row = int(torch.where(rows == global_rank)[0].item())
        members = rows[row].tolist()
        pg = _create_torchcomm_process_group(
            comm, name, global_ranks_mapping={g: i for i, g in enumerate(members)}
        )
        if default_pg is None:
            default_pg = pg
    c10d.GroupMember.WORLD = default_pg
    c10d._world.default_pg = default_pg

    dm = dist.DeviceMesh(
        device_type=device.type,
        mesh=mesh,
        mesh_dim_names=names,
        _init_backend=False,
        _rank=global_rank,
    )
    dm._dim_group_names = list(names)
    registry = getattr(dm, "_pg_registry", None)
    if registry is not None:
        for name in names:
            registry[name] = c10d._resolve_process_group(name)
    return dm


def _flatten_with_comm(
    mesh: dist.DeviceMesh,
    mesh_dim_name: str,
    comm: Any,
    global_ranks: Sequence[int],
    layout: Any,
) -> dist.DeviceMesh:
    """Registers ``comm`` (over ``global_ranks``) as the flattened dimension ``mesh_dim_name``
    of ``mesh`` with ``layout`` (the flattened dimensions' layout), as ``mesh._flatten()`` would
    with a group it made itself."""
    _create_torchcomm_process_group(
        comm, mesh_dim_name, global_ranks_mapping={g: i for i, g in enumerate(global_ranks)}
    )
    if hasattr(layout, "coalesce"):
        flat_layout = layout.coalesce()
    else:  # torch >= 2.13: _MeshLayout.collapse() and a layout of _FlatLayouts
        from torch.distributed._mesh_layout import _MeshLayout

        flat_layout = _MeshLayout([layout.collapse()])
    common = dict(
        device_type=comm.get_device().type,
        mesh_dim_names=(mesh_dim_name,),
        _init_backend=False,
        _rank=mesh.get_rank(),
        _layout=flat_layout,
    )
    if hasattr(mesh, "_rank_map"):
        flat = dist.DeviceMesh(_rank_map=mesh._rank_map, _root_mesh=mesh._get_root_mesh(), **common)
    else:
        flat = dist.DeviceMesh(mesh=torch.tensor(list(global_ranks), device="cpu"), **common)
    flat._dim_group_names = [mesh_dim_name]
    root = mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else mesh
    if hasattr(root, "_flatten_mapping"):
        root._flatten_mapping[mesh_dim_name] = flat
    registry = getattr(root, "_pg_registry", None)
    if registry is not None:
        registry[mesh_dim_name] = c10d._resolve_process_group(mesh_dim_name)
    return flat
