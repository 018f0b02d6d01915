"""One process of the recovery job that test_z_recovery.py launches: data-parallel training of
a small model on ctran with `enable_reconfigure=True`, through a torch TCPStore the test serves.

    recovery_job.py [--cuda] train RANK WORLD PORT OUT KILL_RANK KILL_STEP GROW_STEP
    recovery_job.py join PORT OUT GPU                # a new process that joins at GROW_STEP
    recovery_job.py resume RANK WORLD PORT OUT START END PARAMS   # a reference run of steps START..END

It is the recipe of the README: on an error, every survivor registers under the next
generation, the lowest registered old rank closes the membership once nobody new arrived for
a short window, and everyone reconfigures onto the survivors' handles and redoes the step.
Each process writes one JSON line to OUT.<id>: its final parameters and timings. With
``--cuda`` the communicators and tensors are on GPUs (process i on GPU i modulo the count).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
from torch.distributed import TCPStore

import torchcomms

STEPS = 10
T = timedelta(seconds=30)
QUORUM_WINDOW_S = 0.3
DEVICE = torch.device("cpu")


def comm_device(index: int) -> torch.device:
    if DEVICE.type == "cuda":
        return torch.device("cuda", index % torch.cuda.device_count())
    return DEVICE


def batch(step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of member `index` at `step`: the same in every run."""
    g = torch.Generator().manual_seed(1000 * step + index)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def initial_params(device: torch.device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(16, 4, generator=g).to(device), torch.randn(4, generator=g).to(device)]


def step_on(comm, params: list[torch.Tensor], step: int) -> list[torch.Tensor]:
    """One synchronous data-parallel SGD step; raises if the communicator fails."""
    x, y = (t.to(params[0].device) for t in batch(step, comm.get_rank()))
    w, b = (p.clone().requires_grad_(True) for p in params)
    loss = ((x @ w + b - y) ** 2).mean()
    loss.backward()
    grads = torch.cat([w.grad.flatten(), b.grad.flatten()])
    # wait_blocking() returns once the all-reduce ended on the device, and raises if it failed:
    # on a GPU a plain wait() only orders the stream, and a failure would surface at a later
    # call, after a bad update (commit a step only once its collectives are known to be good).
    comm.all_reduce(grads, torchcomms.ReduceOp.SUM, async_op=True).wait_blocking()
    grads /= comm.get_size()
    gw, gb = grads[: w.numel()].view_as(w), grads[w.numel():]
    return [params[0] - 0.1 * gw, params[1] - 0.1 * gb]


def membership(store: TCPStore, gen: int, me: str, old_rank: int) -> list[str]:
    """The next generation's handles: every process that registers before the window closes."""
    n = store.add(f"gen{gen}/count", 1)
    store.set(f"gen{gen}/member/{n}", f"{old_rank} {me}")
    if n == 1:
        # The first to register closes the membership once nobody new came for a window.
        last, seen = time.monotonic(), 1
        while time.monotonic() - last < QUORUM_WINDOW_S:
            time.sleep(0.02)
            now = store.add(f"gen{gen}/count", 0)
            if now != seen:
                last, seen = time.monotonic(), now
        members = [store.get(f"gen{gen}/member/{i}").decode().split(" ", 1) for i in range(1, seen + 1)]
        handles = [h for _, h in sorted(members, key=lambda m: int(m[0]))]
        store.set(f"gen{gen}/members", json.dumps(handles))
    return json.loads(store.get(f"gen{gen}/members"))


