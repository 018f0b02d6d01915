"""torchcomms: collective communication for PyTorch, on the ctran engine of torchcomms-rs.

A drop-in re-creation of Meta's torchcomms Python API::

    import torch
    import torchcomms

    comm = torchcomms.new_comm("ctran", torch.device("cpu"), name="world")
    t = torch.ones(4) * comm.get_rank()
    comm.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=False)
    comm.finalize()

Run it under a launcher (``torchrun --nproc_per_node 4 script.py``): rank and size come from
the environment, the store from ``MASTER_ADDR``/``MASTER_PORT`` or ``store=``.
"""

import ctypes
import os
import sys
import warnings
from datetime import timedelta
from importlib.metadata import entry_points

# torch first: tensors come from it (our extension does not link libtorch, but upstream's
# import order is part of the contract).
import torch  # noqa: F401


def _torch_at_least(version: str) -> bool:
    def parse(v: str) -> tuple:
        out = []
        for part in v.split("+")[0].split(".")[:3]:
            digits = "".join(ch for ch in part if ch.isdigit())
            out.append(int(digits) if digits else 0)
        return tuple(out)

    return parse(torch.__version__) >= parse(version)


def _opaque_meta():
    try:
        from torch._custom_class_base import OpaqueBaseMeta  # torch >= 2.14
    except ImportError:
        try:
            from torch._opaque_base import OpaqueBaseMeta
        except ImportError:
            return None
    return OpaqueBaseMeta


_OpaqueBaseMeta = _opaque_meta() if _torch_at_least("2.12.0") else None

if _OpaqueBaseMeta is not None:
    sys.modules["torchcomms._opaque_meta"] = type(
        "module", (), {"OpaqueBaseMeta": _OpaqueBaseMeta}
    )()

    class Timeout(timedelta, metaclass=_OpaqueBaseMeta):
        """A timeout (a ``datetime.timedelta``) usable under torch.compile."""

else:

    class Timeout(timedelta):
        """A timeout (a ``datetime.timedelta``)."""


def _load_libtorchcomms() -> None:
    # Upstream ships its C++ core as a separate library; kept for layout compatibility.
    path = os.path.join(os.path.dirname(__file__), "libtorchcomms.so")
    if os.path.exists(path):
        ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)


_load_libtorchcomms()
from torchcomms._comms import *  # noqa: E402, F401, F403
from torchcomms._comms import (  # noqa: E402, F401
    BatchP2POptions,
    BatchSendRecv,
    CommOptions,
    CommTimeoutError,
    CommTypeError,
    CommValueError,
    P2POp,
    ReduceOp,
    TorchComm,
    TorchCommBackend,
    TorchCommWindow,
    TorchWork,
    _is_backend_registered,
    new_comm,
    register_backend,
)
import torchcomms.hooks as hooks  # noqa: E402, F401
import torchcomms.objcol as objcol  # noqa: E402, F401
from torchcomms import _comms  # noqa: E402


def _alias_hook_modules() -> None:
    """Upstream binds its hooks in C++ as ``torchcomms._comms.hooks.{fr,clog}``; ours are
    Python classes, published under the same names (attributes and ``sys.modules``)."""
    import types

    pkg = types.ModuleType("torchcomms._comms.hooks", "Hook submodules (aliases of torchcomms.hooks).")
    fr = types.ModuleType("torchcomms._comms.hooks.fr", "FlightRecorderHook.")
    fr.FlightRecorderHook = hooks.FlightRecorderHook
    clog = types.ModuleType("torchcomms._comms.hooks.clog", "clog.")
    clog.clog = hooks.clog
    pkg.fr, pkg.clog = fr, clog
    _comms.hooks = pkg
    for mod in (pkg, fr, clog):
        sys.modules[mod.__name__] = mod


_alias_hook_modules()

# torch.distributed on torchcomms (torchcomms/_c10d.py): the c10d backend over a TorchComm, under
# upstream's name. Where torch can take it as a c10d backend (torch >= 2.14) it is also
# `torchcomms._comms._BackendWrapper`, where torch.distributed looks for it. This runs while
# torch.distributed itself may be importing torchcomms: nothing here needs more than torch._C.
from torchcomms import _c10d  # noqa: E402
from torchcomms._c10d import _BackendWrapper  # noqa: E402, F401
import torchcomms.functional as functional  # noqa: E402, F401

if _c10d.PYTHON_BACKENDS:
    _comms._BackendWrapper = _BackendWrapper
# init_process_group(backend="ctran"): registered now if torch.distributed is complete, else by
# torch's backend entry points (see pyproject.toml).
_c10d.register_c10d_backends()


def _patch_for_compile() -> bool:
    """The cvar TORCHCOMMS_PATCH_FOR_COMPILE; an invalid value warns here (importing never
    fails on configuration) and fails communicator creation."""
    try:
        return bool(_comms._cvar("TORCHCOMMS_PATCH_FOR_COMPILE"))
    except ValueError as e:
        warnings.warn(str(e), stacklevel=3)
        return False


if _patch_for_compile():
    warnings.warn(
        "TORCHCOMMS_PATCH_FOR_COMPILE=1: compiling TorchComm methods (upstream's "
        "torchcomms.functional) is not available in torchcomms-rs yet; they run eagerly. "
        "torch.distributed functional collectives on a torchcomms process group compile.",
        stacklevel=2,
    )

__all__ = [
    "new_comm",
    "TorchComm",
    "ReduceOp",
    "TorchWork",
    "Timeout",
    "BatchP2POptions",
    "BatchSendRecv",
    "P2POp",
    "CommOptions",
    "TorchCommWindow",
    "register_backend",
    "TorchCommBackend",
]

for _name in __all__:
    globals()[_name].__module__ = "torchcomms"
del _name


def _entry_points(name: "str | None" = None) -> list:
    """Entry points of the ``torchcomms.backends`` group (all, or those named ``name``)."""
    try:
        found = entry_points(group="torchcomms.backends")
    except TypeError:  # Python 3.9: entry_points() takes no selection
        found = entry_points().get("torchcomms.backends", [])
    return [ep for ep in found if name is None or ep.name == name]


def _load_backend(backend: str) -> None:
    """Imports the module that provides ``backend``, found through the ``torchcomms.backends``
    entry-point group (``new_comm`` calls this before it looks the name up)."""
    found = _entry_points(backend)
    if not found:
        raise ModuleNotFoundError(
            f"failed to find backend {backend}, is it registered via entry_points.txt?"
        )
    found[0].load()


def is_backend_built(backend: str) -> bool:
    """True if an installed package provides this backend (an entry point)."""
    return bool(_entry_points(backend))


def built_backends() -> list[str]:
    """Names of every backend installed packages provide."""
    return [ep.name for ep in _entry_points()]
