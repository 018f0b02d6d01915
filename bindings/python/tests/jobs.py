"""Jobs of their own for the tests that kill ranks or launch torch.distributed: processes
started apart from the suite's torchrun job (a rank that dies must not take pytest with it),
their environment, and what they print."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import Any, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))

# Launcher variables of the suite's own job, which a job of its own must not inherit.
LAUNCHER_VARS = ("TORCHELASTIC_", "RANK", "LOCAL_", "GROUP_", "ROLE_", "WORLD_SIZE", "MASTER_")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(drop: Sequence[str] = LAUNCHER_VARS, **extra: str) -> dict[str, str]:
    """This process's environment without the variables starting with ``drop``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(tuple(drop))}
    env.update(extra)
    return env


def spawn(script: str, args: Sequence[str], env: dict[str, str]) -> subprocess.Popen:
    """Starts ``script`` (a file of this folder, or a path) with ``args``; stdout and stderr in
    one pipe."""
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, script), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def collect(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str, float]]:
    """(returncode, output, when its end was seen) per process; kills them all if one outlives
    ``timeout``."""
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        out.append((p.returncode, text, time.time()))
    return out


def results(text: str) -> list[dict[str, Any]]:
    """The JSON objects of the output's ``RESULT {...}`` lines (raw_decode: the engine's log, on
    the same pipe, may land on the same line)."""
    decode = json.JSONDecoder().raw_decode
    return [decode(ln[len("RESULT ") :])[0] for ln in text.splitlines() if ln.startswith("RESULT ")]
