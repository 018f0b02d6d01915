# Type stubs of the compiled module torchcomms._comms (bindings/python/src).
from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Callable, ClassVar, Optional, Sequence, Union

import torch

_Timeout = Optional[Union[timedelta, float]]
_Hints = Optional[dict[str, str]]
_Device = Union[torch.device, str, int]

__version__: str

class CommValueError(ValueError, RuntimeError): ...
class CommTimeoutError(TimeoutError, RuntimeError): ...
class CommTypeError(TypeError, RuntimeError): ...
class CommInternalError(RuntimeError): ...

class RedOpType:
    SUM: ClassVar[RedOpType]
    PRODUCT: ClassVar[RedOpType]
    MIN: ClassVar[RedOpType]
    MAX: ClassVar[RedOpType]
    BAND: ClassVar[RedOpType]
    BOR: ClassVar[RedOpType]
    BXOR: ClassVar[RedOpType]
    PREMUL_SUM: ClassVar[RedOpType]
    AVG: ClassVar[RedOpType]
    __members__: ClassVar[dict[str, RedOpType]]
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    def __int__(self) -> int: ...

class WorkStatus:
    NOT_STARTED: ClassVar[WorkStatus]
    INPROGRESS: ClassVar[WorkStatus]
    COMPLETED: ClassVar[WorkStatus]
    TIMEDOUT: ClassVar[WorkStatus]
    ERROR: ClassVar[WorkStatus]
    __members__: ClassVar[dict[str, WorkStatus]]
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class P2POpType:
    SEND: ClassVar[P2POpType]
    RECV: ClassVar[P2POpType]
    __members__: ClassVar[dict[str, P2POpType]]
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class TorchCommWinAccessType:
    WIN_ACCESS_TYPE_UNIFIED: ClassVar[TorchCommWinAccessType]
    WIN_ACCESS_TYPE_SEPARATE: ClassVar[TorchCommWinAccessType]
    __members__: ClassVar[dict[str, TorchCommWinAccessType]]
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class OpName:
    # BEGIN GENERATED from the table of operations (torchcomms_core::ops); TORCHCOMMS_BLESS=1 cargo test -p torchcomms-python --test stubs rewrites it
    send: ClassVar[OpName]
    recv: ClassVar[OpName]
    broadcast: ClassVar[OpName]
    all_reduce: ClassVar[OpName]
    reduce: ClassVar[OpName]
    all_gather: ClassVar[OpName]
    all_gather_v: ClassVar[OpName]
    all_gather_single: ClassVar[OpName]
    reduce_scatter: ClassVar[OpName]
    reduce_scatter_v: ClassVar[OpName]
    reduce_scatter_single: ClassVar[OpName]
    all_to_all_single: ClassVar[OpName]
    all_to_all_v_single: ClassVar[OpName]
    all_to_all: ClassVar[OpName]
    barrier: ClassVar[OpName]
    scatter: ClassVar[OpName]
    gather: ClassVar[OpName]
    gather_single: ClassVar[OpName]
    all_gather_p_exec: ClassVar[OpName]
    device_alltoallv_single: ClassVar[OpName]
    # END GENERATED
    split: ClassVar[OpName]
    new_window: ClassVar[OpName]
    finalize: ClassVar[OpName]
    batch_op_issue: ClassVar[OpName]
    __members__: ClassVar[dict[str, OpName]]
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class ReduceOp:
    SUM: ClassVar[ReduceOp]
    PRODUCT: ClassVar[ReduceOp]
    MIN: ClassVar[ReduceOp]
    MAX: ClassVar[ReduceOp]
    BAND: ClassVar[ReduceOp]
    BOR: ClassVar[ReduceOp]
    BXOR: ClassVar[ReduceOp]
    AVG: ClassVar[ReduceOp]
    def __init__(self, opType: RedOpType) -> None: ...
    @staticmethod
    def PREMUL_SUM(factor: Union[float, torch.Tensor]) -> ReduceOp: ...
    @property
    def type(self) -> RedOpType: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    def __copy__(self) -> ReduceOp: ...
    def __deepcopy__(self, memo: Any) -> ReduceOp: ...

