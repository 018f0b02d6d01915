"""Tensors over memory a window maps (``TorchCommWindow.map_remote_tensor``): a peer's window
over NVLink, or this rank's own. They stay valid while the window is registered."""

from __future__ import annotations

import ctypes
from typing import Any

import torch


class _CudaBytes:
    """``nbytes`` bytes of device memory at ``ptr``, described by the CUDA array interface."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


def tensor_at(ptr: int, shape: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` over the memory at ``ptr`` on ``device``."""
    numel = 1
    for d in shape:
        numel *= int(d)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    if device.type == "cuda":
        raw = torch.as_tensor(_CudaBytes(ptr, nbytes), device=device)
    else:
        raw = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)
