from __future__ import annotations

from datetime import timedelta

from torchcomms import functional as functional
from torchcomms import hooks as hooks
from torchcomms import objcol as objcol
from torchcomms._c10d import _BackendWrapper as _BackendWrapper
from torchcomms._comms import (
    BatchP2POptions as BatchP2POptions,
    BatchSendRecv as BatchSendRecv,
    CommOptions as CommOptions,
    CommInternalError as CommInternalError,
    CommTimeoutError as CommTimeoutError,
    CommTypeError as CommTypeError,
    CommValueError as CommValueError,
    OpName as OpName,
    P2POp as P2POp,
    P2POpType as P2POpType,
    RedOpType as RedOpType,
    ReduceOp as ReduceOp,
    ReconfigureOptions as ReconfigureOptions,
    RemovableHandle as RemovableHandle,
    TorchComm as TorchComm,
    TorchCommBackend as TorchCommBackend,
    TorchCommWindow as TorchCommWindow,
    TorchCommWindowAttr as TorchCommWindowAttr,
    TorchCommWinAccessType as TorchCommWinAccessType,
    TorchWork as TorchWork,
    WorkStatus as WorkStatus,
    _is_backend_registered as _is_backend_registered,
    get_mem_allocator as get_mem_allocator,
    new_comm as new_comm,
    register_backend as register_backend,
)

class Timeout(timedelta): ...

__all__: list[str]

def _load_backend(backend: str) -> None: ...
def is_backend_built(backend: str) -> bool: ...
def built_backends() -> list[str]: ...
