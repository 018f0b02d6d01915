"""Bad input: the exception types (each also a RuntimeError, like upstream) and messages that
name the operation, the argument and the rank. Every case fails on every rank before anything
is sent, so the communicator stays usable."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch

import torchcomms
from conftest import RANK, WORLD
from torchcomms import ReduceOp


def test_exception_hierarchy() -> None:
    assert issubclass(torchcomms.CommValueError, ValueError)
    assert issubclass(torchcomms.CommValueError, RuntimeError)
    assert issubclass(torchcomms.CommTimeoutError, TimeoutError)
    assert issubclass(torchcomms.CommTimeoutError, RuntimeError)
    assert issubclass(torchcomms.CommTypeError, TypeError)
    assert issubclass(torchcomms.CommTypeError, RuntimeError)


def test_unsupported_dtype_names_the_dtype(world: Any) -> None:
    with pytest.raises(TypeError, match=r"\[rank \d+\] all_reduce: argument `tensor` has dtype torch.complex64"):
        world.all_reduce(torch.zeros(2, dtype=torch.complex64), ReduceOp.SUM, async_op=False)
    with pytest.raises(TypeError, match="torch.int16"):
        world.broadcast(torch.zeros(2, dtype=torch.int16), 0, async_op=False)


def test_not_a_tensor(world: Any) -> None:
    with pytest.raises(TypeError, match="argument `tensor` must be a torch.Tensor, got list"):
        world.all_reduce([1, 2], ReduceOp.SUM, async_op=False)
    with pytest.raises(TypeError, match=r"tensor_list\[1\]"):
        world.all_gather([torch.empty(1), "x"], torch.ones(1), async_op=False)
    with pytest.raises(TypeError, match="tensor_list"):
        world.all_gather(torch.empty(1), torch.ones(1), async_op=False)


def test_wrong_reduce_op_type(world: Any) -> None:
    with pytest.raises(TypeError, match="argument `op` must be a torchcomms.ReduceOp"):
        world.all_reduce(torch.ones(1), "sum", async_op=False)


def test_async_op_is_required(world: Any) -> None:
    with pytest.raises(TypeError, match="async_op"):
        world.all_reduce(torch.ones(1), ReduceOp.SUM)  # type: ignore[call-arg]


def test_non_contiguous(world: Any) -> None:
    t = torch.ones(4, 4).t()
    with pytest.raises(ValueError, match=r"\[rank \d+\] all_reduce: invalid argument `tensor`: expected a contiguous tensor"):
        world.all_reduce(t, ReduceOp.SUM, async_op=False)


def test_root_out_of_range(world: Any) -> None:
    for bad in (WORLD, -1, 1000):
        with pytest.raises(ValueError, match=rf"root must be in range \[0, {WORLD}\), but got {bad}"):
            world.broadcast(torch.ones(1), bad, async_op=False)
        with pytest.raises(RuntimeError):  # upstream raises RuntimeError: still caught
            world.reduce(torch.ones(1), bad, ReduceOp.SUM, async_op=False)


def test_peer_checks(world: Any) -> None:
    with pytest.raises(ValueError, match=rf"\[rank {RANK}\] send: invalid argument `dst`"):
        world.send(torch.ones(1), RANK, async_op=False)
    with pytest.raises(ValueError, match="src must be in range"):
        world.recv(torch.ones(1), WORLD + 3, async_op=False)


def test_size_mismatches_name_the_argument(world: Any) -> None:
    with pytest.raises(ValueError, match=r"tensor_list\[0\]"):
        world.all_gather([torch.empty(3) for _ in range(WORLD)], torch.ones(2), async_op=False)
    with pytest.raises(ValueError, match="tensor_list.*one per rank"):
        world.all_gather([torch.empty(2)] * (WORLD + 1), torch.ones(2), async_op=False)
    with pytest.raises(ValueError, match="`output`"):
        world.all_gather_single(torch.empty(WORLD * 2 + 1), torch.ones(2), async_op=False)
    with pytest.raises(ValueError, match="`input`"):
        world.reduce_scatter_single(torch.empty(2), torch.ones(WORLD * 2 + 1), ReduceOp.SUM, async_op=False)
    with pytest.raises(ValueError, match="dtype"):
        world.all_gather_single(torch.empty(WORLD, dtype=torch.int32), torch.ones(1), async_op=False)
    with pytest.raises(ValueError, match="output_split_sizes"):
        world.all_to_all_v_single(torch.empty(4), torch.empty(4), [1] * (WORLD + 1), [1] * WORLD, async_op=False)
    with pytest.raises(ValueError, match="split sizes must be >= 0"):
        world.all_to_all_v_single(torch.empty(4), torch.empty(4), [-1] * WORLD, [1] * WORLD, async_op=False)


def test_reduce_op_dtype_mismatch(world: Any) -> None:
    with pytest.raises(ValueError, match="bitwise"):
        world.all_reduce(torch.ones(2), ReduceOp.BAND, async_op=False)
    with pytest.raises(ValueError, match="bool"):
        world.all_reduce(torch.ones(2, dtype=torch.bool), ReduceOp.AVG, async_op=False)
    with pytest.raises(ValueError, match="bool"):
        world.all_reduce(torch.ones(2, dtype=torch.bool), ReduceOp.PREMUL_SUM(2.0), async_op=False)


def test_timeout_argument(world: Any) -> None:
    with pytest.raises(TypeError, match="timeout"):
        world.barrier(async_op=False, timeout="soon")
    with pytest.raises(ValueError, match="timeout"):
        world.barrier(async_op=False, timeout=-1.0)


def test_non_cpu_tensor(world: Any) -> None:
    with pytest.raises(ValueError, match="device meta"):
        world.all_reduce(torch.empty(2, device="meta"), ReduceOp.SUM, async_op=False)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="this machine has CUDA: bindings/python/gpu_tests cover CUDA devices"
)
def test_cuda_device_without_cuda_is_rejected_naming_it() -> None:
    with pytest.raises(NotImplementedError, match="cuda:0"):
        torchcomms.new_comm("ctran", torch.device("cuda", 0), "cuda_comm")
    with pytest.raises(NotImplementedError, match="cuda:3"):
        torchcomms.new_comm("ctran", "cuda:3", "cuda_comm")


def test_unknown_device_type_is_rejected() -> None:
    with pytest.raises(ValueError, match="device"):
        torchcomms.new_comm("ctran", "tpu", "tpu_comm")


def test_unknown_backend() -> None:
    with pytest.raises(ModuleNotFoundError, match="failed to find backend nope, is it registered via entry_points.txt"):
        torchcomms.new_comm("nope", "cpu", "x")


def test_bad_environment(monkeypatch: Any) -> None:
    monkeypatch.setenv("TORCHCOMM_ABORT_ON_ERROR", "perhaps")
    with pytest.raises(ValueError, match="TORCHCOMM_ABORT_ON_ERROR"):
        torchcomms.CommOptions()
    monkeypatch.setenv("TORCHCOMM_ABORT_ON_ERROR", "n")
    assert torchcomms.CommOptions().abort_process_on_timeout_or_error is False
    monkeypatch.setenv("TORCHCOMM_ABORT_ON_ERROR", "YES")
    assert torchcomms.CommOptions().abort_process_on_timeout_or_error is True
    monkeypatch.setenv("TORCHCOMM_TIMEOUT_SECONDS", "12.5")
    assert torchcomms.CommOptions().timeout == timedelta(seconds=12.5)
    monkeypatch.setenv("TORCHCOMM_TIMEOUT_SECONDS", "never")
    with pytest.raises(ValueError, match="TORCHCOMM_TIMEOUT_SECONDS"):
        torchcomms.CommOptions()


def test_ops_after_finalize_raise(world: Any) -> None:
    comm = world.split(list(range(WORLD)), "finalized")
    comm.finalize()
    comm.finalize()  # a second finalize does nothing
    with pytest.raises(RuntimeError, match="after finalize"):
        comm.all_reduce(torch.ones(1), ReduceOp.SUM, async_op=False)
    with pytest.raises(RuntimeError, match="after finalize"):
        comm.barrier(async_op=True)


def test_unimplemented_features_raise_with_upstream_text(world: Any) -> None:
    for call, what in [
        (lambda: world.get_init_handle(), "getInitHandle"),
        (lambda: world.reconfigure(0, []), "reconfigure"),
    ]:
        with pytest.raises(RuntimeError, match=rf"\[TorchCommBackend\]: {what} not implemented for communicator:pytest_world"):
            call()
    with pytest.raises(RuntimeError, match="No allocator factory registered for backend: ctran"):
        world.get_mem_allocator()
    with pytest.raises(RuntimeError, match="No allocator factory registered for backend: gloo"):
        torchcomms._comms.get_mem_allocator("gloo")


def test_errors_leave_the_comm_usable(world: Any) -> None:
    t = torch.ones(3)
    world.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert torch.all(t == WORLD)
