"""torchcomms._transport (upstream's RDMA transfer API) on CPU: upstream's TransportTest adapted
(two transports in one process), a second Python process exchanging URLs and a pickled
RdmaRemoteBuffer through a pipe, and bad input.

Per-process tests: no communicator, nothing depends on the rank, so under torchrun every rank
runs them on its own and they never wait on another rank."""

from __future__ import annotations

import multiprocessing as mp
import pickle
from typing import Any, Tuple

import pytest
import torch

import torchcomms
from torchcomms._transport import RdmaMemory, RdmaRemoteBuffer, RdmaTransport
from torchcomms.transport import RdmaTransport as RdmaTransportAlias

CPU = torch.device("cpu")


def bind_and_connect(server: RdmaTransport, client: RdmaTransport) -> None:
    server_url = server.bind()
    client_url = client.bind()
    assert isinstance(server_url, bytes) and server_url
    assert client_url and server_url != client_url
    assert server.connect(client_url) == 0
    assert client.connect(server_url) == 0
    assert server.connected() and client.connected()


def pair() -> Tuple[RdmaTransport, RdmaTransport]:
    a, b = RdmaTransport(CPU), RdmaTransport(CPU)
    bind_and_connect(a, b)
    return a, b


def test_alias_and_supported() -> None:
    assert RdmaTransportAlias is RdmaTransport
    assert RdmaTransport.supported()


def test_memory_views() -> None:
    t = torch.arange(1024, dtype=torch.uint8)
    m = RdmaMemory(t)
    assert m.to_view().size() == t.nbytes
    assert m.to_mutable_view(offset=256, length=512).size() == 512
    assert not m.reused_registration()
    assert RdmaMemory(t).reused_registration()


def test_write_whole_and_partial() -> None:
    a, b = pair()
    src = torch.arange(1024, dtype=torch.uint8)
    dst = torch.zeros_like(src)
    sm, dm = RdmaMemory(src), RdmaMemory(dst)
    assert a.write(sm.to_view(), dm.to_remote_buffer()) == 0
    assert torch.equal(src, dst)
    dst.zero_()
    rb = dm.to_remote_buffer()
    part = RdmaRemoteBuffer(rb.ptr + 256, 512, rb.access_key)
    assert a.write(sm.to_view(offset=256, length=512), part) == 0
    assert torch.equal(dst[256:768], src[256:768])
    assert int(dst[:256].sum()) == 0 and int(dst[768:].sum()) == 0


def test_read_and_notify() -> None:
    a, b = pair()
    src = torch.arange(4096, dtype=torch.float32)
    out = torch.zeros_like(src)
    sm, om = RdmaMemory(src), RdmaMemory(out)
    assert b.read(om.to_mutable_view(), sm.to_remote_buffer()) == 0
    assert torch.equal(src, out)
    out.zero_()
    assert a.write(sm.to_view(), om.to_remote_buffer(), notify=True, timeout=30) == 0
    b.wait_for_write(timeout=30)
    assert torch.equal(src, out)
    with pytest.raises(TimeoutError):
        b.wait_for_write(timeout=0.2)


@pytest.mark.parametrize("protocol", sorted({0, 1, pickle.HIGHEST_PROTOCOL}))
def test_remote_buffer_pickle(protocol: int) -> None:
    a, b = pair()
    src = torch.arange(1024, dtype=torch.uint8)
    dst = torch.zeros_like(src)
    sm, dm = RdmaMemory(src), RdmaMemory(dst)
    rb = dm.to_remote_buffer()
    again = pickle.loads(pickle.dumps(rb, protocol=protocol))
    assert again.__getstate__() == rb.__getstate__()
    assert a.write(sm.to_view(), again) == 0
    assert torch.equal(src, dst)


