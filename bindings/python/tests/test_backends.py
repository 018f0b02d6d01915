"""Backend discovery (§2) and the `fake` backend upstream ships for testing; per-communicator
settings (`set_timeout`, `set_hints`) and `reconfigure` (§7)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
import torch

import torchcomms
from conftest import WORLD, need_ranks
from torchcomms import ReduceOp
from torchcomms._comms import OpName


def test_fake_is_an_installed_backend() -> None:
    assert torchcomms.is_backend_built("fake"), "install the package (pip install ./bindings/python)"
    assert {"fake", "ctran"} <= set(torchcomms.built_backends())
    torchcomms._load_backend("fake")  # the entry point imports torchcomms._comms
    assert torchcomms._is_backend_registered("fake")


def test_fake_needs_no_launcher() -> None:
    """Upstream's unit tests create fake communicators in a plain process: no rank, no store."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MASTER_", "RANK", "WORLD_SIZE", "LOCAL_", "TORCHELASTIC_", "GROUP_", "ROLE_", "TORCHCOMM_RANK", "TORCHCOMM_SIZE"))
    }
    code = (
        "import torch, torchcomms\n"
        "c = torchcomms.new_comm('fake', torch.device('cpu'), name='plain')\n"
        "assert (c.get_rank(), c.get_size()) == (0, 1)\n"
        "c.all_reduce(torch.ones(3), torchcomms.ReduceOp.SUM, async_op=False)\n"
        "c.finalize()\n"
        "print('FAKE_OK')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "FAKE_OK" in out.stdout, out.stdout + out.stderr


def test_fake_ops_complete_and_run_hooks() -> None:
    comm = torchcomms.new_comm("fake", torch.device("cpu"), name="fake_ops")
    assert comm.get_backend() == "fake" and comm.get_backend_version().startswith("fake ")
    assert (comm.get_rank(), comm.get_size(), comm.get_name()) == (0, 1, "fake_ops")
    seen: list[tuple[Any, int]] = []
    comm.register_pre_hook(lambda name, op_id, args: seen.append((name, op_id)))
    t = torch.arange(4.0)
    works = [
        comm.all_reduce(t, ReduceOp.SUM, async_op=True),
        comm.broadcast(t, 0, async_op=True),
        comm.reduce(t, 0, ReduceOp.MAX, async_op=False),
        comm.all_gather([torch.empty(4)], t, async_op=True),
        comm.all_gather_single(torch.empty(4), t, async_op=True),
        comm.reduce_scatter(torch.empty(4), [t], ReduceOp.SUM, async_op=True),
        comm.reduce_scatter_single(torch.empty(4), t, ReduceOp.SUM, async_op=True),
        comm.all_to_all_single(torch.empty(4), t, async_op=True),
        comm.all_to_all_v_single(torch.empty(4), t, [4], [4], async_op=True),
        comm.all_to_all([torch.empty(4)], [t], async_op=True),
        comm.barrier(async_op=True),
        comm.scatter(torch.empty(4), [t], 0, async_op=True),
        comm.gather([torch.empty(4)], t, 0, async_op=True),
    ]
    assert all(w.is_completed() for w in works)
    for w in works:
        w.wait()
    assert torch.equal(t, torch.arange(4.0))  # the fake moves no data
    assert [n for n, _ in seen][:2] == [OpName.all_reduce, OpName.broadcast]
    ids = [i for _, i in seen]
    assert ids == sorted(ids) and len(set(ids)) == len(works)
    # The API's argument checks still apply.
    with pytest.raises(ValueError, match="root"):
        comm.broadcast(t, 1, async_op=False)
    child = comm.split([0], "fake_child")
    assert child is not None and child.get_backend() == "fake" and child.get_name() == "fake_child"
    assert comm.split([], "nobody") is None
    child.finalize()
    comm.finalize()


def test_reconfigure_only_where_supported() -> None:
    comm = torchcomms.new_comm("fake", "cpu", name="fake_reconf", enable_reconfigure=True)
    assert comm.get_options().enable_reconfigure
    w = comm.reconfigure(uuid=7, init_handles=["a", "b"], timeout=timedelta(seconds=5))
    assert w.is_completed()
    comm.reconfigure(8, {"a"})
    with pytest.raises(TypeError, match="init_handles"):
        comm.reconfigure(9, "abc")
    comm.finalize()
    # ctran reconfigures (test_reconfigure.py), through a store that outlives every rank.
    saved = os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    try:
        with pytest.raises(ValueError, match="argument `store`: expected a store that outlives every rank"):
            torchcomms.new_comm("ctran", "cpu", name="never", enable_reconfigure=True)
    finally:
        if saved is not None:
            os.environ["TORCHELASTIC_USE_AGENT_STORE"] = saved
    plain = torchcomms.new_comm("fake", "cpu", name="fake_plain")
    with pytest.raises(NotImplementedError, match="reconfigure not implemented for communicator:fake_plain"):
        plain.reconfigure(1, ["a"])
    plain.finalize()


def test_unknown_backend_names_the_entry_point_group() -> None:
    with pytest.raises(ModuleNotFoundError, match="failed to find backend nonesuch, is it registered via entry_points.txt"):
        torchcomms.new_comm("nonesuch", "cpu", name="x")


def test_set_timeout_and_hints_reach_the_engine(fresh: Any) -> None:
    comm = fresh("settings")
    comm.set_timeout(timedelta(seconds=77))
    assert comm.get_options().timeout == timedelta(seconds=77)
    with pytest.raises(TypeError, match="timeout"):
        comm.set_timeout("soon")
    comm.set_hints({"algo": "not-an-algorithm"})
    assert comm.get_options().hints == {"algo": "not-an-algorithm"}
    if WORLD > 1:
        # The engine sees the communicator's hints: it refuses the unknown algorithm, naming it.
        with pytest.raises(ValueError, match="algo.*not-an-algorithm"):
            comm.all_reduce(torch.ones(8), ReduceOp.SUM, async_op=False)
        # An operation's own hint wins over the communicator's.
        t = torch.ones(8)
        comm.all_reduce(t, ReduceOp.SUM, async_op=False, hints={"algo": "auto"})
        assert torch.all(t == WORLD)
    comm.set_hints({})
    t = torch.ones(8)
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert torch.all(t == WORLD)
    with pytest.raises(TypeError, match="hints"):
        comm.set_hints(["algo"])


def test_set_hints_picks_the_algorithm(fresh: Any) -> None:
    """With `set_hints({"algo": "ring"})`, the engine runs ring (the flight recorder reads the
    engine's record of the operation)."""
    need_ranks(2)
    from torchcomms.hooks import FlightRecorderHook

    comm = fresh("hint_algo")
    fr = FlightRecorderHook(isolated=True)
    fr.register_with_comm(comm)
    comm.set_hints({"algo": "ring"})
    comm.all_reduce(torch.ones(1 << 12), ReduceOp.SUM, async_op=False)
    comm.set_hints({"algo": "direct"})
    comm.all_reduce(torch.ones(1 << 12), ReduceOp.SUM, async_op=False)
    import json

    algos = [e["algorithm"] for e in json.loads(fr.dump_json())["entries"]]
    assert algos == ["ring", "direct"], algos


def test_entry_point_that_registers_nothing(tmp_path: Any, monkeypatch: Any) -> None:
    """An installed entry point whose module registers no factory: upstream then looks at
    TORCHCOMMS_BACKEND_LIB_PATH_<B> (§2.3). Unset, its message; set, we name the library we
    cannot load (upstream's loader hands back C++ objects)."""
    dist = tmp_path / "dynbackend-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: dynbackend\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[torchcomms.backends]\ndyn_test = json\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert torchcomms.is_backend_built("dyn_test")
    monkeypatch.delenv("TORCHCOMMS_BACKEND_LIB_PATH_DYN_TEST", raising=False)
    with pytest.raises(RuntimeError, match="Backend dyn_test specified, but TORCHCOMMS_BACKEND_LIB_PATH_DYN_TEST not set"):
        torchcomms.new_comm("dyn_test", "cpu", name="dyn")
    monkeypatch.setenv("TORCHCOMMS_BACKEND_LIB_PATH_DYN_TEST", "/opt/libdyn.so")
    with pytest.raises(NotImplementedError, match="TORCHCOMMS_BACKEND_LIB_PATH_DYN_TEST=/opt/libdyn.so.*create_dynamic_loader_dyn_test"):
        torchcomms.new_comm("dyn_test", "cpu", name="dyn")


def test_ib_in_ctran_backends_keeps_collectives_working(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ib` in CTRAN_BACKENDS: peers go through ib where both ranks open an RDMA device, else
    over TCP (a machine without one: the verbs provider opens nothing). Either way the
    results are right."""
    monkeypatch.setenv("CTRAN_BACKENDS", "socket,ib")
    c = torchcomms.new_comm(
        "ctran", torch.device("cpu"), "ib_backends", timeout=timedelta(seconds=60),
        abort_process_on_timeout_or_error=False,
    )
    try:
        t = torch.full((1 << 16,), float(c.get_rank() + 1))
        c.all_reduce(t, ReduceOp.SUM, async_op=False)
        assert torch.equal(t, torch.full((1 << 16,), float(WORLD * (WORLD + 1) // 2)))
    finally:
        c.finalize()


def test_soft_ib_between_processes_fails_init_on_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """The software fabric reaches only ranks that are threads of one process: ranks in
    separate processes fail at set-up, each saying why, instead of writing anywhere."""
    need_ranks(2)
    monkeypatch.setenv("CTRAN_BACKENDS", "socket,ib")
    monkeypatch.setenv("CTRAN_IB_PROVIDER", "soft")
    with pytest.raises(RuntimeError, match="threads of one process"):
        torchcomms.new_comm(
            "ctran", torch.device("cpu"), "ib_soft_procs", timeout=timedelta(seconds=30),
            abort_process_on_timeout_or_error=False,
        )
