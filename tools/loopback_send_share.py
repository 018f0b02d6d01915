#!/usr/bin/env python3
"""CPU time that a TCP stream on loopback costs its sender and its receiver.

One process streams TOTAL bytes to another over 127.0.0.1 in writes of WRITE bytes; each end
reports the CPU time (user + system) it used. The sender's share of the sum is what the cost
model's `LOOPBACK_SEND_SHARE` stands for (ctran/src/algos/select/cost.rs): on loopback the
sender's system call also runs the kernel's receive path, so a byte sent costs the sender more
than it costs the receiver.

    python3 tools/loopback_send_share.py [WRITE_BYTES ...]
"""

import os
import socket
import sys

TOTAL = 2 << 30


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def receive(port: int, write: int, report) -> None:
    conn = socket.create_connection(("127.0.0.1", port))
    view = memoryview(bytearray(write))
    start, got = cpu_seconds(), 0
    while got < TOTAL:
        n = conn.recv_into(view)
        if n == 0:
            raise SystemExit("sender closed early")
        got += n
    os.write(report, f"{cpu_seconds() - start}".encode())


def measure(write: int) -> tuple[float, float]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        receive(port, write, w)
        os._exit(0)
    os.close(w)
    conn, _ = listener.accept()
    data = bytes(write)
    start, sent = cpu_seconds(), 0
    while sent < TOTAL:
        conn.sendall(data)
        sent += write
    sender = cpu_seconds() - start
    receiver = float(os.read(r, 64).decode())
    os.waitpid(pid, 0)
    return sender, receiver


def main() -> None:
    writes = [int(a) for a in sys.argv[1:]] or [256 << 10, 1 << 20]
    for write in writes:
        sender, receiver = measure(write)
        share = sender / (sender + receiver)
        print(
            f"writes of {write} B, {TOTAL >> 20} MiB: sender {sender:.2f} s of CPU, "
            f"receiver {receiver:.2f} s, sender's share {share:.2f}"
        )


if __name__ == "__main__":
    main()