class CommOptions:
    abort_process_on_timeout_or_error: bool
    timeout: timedelta
    store: Optional[Any]
    enable_reconfigure: bool
    hints: dict[str, str]
    is_high_priority_stream: bool
    def __init__(self) -> None: ...

class BatchP2POptions:
    hints: dict[str, str]
    timeout: timedelta
    def __init__(self) -> None: ...

class ReconfigureOptions:
    uuid: int
    init_handles: Optional[Union[list[str], set[str]]]
    timeout: Optional[timedelta]
    hints: dict[str, str]
    def __init__(
        self,
        uuid: int = ...,
        init_handles: Optional[Union[list[str], set[str]]] = ...,
        timeout: _Timeout = ...,
        hints: _Hints = ...,
    ) -> None: ...

class RemovableHandle:
    def remove(self) -> None: ...

class TorchWork:
    def wait(self) -> None: ...
    def wait_blocking(self) -> None: ...
    def is_completed(self) -> bool: ...
    def _set_status(self, status: WorkStatus) -> None: ...
    def _status(self) -> WorkStatus: ...
    def _add_wait_callbacks(self, before: Callable[[], None], after: Callable[[], None]) -> None: ...
    def _add_done_callback(self, callback: Callable[[Optional[BaseException]], None]) -> None: ...

class P2POp:
    type: P2POpType
    tensor: torch.Tensor
    peer: int
    def __init__(self, type: P2POpType, tensor: torch.Tensor, peer: int) -> None: ...

class BatchSendRecv:
    ops: list[P2POp]
    def send(self, tensor: torch.Tensor, dst: int) -> None: ...
    def recv(self, tensor: torch.Tensor, src: int) -> None: ...
    def issue(self, async_op: bool, options: Optional[BatchP2POptions] = ...) -> TorchWork: ...

class TorchCommWindowAttr:
    access_type: TorchCommWinAccessType
    def __init__(self) -> None: ...

class RegisteredBuffer:
    ptr: int
    size: int
    tensor: torch.Tensor

class TorchCommWindow:
    def tensor_register(self, tensor: torch.Tensor, owning: bool = True) -> None: ...
    def tensor_deregister(self) -> None: ...
    def put(
        self,
        tensor: torch.Tensor,
        dst_rank: int,
        target_offset_nelems: int,
        async_op: bool,
        hints: Optional[dict[str, str]] = None,
        timeout: Optional[timedelta] = None,
    ) -> TorchWork: ...
    def signal(
        self,
        peer_rank: int,
        async_op: bool,
        hints: Optional[dict[str, str]] = None,
        timeout: Optional[timedelta] = None,
    ) -> TorchWork: ...
    def wait_signal(
        self,
        peer_rank: int,
        async_op: bool,
        hints: Optional[dict[str, str]] = None,
        timeout: Optional[timedelta] = None,
    ) -> TorchWork: ...
    def get_attr(self, peer_rank: int) -> TorchCommWindowAttr: ...
    def map_remote_tensor(self, rank: int) -> torch.Tensor: ...
    def get_size(self) -> int: ...
    def get_tensor(self) -> Optional[torch.Tensor]: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def shape(self) -> torch.Size: ...
    @property
    def device(self) -> torch.device: ...
    def register_local_buffer(self, tensor: torch.Tensor) -> RegisteredBuffer: ...
    def deregister_local_buffer(self, buffer: RegisteredBuffer) -> None: ...

class AllGatherPHandle:
    @property
    def output(self) -> torch.Tensor: ...
    @property
    def uses_window(self) -> bool: ...

class _MoeHandle:
    @property
    def num_tokens(self) -> int: ...
    def row_sources(self) -> list[tuple[int, int, int]]: ...