def train(args: list[str]) -> None:
    rank, world, port, out = int(args[0]), int(args[1]), int(args[2]), args[3]
    kill_rank, kill_step, grow_step = int(args[4]), int(args[5]), int(args[6])
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=T)
    dev = comm_device(rank)
    comm = torchcomms.new_comm("ctran", dev, "recovery", enable_reconfigure=True, store=store, timeout=T,
                                 abort_process_on_timeout_or_error=False)
    me = comm.get_init_handle()
    store.set(f"gen0/{rank}", me)
    comm.reconfigure(uuid=0, init_handles=[store.get(f"gen0/{r}").decode() for r in range(world)], timeout=T).wait()
    params, gen, step, timings = initial_params(dev), 0, 0, {}
    members = []
    while step < STEPS:
        if step == kill_step and rank == kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == grow_step:
            # A new process asked to join: everyone forms the larger group, and the newcomer
            # gets the parameters from rank 0.
            torch.save([p.cpu() for p in params], f"{out}.grow{step}.{rank}")
            joiner = store.get("join/handle").decode()
            gen += 1
            if comm.get_rank() == 0:
                store.set("join/members", json.dumps(members + [joiner]))
                store.set("join/uuid", str(gen))
                store.set("join/step", str(step))
            comm.reconfigure(uuid=gen, init_handles=json.loads(store.get("join/members")), timeout=T).wait()
            flat = torch.cat([p.flatten() for p in params])
            comm.broadcast(flat, root=0, async_op=False)
        try:
            new = step_on(comm, params, step)
        except Exception as e:  # noqa: BLE001 - any failure of a collective is a lost peer here
            t_err = time.monotonic()
            torch.save([p.cpu() for p in params], f"{out}.start{step}.{rank}")
            gen += 1
            members = membership(store, gen, me, rank)
            comm.reconfigure(uuid=gen, init_handles=members, timeout=T).wait()
            new = step_on(comm, params, step)
            timings.update(error=str(e)[:300], recovered_s=time.monotonic() - t_err,
                           failed_step=step, size_after=comm.get_size())
        params, step = new, step + 1
    timings["final_size"] = comm.get_size()
    comm.finalize()
    del comm
    report(out, f"train{rank}", params, timings)


def join(args: list[str]) -> None:
    port, out, gpu = int(args[0]), args[1], int(args[2])
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    dev = comm_device(gpu)
    comm = torchcomms.new_comm("ctran", dev, "recovery", enable_reconfigure=True, store=store, timeout=T,
                                 abort_process_on_timeout_or_error=False)
    store.set("join/handle", comm.get_init_handle())
    members = json.loads(store.get("join/members"))
    comm.reconfigure(uuid=int(store.get("join/uuid")), init_handles=members, timeout=T).wait()
    flat = torch.zeros(16 * 4 + 4, device=dev)
    comm.broadcast(flat, root=0, async_op=False)
    params = [flat[:64].view(16, 4).clone(), flat[64:].clone()]
    step = int(store.get("join/step"))
    while step < STEPS:
        params, step = step_on(comm, params, step), step + 1
    final_size = comm.get_size()
    comm.finalize()
    del comm
    report(out, "join", params, dict(final_size=final_size))


def resume(args: list[str]) -> None:
    rank, world, port, out = int(args[0]), int(args[1]), int(args[2]), args[3]
    start, end, saved = int(args[4]), int(args[5]), args[6]
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=T)
    dev = comm_device(rank)
    comm = torchcomms.new_comm("ctran", dev, "reference", store=store, timeout=T)
    assert comm.get_size() == world
    params = [p.to(dev) for p in torch.load(saved)]
    for step in range(start, end):
        params = step_on(comm, params, step)
    comm.finalize()
    report(out, f"ref{rank}", params, {})


def report(out: str, who: str, params: list[torch.Tensor], timings: dict) -> None:
    # Every communicator this process made is finalized and dropped (the last one by the
    # caller, the others by reconfigure()): the engine must hold no device or pinned memory.
    import gc

    gc.collect()
    timings = dict(timings, cuda_bytes_held=list(torchcomms._comms._cuda_bytes_held()))
    with open(f"{out}.{who}", "w") as f:
        json.dump(dict(who=who, params=[p.flatten().cpu().tolist() for p in params], **timings), f)


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[0] == "--cuda":
        DEVICE = torch.device("cuda")
        argv = argv[1:]
    {"train": train, "join": join, "resume": resume}[argv[0]](argv[1:])
