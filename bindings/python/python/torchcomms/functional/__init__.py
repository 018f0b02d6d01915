"""``torchcomms.functional``: upstream's entry points for torch.compile support.

Upstream's ``TORCHCOMMS_PATCH_FOR_COMPILE=1`` makes ``TorchComm`` methods traceable by
torch.compile (opaque communicator objects, custom ops and Inductor lowerings); torchcomms-rs
does not implement that yet. What compiles here is torch's own functional collectives
(``torch.distributed._functional_collectives``) on process groups that run on torchcomms
(``init_process_group(backend="ctran")``, ``torchcomms.device_mesh``): eager and inside
``torch.compile(fullgraph=True)``. See ``docs/torch-distributed.md``.
"""

from __future__ import annotations

from typing import Optional

# Upstream's minimum PyTorch for compiling TorchComm methods (".dev0" admits nightlies).
MIN_PYTORCH_VERSION_FOR_COMPILE = "2.12.0.dev0"


def _parse(version: str) -> tuple:
    """(major, minor, patch, not_dev) of a PyTorch version string such as "2.15.0+cu132" or
    "2.12.0.dev20260101"; a dev release sorts before its release."""
    main = version.split("+")[0]
    parts = main.split(".")
    nums = []
    for p in parts[:3]:
        digits = ""
        for ch in p:
            if not ch.isdigit():
                break
            digits += ch
        nums.append(int(digits) if digits else 0)
    while len(nums) < 3:
        nums.append(0)
    dev = "dev" in main or any(x in main for x in ("a", "b", "rc"))
    return (*nums, 0 if dev else 1)


def is_torch_compile_supported(
    min_version: str = MIN_PYTORCH_VERSION_FOR_COMPILE,
    _current_version: Optional[str] = None,
) -> bool:
    """Whether this PyTorch is recent enough for upstream's compile support
    (``TORCHCOMMS_COMPILE_IGNORE_PYTORCH_VERSION_REQUIREMENT=1`` skips the check)."""
    if _current_version is None:
        import torch

        _current_version = torch.__version__
    from torchcomms import _comms

    if _comms._cvar("TORCHCOMMS_COMPILE_IGNORE_PYTORCH_VERSION_REQUIREMENT"):
        return True
    return _parse(_current_version) >= _parse(min_version)


def is_torch_compile_supported_and_enabled(
    min_version: str = MIN_PYTORCH_VERSION_FOR_COMPILE,
    _current_version: Optional[str] = None,
) -> bool:
    """Upstream: compile support is on (``TORCHCOMMS_PATCH_FOR_COMPILE=1``) and PyTorch is recent
    enough. torchcomms-rs does not patch ``TorchComm`` for torch.compile, so this is always
    False here; compile functional collectives on a process group instead."""
    return False


__all__ = ["is_torch_compile_supported_and_enabled"]