class _MoeBuffer:
    @staticmethod
    def buffer_specs(
        num_experts: int, hidden: int, max_tokens_per_rank: int, top_k: int, mode: str, size: int
    ) -> list[tuple[str, str, int]]: ...
    def __init__(
        self,
        comm: TorchComm,
        num_experts: int,
        hidden: int,
        max_tokens_per_rank: int,
        top_k: int,
        mode: str,
        buffers: Sequence[torch.Tensor],
    ) -> None: ...
    @property
    def is_mapped(self) -> bool: ...
    def check(self) -> None: ...
    def dispatch(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, use_fp8: bool
    ) -> tuple[Optional[list[int]], _MoeHandle]: ...
    def combine(self, expert_out: torch.Tensor, handle: _MoeHandle, out: torch.Tensor) -> None: ...

class TorchCommBackend:
    def __init__(self, *args: Any, **kwargs: Any) -> None: ...

# Hook arguments (read-only; fields are the caller's own objects).
# BEGIN GENERATED from the table of operations (torchcomms_core::ops); TORCHCOMMS_BLESS=1 cargo test -p torchcomms-python --test stubs rewrites it
class SendPreHookArgs:
    tensor: torch.Tensor
    peer: int
    async_op: bool

class RecvPreHookArgs:
    tensor: torch.Tensor
    peer: int
    async_op: bool

class BroadcastPreHookArgs:
    tensor: torch.Tensor
    root: int
    async_op: bool

class AllReducePreHookArgs:
    tensor: torch.Tensor
    async_op: bool

class ReducePreHookArgs:
    tensor: torch.Tensor
    root: int
    async_op: bool

class AllGatherPreHookArgs:
    input: torch.Tensor
    output: list[torch.Tensor]
    async_op: bool

class AllGatherVPreHookArgs:
    input: torch.Tensor
    output: list[torch.Tensor]
    async_op: bool

class AllGatherSinglePreHookArgs:
    input: torch.Tensor
    output: torch.Tensor
    async_op: bool

class ReduceScatterPreHookArgs:
    input: list[torch.Tensor]
    output: torch.Tensor
    async_op: bool

class ReduceScatterVPreHookArgs:
    input: list[torch.Tensor]
    output: torch.Tensor
    async_op: bool

class ReduceScatterSinglePreHookArgs:
    input: torch.Tensor
    output: torch.Tensor
    async_op: bool

class AllToAllSinglePreHookArgs:
    input: torch.Tensor
    output: torch.Tensor
    async_op: bool

class AllToAllVSinglePreHookArgs:
    input: torch.Tensor
    output: torch.Tensor
    input_split_sizes: list[int]
    output_split_sizes: list[int]
    async_op: bool

class AllToAllPreHookArgs:
    input: list[torch.Tensor]
    output: list[torch.Tensor]
    async_op: bool

class BarrierPreHookArgs:
    async_op: bool

class ScatterPreHookArgs:
    output: torch.Tensor
    input: list[torch.Tensor]
    root: int
    async_op: bool

class GatherPreHookArgs:
    input: torch.Tensor
    output: list[torch.Tensor]
    root: int
    async_op: bool

class GatherSinglePreHookArgs:
    input: torch.Tensor
    output: torch.Tensor
    root: int
    async_op: bool

class AllGatherPExecPreHookArgs:
    handle: AllGatherPHandle
    input: torch.Tensor
    async_op: bool

class DeviceAlltoallvSinglePreHookArgs:
    input: torch.Tensor
    output: torch.Tensor
    input_split_sizes: torch.Tensor
    output_split_sizes: torch.Tensor
    async_op: bool

# END GENERATED
class SplitPreHookArgs:
    ranks: list[int]
    name: str

class NewWindowPreHookArgs: ...

class BatchOpIssuePreHookArgs:
    num_ops: int
    async_op: bool