def test_stale_and_out_of_bounds_are_refused() -> None:
    a, _b = pair()
    src = torch.ones(64, dtype=torch.uint8)
    dst = torch.zeros(64, dtype=torch.uint8)
    sm = RdmaMemory(src)
    dm = RdmaMemory(dst)
    rb = dm.to_remote_buffer()
    oob = RdmaRemoteBuffer(rb.ptr + 32, 64, rb.access_key)
    with pytest.raises(RuntimeError, match="out of bounds"):
        a.write(sm.to_view(), oob)
    del dm
    with pytest.raises(RuntimeError, match="unknown or was deregistered"):
        a.write(sm.to_view(), rb)
    assert int(dst.sum()) == 0


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="device"):
        RdmaTransport(torch.device("cuda"))
    with pytest.raises(ValueError, match="contiguous"):
        RdmaMemory(torch.zeros(8, 8)[:, 1])
    m = RdmaMemory(torch.zeros(16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="offset"):
        m.to_view(offset=17)
    with pytest.raises(ValueError, match="length"):
        m.to_mutable_view(offset=8, length=9)
    with pytest.raises(ValueError, match="access_key"):
        RdmaRemoteBuffer(0, 16, "not-a-key")
    t = RdmaTransport(CPU)
    with pytest.raises(RuntimeError, match="bind"):
        t.connect(b"tcrdma1://127.0.0.1:1/" + b"0" * 32 + b"/0/1")
    t.bind()
    with pytest.raises(ValueError, match="peer URL"):
        t.connect(b"garbage")
    with pytest.raises(RuntimeError, match="not connected"):
        t.write(m.to_view(), m.to_remote_buffer())


def _child(conn: Any) -> None:
    """The second process: receives the parent's URL, sends its own and a pickled buffer, and
    checks what the parent wrote."""
    t = RdmaTransport(torch.device("cpu"))
    url = t.bind()
    parent_url = conn.recv_bytes()
    conn.send_bytes(url)
    t.connect(parent_url)
    dst = torch.zeros(1 << 16, dtype=torch.uint8)
    src = torch.arange(1 << 16, dtype=torch.int32) % 251
    dm, sm = RdmaMemory(dst), RdmaMemory(src.to(torch.uint8))
    conn.send_bytes(pickle.dumps((dm.to_remote_buffer(), sm.to_remote_buffer())))
    t.wait_for_write(timeout=60)
    ok = bool(torch.equal(dst, (torch.arange(1 << 16) % 7).to(torch.uint8)))
    conn.send_bytes(pickle.dumps(ok))
    conn.recv_bytes()  # parent done reading


def test_second_process() -> None:
    ctx = mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    p = ctx.Process(target=_child, args=(child_conn,))
    p.start()
    try:
        t = RdmaTransport(CPU)
        parent_conn.send_bytes(t.bind())
        assert t.connect(parent_conn.recv_bytes()) == 0
        dst, src = pickle.loads(parent_conn.recv_bytes())
        mine = (torch.arange(1 << 16) % 7).to(torch.uint8)
        assert t.write(RdmaMemory(mine).to_view(), dst, notify=True, timeout=60) == 0
        assert pickle.loads(parent_conn.recv_bytes()) is True
        back = torch.zeros(1 << 16, dtype=torch.uint8)
        assert t.read(RdmaMemory(back).to_mutable_view(), src, timeout=60) == 0
        assert torch.equal(back, (torch.arange(1 << 16, dtype=torch.int32) % 251).to(torch.uint8))
        parent_conn.send_bytes(b"done")
    finally:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    assert p.exitcode == 0
    assert torchcomms is not None


@pytest.mark.parametrize("in_place", ["1", "0"])
def test_ib_data_path_on_the_software_fabric(monkeypatch: pytest.MonkeyPatch, in_place: str) -> None:
    # Both transports in this process: CTRAN_IB_PROVIDER=soft reaches only ranks of one process.
    monkeypatch.setenv("TORCHCOMMS_RDMA_PATH", "ib")
    monkeypatch.setenv("CTRAN_IB_PROVIDER", "soft")
    monkeypatch.setenv("TORCHCOMMS_RDMA_IB_IN_PLACE", in_place)
    a, b = RdmaTransport(CPU), RdmaTransport(CPU)
    urls = a.bind(), b.bind()
    assert all(b"/ib=" in u for u in urls), urls
    assert a.connect(urls[1]) == 0 and b.connect(urls[0]) == 0
    # More than one 4 MiB chunk of the ib path.
    src = torch.arange(3 << 20, dtype=torch.float32)
    dst = torch.zeros_like(src)
    sm, dm = RdmaMemory(src), RdmaMemory(dst)
    assert a.write(sm.to_view(), dm.to_remote_buffer(), notify=True, timeout=30) == 0
    b.wait_for_write(timeout=30)
    assert torch.equal(src, dst)
    back = torch.zeros_like(src)
    assert b.read(RdmaMemory(back).to_mutable_view(), sm.to_remote_buffer()) == 0
    assert torch.equal(src, back)
    # In place: the target moved each transfer with one RDMA read or write of the
    # registered tensors; staged: through the inboxes.
    moved = a._path_stats()["ib_in_place"], b._path_stats()["ib_in_place"]
    assert moved == ((1, 1) if in_place == "1" else (0, 0)), moved
    assert (a._path_stats()["ib"], b._path_stats()["ib"]) == (1, 1)


def test_ib_data_path_without_a_device_fails_at_bind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHCOMMS_RDMA_PATH", "ib")
    monkeypatch.setenv("CTRAN_IB_PROVIDER", "verbs")
    t = RdmaTransport(CPU)
    try:
        t.bind()
    except RuntimeError as e:
        assert "ib data path" in str(e), e
    else:
        pytest.skip("this machine has an RDMA device: binding the verbs provider succeeded")
