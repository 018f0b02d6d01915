# Persistent all-gather on NVLink windows (hint window=true) against ctran's all_gather_single
# and torch+NCCL's all_gather_into_tensor, eager, same process loop; median of 5 timed blocks
# (CUDA events). Columns p/ag and p/nccl: the window's speed relative to the other's.
#   torchrun --nproc_per_node 4 scripts/bench/all_gather_p_gpu.py
import os, statistics, torch, torchcomms, torch.distributed as dist
from datetime import timedelta
r = int(os.environ["RANK"]); n = int(os.environ["WORLD_SIZE"])
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])); torch.cuda.set_device(dev)
dist.init_process_group("nccl", device_id=dev)
c = torchcomms.new_comm("ctran", dev, "agp", timeout=timedelta(seconds=120))
def t(f, its):
    for _ in range(3): f()
    meds = []
    for _ in range(5):
        torch.cuda.synchronize(); dist.barrier(); torch.cuda.synchronize()
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(its): f()
        b.record(); b.synchronize()
        meds.append(a.elapsed_time(b) * 1000 / its)
    return statistics.median(meds)
if r == 0: print(f"{'bytes/rank':>12} {'p_exec us':>10} {'ag_single us':>12} {'nccl us':>9} {'p/ag':>6} {'p/nccl':>7}", flush=True)
for size in [1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24, 1 << 26]:
    k = size // 4
    inp = torch.full((k,), float(r), device=dev); out = torch.zeros(n * k, device=dev)
    h = c.all_gather_p_init(out, hints={"window": "true"})
    assert h.uses_window
    its = 50 if size <= 1 << 20 else 10
    tp = t(lambda: c.all_gather_p_exec(h, inp, False), its)
    ok = bool((out.view(n, k) == torch.arange(n, device=dev, dtype=torch.float32)[:, None]).all())
    ta = t(lambda: c.all_gather_single(out, inp, False), its)
    tn = t(lambda: dist.all_gather_into_tensor(out, inp), its)
    torch.cuda.synchronize(); c.barrier(False); torch.cuda.synchronize()
    c.all_gather_p_free(h)
    if r == 0: print(f"{size:>12} {tp:>10.1f} {ta:>12.1f} {tn:>9.1f} {ta/tp:>6.2f} {tn/tp:>7.2f} correct={ok}", flush=True)
c.finalize(); dist.destroy_process_group()