class FinalizePreHookArgs: ...
class CollectivePostHookArgs: ...
class SplitPostHookArgs: ...
class NewWindowPostHookArgs: ...
class BatchOpIssuePostHookArgs: ...
class FinalizePostHookArgs: ...

PreHook = Callable[[OpName, int, Any], None]
PostHook = Callable[[int, Any], None]

class TorchComm:
    # accessors
    def get_rank(self) -> int: ...
    def get_size(self) -> int: ...
    def get_name(self) -> str: ...
    def get_options(self) -> CommOptions: ...
    def get_device(self) -> torch.device: ...
    def get_backend(self) -> str: ...
    def get_backend_version(self) -> str: ...
    def get_backend_impl(self) -> Any: ...
    def unsafe_get_backend(self) -> Any: ...
    def get_init_handle(self) -> str: ...
    def get_mem_allocator(self) -> Any: ...
    @property
    def mem_allocator(self) -> Any: ...
    def get_device_transport(self) -> int: ...
    # lifecycle
    def finalize(self) -> None: ...
    def abort(self) -> None: ...
    def is_abort_supported(self) -> bool: ...
    def is_aborted(self) -> bool: ...
    def dump_trace(self, dir: Optional[Union[str, os.PathLike[str]]] = None) -> str: ...
    def reconfigure(
        self,
        uuid: int,
        init_handles: Union[list[str], set[str]],
        timeout: _Timeout = None,
        hints: _Hints = None,
    ) -> TorchWork: ...
    def set_timeout(self, timeout: timedelta) -> None: ...
    def set_hints(self, hints: dict[str, str]) -> None: ...
    def tensor_register(self, tensor: torch.Tensor) -> None: ...
    def tensor_deregister(self, tensor: torch.Tensor) -> None: ...
    def register_pre_hook(self, callback: PreHook) -> RemovableHandle: ...
    def register_post_hook(self, callback: PostHook) -> RemovableHandle: ...
    def register_abort_hook(self, callback: Callable[[], None]) -> RemovableHandle: ...
    def __copy__(self) -> TorchComm: ...
    def __deepcopy__(self, memo: Any) -> TorchComm: ...
    # operations
    # BEGIN GENERATED from the table of operations (torchcomms_core::ops); TORCHCOMMS_BLESS=1 cargo test -p torchcomms-python --test stubs rewrites it
    def send(self, tensor: torch.Tensor, dst: int, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def recv(self, tensor: torch.Tensor, src: int, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def broadcast(self, tensor: torch.Tensor, root: int, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def reduce(self, tensor: torch.Tensor, root: int, op: ReduceOp, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def all_gather(self, tensor_list: Sequence[torch.Tensor], tensor: torch.Tensor, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def all_gather_v(self, tensor_list: Sequence[torch.Tensor], tensor: torch.Tensor, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def reduce_scatter(self, output: torch.Tensor, input_list: Sequence[torch.Tensor], op: ReduceOp, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def reduce_scatter_v(self, output: torch.Tensor, input_list: Sequence[torch.Tensor], op: ReduceOp, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, op: ReduceOp, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def all_to_all_v_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int], input_split_sizes: Sequence[int], async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def all_to_all(self, output_tensor_list: Sequence[torch.Tensor], input_tensor_list: Sequence[torch.Tensor], async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def barrier(self, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def scatter(self, output_tensor: torch.Tensor, input_tensor_list: Sequence[torch.Tensor], root: int, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def gather(self, output_tensor_list: Sequence[torch.Tensor], input_tensor: torch.Tensor, root: int, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def gather_single(self, output: torch.Tensor, input: torch.Tensor, root: int, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def all_gather_p_exec(self, handle: AllGatherPHandle, input: torch.Tensor, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def device_alltoallv_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: torch.Tensor, input_split_sizes: torch.Tensor, async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    # END GENERATED
    # management
    def split(self, ranks: Sequence[int], name: str, hints: _Hints = None, timeout: _Timeout = None) -> Optional[TorchComm]: ...
    def batch_op_create(self) -> BatchSendRecv: ...
    def new_window(self, tensor: Optional[torch.Tensor] = None) -> TorchCommWindow: ...
    def all_gather_p_init(self, output: torch.Tensor, hints: _Hints = None, timeout: _Timeout = None) -> AllGatherPHandle: ...
    def all_gather_p_free(self, handle: AllGatherPHandle) -> None: ...

def new_comm(
    backend: str,
    device: _Device,
    name: str,
    abort_process_on_timeout_or_error: Optional[bool] = None,
    timeout: _Timeout = None,
    is_high_priority_stream: Optional[bool] = None,
    store: Optional[Any] = None,
    enable_reconfigure: Optional[bool] = False,
    hints: _Hints = None,
) -> TorchComm: ...
def register_backend(name: str, backend_class: type) -> None: ...
def _is_backend_registered(name: str) -> bool: ...
def _registered_backends() -> list[str]: ...
def get_mem_allocator(backend: str) -> Any: ...
def _reset_op_id_counter() -> None: ...
def _peek_next_op_id() -> int: ...
def _colltrace_snapshot() -> str: ...
def _panic_for_test(message: str) -> None: ...
def _cvar(name: str) -> Union[bool, int, float, str, list[str], None]: ...
def _health_check() -> bool: ...
def _cuda_bytes_held() -> tuple[int, int]: ...

_ENGINE_VERSION: str

class _HooksFr:
    FlightRecorderHook: type

class _HooksClog:
    clog: type

class _Hooks:
    fr: _HooksFr
    clog: _HooksClog

# Upstream's C++ submodules torchcomms._comms.hooks.{fr,clog}; here aliases of torchcomms.hooks.
hooks: _Hooks
# Set by the package where torch takes Python c10d backends (torch >= 2.14; torch.distributed looks
# for it here): torchcomms._c10d._BackendWrapper.
_BackendWrapper: type

# The nccl backend (bindings/python/src/lib.rs): where libnccl was found, or why not.
def _nccl_info() -> str: ...

# The RDMA transfer API (bindings/python/src/rdma.rs), re-exported by torchcomms._transport.
class RdmaMemoryView:
    def size(self) -> int: ...

class RdmaMemoryMutableView:
    def size(self) -> int: ...

class RdmaRemoteBuffer:
    def __init__(self, ptr: int, len: int, access_key: str) -> None: ...
    @property
    def ptr(self) -> int: ...
    @property
    def len(self) -> int: ...
    @property
    def access_key(self) -> str: ...
    def __getstate__(self) -> tuple[int, int, str]: ...

class RdmaMemory:
    def __init__(self, tensor: torch.Tensor) -> None: ...
    def to_view(self, offset: Optional[int] = None, length: Optional[int] = None) -> RdmaMemoryView: ...
    def to_mutable_view(
        self, offset: Optional[int] = None, length: Optional[int] = None
    ) -> RdmaMemoryMutableView: ...
    def to_remote_buffer(self) -> RdmaRemoteBuffer: ...
    def reused_registration(self) -> bool: ...
    def size(self) -> int: ...

class RdmaTransport:
    def __init__(self, device: torch.device) -> None: ...
    @staticmethod
    def supported() -> bool: ...
    def bind(self) -> bytes: ...
    def connect(self, peer_url: bytes) -> int: ...
    def connected(self) -> bool: ...
    def write(
        self, local: RdmaMemoryView, remote: RdmaRemoteBuffer, notify: bool = False, timeout: _Timeout = None
    ) -> int: ...
    def read(self, local: RdmaMemoryMutableView, remote: RdmaRemoteBuffer, timeout: _Timeout = None) -> int: ...
    def wait_for_write(self, timeout: _Timeout = None) -> None: ...
