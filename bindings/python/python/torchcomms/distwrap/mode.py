"""Which mode ``torchcomms.distwrap`` runs in (set by its ``init_process_group``)."""

from __future__ import annotations

_state = {"torchcomms": False, "eager": False}


def torchcomms_is_enabled() -> bool:
    """Whether the collectives run on TorchComm objects (``use_torchcomms=True``)."""
    return _state["torchcomms"]


def eager_init_is_enabled() -> bool:
    return _state["eager"]
