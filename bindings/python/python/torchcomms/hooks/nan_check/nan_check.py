"""NanCheckHook: a pre-hook that raises ``RuntimeError`` when a floating-point tensor an
operation is about to send (or, optionally, receive into) holds a NaN, so numerical trouble
stops at the rank that produced it instead of spreading to every rank.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from torchcomms._comms import OpName

_check_for_nan: Any = None


def _has_nan(t: torch.Tensor) -> bool:
    """True when ``t`` holds a NaN. Uses ``torch.ops.c10d.check_for_nan`` (the dispatched op
    upstream uses, CPU and CUDA) when torch provides it, else ``torch.isnan``."""
    global _check_for_nan
    if _check_for_nan is None:
        try:
            # Bound to its own name: `import torch.distributed` would make `torch` a local of
            # this function, unbound on the calls that skip this branch.
            import torch.distributed as _registers_c10d_ops  # noqa: F401

            _check_for_nan = torch.ops.c10d.check_for_nan
        except (ImportError, AttributeError, RuntimeError):
            _check_for_nan = False
    if _check_for_nan:
        try:
            _check_for_nan(t)
            return False
        except RuntimeError:
            return True
    return bool(torch.isnan(t).any())


# What each operation's args carry: (attribute, is_list, is_input).
_FIELDS: dict[OpName, tuple[tuple[str, bool, bool], ...]] = {
    OpName.send: (("tensor", False, True),),
    OpName.recv: (("tensor", False, False),),
    OpName.broadcast: (("tensor", False, True),),
    OpName.all_reduce: (("tensor", False, True),),
    OpName.reduce: (("tensor", False, True),),
    OpName.all_gather: (("input", False, True), ("output", True, False)),
    OpName.all_gather_v: (("input", False, True), ("output", True, False)),
    OpName.gather: (("input", False, True), ("output", True, False)),
    OpName.all_gather_single: (("input", False, True), ("output", False, False)),
    OpName.reduce_scatter_single: (("input", False, True), ("output", False, False)),
    OpName.all_to_all_single: (("input", False, True), ("output", False, False)),
    OpName.all_to_all_v_single: (("input", False, True), ("output", False, False)),
    OpName.gather_single: (("input", False, True), ("output", False, False)),
    OpName.reduce_scatter: (("input", True, True), ("output", False, False)),
    OpName.reduce_scatter_v: (("input", True, True), ("output", False, False)),
    OpName.scatter: (("input", True, True), ("output", False, False)),
    OpName.all_to_all: (("input", True, True), ("output", True, False)),
}

# In-place operations check their one tensor when either side is checked.
_INPLACE = {OpName.broadcast, OpName.all_reduce, OpName.reduce}


class NanCheckHook:
    """Checks tensors for NaN before each operation of the communicators it is registered with.

    Args:
        check_inputs: check the tensors an operation sends (default True).
        check_outputs: check the tensors an operation writes (default False).
    """

    def __init__(self, check_inputs: bool = True, check_outputs: bool = False) -> None:
        self._check_inputs = check_inputs
        self._check_outputs = check_outputs
        self._registered = 0

    def register_with_comm(self, comm: Any) -> None:
        """Adds the check as a pre-hook of ``comm``."""
        comm_name = comm.get_name()

        def pre_hook(name: OpName, op_id: int, args: Any) -> None:
            fields = _FIELDS.get(name)
            if not fields:
                return  # barrier, split, batch, finalize: no tensors
            for attr, is_list, is_input in fields:
                wanted = self._check_inputs if is_input else self._check_outputs
                if name in _INPLACE:
                    wanted = self._check_inputs or self._check_outputs
                if not wanted:
                    continue
                value = getattr(args, attr)
                tensors: Iterable[torch.Tensor] = value if is_list else (value,)
                label = "input" if is_input else "output"
                for t in tensors:
                    if t.is_floating_point() and _has_nan(t):
                        raise RuntimeError(
                            f"NaN detected in {label} tensor for '{name.name}' on comm "
                            f"'{comm_name}'"
                        )

        comm.register_pre_hook(pre_hook)
        self._registered += 1

    def is_enabled(self) -> bool:
        """True once registered with at least one communicator."""
        return self._registered > 0
