"""What distwrap knows about each process group (upstream's ``torchcomms.distwrap.pginfo``): its
global ranks, its description, and data such as its communicators per device type
(``"torchcomms"``), its device backends and its store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from torch.distributed import ProcessGroup


@dataclass
class _PgInfo:
    global_ranks: list[int]
    group_desc: str
    rank_to_group_rank: dict[int, int] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)


_REGISTRY: dict[ProcessGroup, _PgInfo] = {}


def pg_info_create(
    pg: ProcessGroup, global_ranks: Optional[list[int]], group_desc: Optional[str]
) -> None:
    if pg in _REGISTRY:
        raise AssertionError(f"Process group {pg} already registered")
    ranks = list(global_ranks or [])
    _REGISTRY[pg] = _PgInfo(ranks, group_desc or "", {g: i for i, g in enumerate(ranks)})


def pg_info_destroy(pg: ProcessGroup) -> None:
    _REGISTRY.pop(pg, None)


def pg_info_get(pg: ProcessGroup) -> Optional[_PgInfo]:
    return _REGISTRY.get(pg)


def _get(pg: ProcessGroup) -> _PgInfo:
    info = _REGISTRY.get(pg)
    if info is None:
        raise AssertionError(f"Process group {pg} not registered")
    return info


def pg_info_assert_registered(pg: ProcessGroup) -> None:
    _get(pg)


def pg_info_get_global_ranks(pg: ProcessGroup) -> list[int]:
    return _get(pg).global_ranks


def pg_info_get_rank_map(pg: ProcessGroup) -> dict[int, int]:
    return _get(pg).rank_to_group_rank


def pg_info_get_group_desc(pg: ProcessGroup) -> str:
    return _get(pg).group_desc


def pg_info_set_data(pg: ProcessGroup, key: str, data: Any) -> None:
    _get(pg).data[key] = data


def pg_info_get_data(pg: ProcessGroup, key: str) -> Any:
    info = _get(pg)
    if key not in info.data:
        raise AssertionError(f"Key '{key}' not found in process group {pg}")
    return info.data[key]
