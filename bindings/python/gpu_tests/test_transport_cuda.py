"""torchcomms._transport with CUDA memory: upstream's TransportTest cases (cuda:0 <-> cuda:1,
cuda:0 <-> cuda:0, CPU <-> CUDA mixes, a pickled RdmaRemoteBuffer). Two transports in one
process: CUDA <-> CUDA goes through CUDA IPC, the mixes over the TCP payload path; then every
case again over the ib data path on the software fabric: in place (CUDA memory registered
through the driver's dma-buf export, as GPUDirect RDMA does; the software NIC moves it with
CUDA copies) and staged through host memory (`TORCHCOMMS_RDMA_IB_IN_PLACE=0`)."""

from __future__ import annotations

import os
import pickle
import unittest
from unittest import mock

import torch

from torchcomms._transport import RdmaMemory, RdmaRemoteBuffer, RdmaTransport


def need_two_gpus(case: unittest.TestCase) -> None:
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        case.skipTest(f"needs at least 2 CUDA devices, found {n}")


class TransportCudaTest(unittest.TestCase):
    def setUp(self) -> None:
        need_two_gpus(self)

    def bind_and_connect(self, server: RdmaTransport, client: RdmaTransport) -> None:
        su, cu = server.bind(), client.bind()
        self.assertEqual(server.connect(cu), 0)
        self.assertEqual(client.connect(su), 0)
        self.assertTrue(server.connected() and client.connected())

    def test_construct(self) -> None:
        RdmaTransport(torch.device("cuda:0"))

    def test_memory_from_tensor(self) -> None:
        t = torch.arange(1024, dtype=torch.uint8, device="cuda:0")
        c = torch.zeros_like(t, device="cuda:1")
        self.assertEqual(RdmaMemory(t).to_view().size(), t.nbytes)
        self.assertEqual(RdmaMemory(c).to_view().size(), c.nbytes)

    def run_send_recv(self, device1: str, device2: str) -> None:
        t1 = RdmaTransport(torch.device("cuda:0" if device1 == "cpu" else device1))
        t2 = RdmaTransport(torch.device("cuda:0" if device2 == "cpu" else device2))
        self.bind_and_connect(t1, t2)
        a = torch.arange(1 << 20, dtype=torch.int32, device=device1).to(torch.uint8)
        b = torch.zeros_like(a, device=device2)
        torch.cuda.synchronize()
        am, bm = RdmaMemory(a), RdmaMemory(b)
        self.assertEqual(t1.write(am.to_view(), bm.to_remote_buffer()), 0)
        self.assertTrue(torch.equal(a.cpu(), b.cpu()))
        # Partial write, then read back the other way.
        b.zero_()
        torch.cuda.synchronize()
        rb = bm.to_remote_buffer()
        self.assertEqual(t1.write(am.to_view(offset=256, length=512), RdmaRemoteBuffer(rb.ptr + 256, 512, rb.access_key)), 0)
        self.assertTrue(torch.equal(a[256:768].cpu(), b[256:768].cpu()))
        self.assertEqual(int(b[:256].sum().item()) + int(b[768:].sum().item()), 0)
        c = torch.zeros_like(a, device=device1)
        torch.cuda.synchronize()
        cm = RdmaMemory(c)
        self.assertEqual(t2.read(RdmaMemory(b).to_mutable_view(), am.to_remote_buffer()), 0)
        self.assertEqual(t1.read(cm.to_mutable_view(), bm.to_remote_buffer()), 0)
        self.assertTrue(torch.equal(a.cpu(), c.cpu()))
        self.check_paths(t1._path_stats(), t2._path_stats(), "cuda" in device1 + device2)

    def check_paths(self, s1: dict, s2: dict, gpu: bool) -> None:
        """Which paths `run_send_recv`'s three transfers of t1 and one of t2 took."""
        self.assertEqual(s1["ib"] + s2["ib"], 0, (s1, s2))

    def test_write_gpu_to_gpu(self) -> None:
        self.run_send_recv("cuda:0", "cuda:1")

    def test_write_gpu_to_gpu_same_device(self) -> None:
        self.run_send_recv("cuda:0", "cuda:0")

    def test_write_cpu_to_gpu(self) -> None:
        self.run_send_recv("cpu", "cuda:1")

    def test_write_gpu_to_cpu(self) -> None:
        self.run_send_recv("cuda:1", "cpu")

    def test_write_cpu_to_cpu(self) -> None:
        self.run_send_recv("cpu", "cpu")

    def test_remote_buffer_pickle(self) -> None:
        t1, t2 = RdmaTransport(torch.device("cuda:0")), RdmaTransport(torch.device("cuda:1"))
        self.bind_and_connect(t1, t2)
        a = torch.arange(1024, dtype=torch.uint8, device="cuda:0")
        b = torch.zeros_like(a, device="cuda:1")
        torch.cuda.synchronize()
        am, bm = RdmaMemory(a), RdmaMemory(b)
        for proto in sorted({0, 1, pickle.HIGHEST_PROTOCOL}):
            b.zero_()
            torch.cuda.synchronize()
            rb = pickle.loads(pickle.dumps(bm.to_remote_buffer(), protocol=proto))
            self.assertEqual(t1.write(am.to_view(), rb), 0)
            self.assertTrue(torch.equal(a.cpu(), b.cpu()))


class TransportCudaOverIbTest(TransportCudaTest):
    """The same cases with `TORCHCOMMS_RDMA_PATH=ib` on ibverbx's software fabric."""

    def setUp(self) -> None:
        super().setUp()
        env = mock.patch.dict(
            os.environ, {"TORCHCOMMS_RDMA_PATH": "ib", "CTRAN_IB_PROVIDER": "soft"}
        )
        env.start()
        self.addCleanup(env.stop)

    def bind_and_connect(self, server: RdmaTransport, client: RdmaTransport) -> None:
        su, cu = server.bind(), client.bind()
        self.assertIn(b"/ib=", su)
        self.assertIn(b"/ib=", cu)
        self.assertEqual(server.connect(cu), 0)
        self.assertEqual(client.connect(su), 0)

    def check_paths(self, s1: dict, s2: dict, gpu: bool) -> None:
        self.assertEqual((s1["ib"], s2["ib"]), (3, 1), (s1, s2))
        # HIP exports no dma-buf (docs/amd.md): a GPU side cannot register, so the connection
        # stages every transfer from its first one on.
        hip = os.environ.get("TORCHCOMMS_GPU_PLATFORM") == "hip"
        expected = (0, 0) if hip and gpu else (3, 1)
        self.assertEqual((s1["ib_in_place"], s2["ib_in_place"]), expected, (s1, s2))


class TransportCudaOverIbStagedTest(TransportCudaOverIbTest):
    """Over ib with in-place registration off: every transfer staged through host memory."""

    def setUp(self) -> None:
        super().setUp()
        env = mock.patch.dict(os.environ, {"TORCHCOMMS_RDMA_IB_IN_PLACE": "0"})
        env.start()
        self.addCleanup(env.stop)

    def check_paths(self, s1: dict, s2: dict, gpu: bool) -> None:
        self.assertEqual((s1["ib"], s2["ib"]), (3, 1), (s1, s2))
        self.assertEqual((s1["ib_in_place"], s2["ib_in_place"]), (0, 0), (s1, s2))


if __name__ == "__main__":
    unittest.main()
