# Stubs of torchcomms._transport: the RDMA transfer API, stubbed in _comms.pyi.
from torchcomms._comms import RdmaMemory as RdmaMemory
from torchcomms._comms import RdmaMemoryMutableView as RdmaMemoryMutableView
from torchcomms._comms import RdmaMemoryView as RdmaMemoryView
from torchcomms._comms import RdmaRemoteBuffer as RdmaRemoteBuffer
from torchcomms._comms import RdmaTransport as RdmaTransport

__all__ = [
    "RdmaMemory",
    "RdmaMemoryMutableView",
    "RdmaMemoryView",
    "RdmaRemoteBuffer",
    "RdmaTransport",
]
