"""Upstream's RDMA transfer API (``torchcomms._transport``): one-sided writes and reads between
two processes connected point to point. This build's transport is software (cross-memory attach
and CUDA IPC within a host, TCP otherwise); see ``docs/rdma.md``."""

from torchcomms._comms import (
    RdmaMemory,
    RdmaMemoryMutableView,
    RdmaMemoryView,
    RdmaRemoteBuffer,
    RdmaTransport,
)

__all__ = [
    "RdmaMemory",
    "RdmaMemoryMutableView",
    "RdmaMemoryView",
    "RdmaRemoteBuffer",
    "RdmaTransport",
]
