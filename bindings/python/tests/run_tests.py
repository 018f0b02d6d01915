"""Runs the pytest suite on one rank of a torchrun job; every rank runs it, and the exit code of
each is pytest's, so torchrun fails when any rank fails::

    torchrun --nproc_per_node 4 bindings/python/tests/run_tests.py [pytest args]

Rank 0 prints its pytest output as it goes. Other ranks write theirs to a log and print their
summary (with the reasons of their skips) at the end, or the whole log when they failed.
"""

from __future__ import annotations

import os
import sys
import tempfile

import pytest


def main() -> int:
    rank = int(os.environ.get("RANK", "0"))
    here = os.path.dirname(os.path.abspath(__file__))
    args = [
        here,
        "-q",
        "-rs",  # print the reason of every skip
        "-p",
        "no:cacheprovider",  # ranks would race on .pytest_cache
        *sys.argv[1:],
    ]
    if rank == 0:
        return int(pytest.main(args))

    # Other ranks: send stdout/stderr (also what Rust writes) to a log.
    fd, log = tempfile.mkstemp(prefix=f"torchcomms-pytest-rank{rank}-", suffix=".log")
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        code = int(pytest.main(args))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        os.close(fd)
    with open(log, errors="replace") as f:
        text = f.read()
    if code != 0:
        print(f"===== rank {rank}: pytest failed (exit {code}); its full output: =====")
        print(text)
    else:
        # The warnings summary (if any) and the short summary, with the reasons of skips.
        at = -1
        for marker in ("warnings summary", "short test summary info"):
            at = text.find(marker)
            if at >= 0:
                break
        tail = text[text.rfind("\n", 0, at) + 1 :] if at >= 0 else text.strip().splitlines()[-1]
        print(f"===== rank {rank}: " + tail.strip().replace("\n", f"\n[rank {rank}] "))
    os.unlink(log)
    return code


if __name__ == "__main__":
    sys.exit(main())
