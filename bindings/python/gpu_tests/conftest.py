"""Helpers the GPU test modules share."""

from __future__ import annotations

import os
from typing import Any, Optional

import torchcomms


def new_comm_on(backends: Optional[str], device: Any, name: str, **kwargs: Any) -> Any:
    """A ``ctran`` communicator created with ``CTRAN_BACKENDS=backends`` (``None``: as the
    environment says). Cvars are read at creation, so the process's other communicators keep
    theirs."""
    before = os.environ.get("CTRAN_BACKENDS")
    if backends is not None:
        os.environ["CTRAN_BACKENDS"] = backends
    try:
        return torchcomms.new_comm("ctran", device, name, **kwargs)
    finally:
        if before is None:
            os.environ.pop("CTRAN_BACKENDS", None)
        else:
            os.environ["CTRAN_BACKENDS"] = before
