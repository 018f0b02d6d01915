# Time to a first communicator and its first all_reduce (one process per GPU), ctran or torch+NCCL:
#   TORCHCOMMS_KERNEL_CACHE=/tmp/fresh torchrun --nproc_per_node 4 scripts/bench/first_comm.py ctran
#   torchrun --nproc_per_node 4 scripts/bench/first_comm.py nccl
import os, sys, time
t0 = time.perf_counter()
import torch
which = sys.argv[1]
r = int(os.environ["RANK"]); n = int(os.environ["WORLD_SIZE"])
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(dev)
x = torch.ones(1 << 20, device=dev)
torch.cuda.synchronize()
t1 = time.perf_counter()
if which == "nccl":
    import torch.distributed as dist
    dist.init_process_group("nccl", device_id=dev)
    t2 = time.perf_counter()
    dist.all_reduce(x)
else:
    import torchcomms
    from datetime import timedelta
    c = torchcomms.new_comm("ctran", dev, "first", timeout=timedelta(seconds=300))
    t2 = time.perf_counter()
    c.all_reduce(x, torchcomms.ReduceOp.SUM, False)
torch.cuda.synchronize()
t3 = time.perf_counter()
ok = bool((x == n).all())
if r == 0:
    print(f"{which}: create {t2-t1:.2f} s, first all_reduce {t3-t2:.2f} s, total {t3-t1:.2f} s, correct={ok}", flush=True)
