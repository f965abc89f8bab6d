"""One rank of make rdma-check's NCCL all-reduce (test/rdmacheck).

Each rank runs in its own pod network namespace; the Go side sets NCCL's
environment (NCCL_HOSTID, NCCL_IB_DISABLE or NCCL_IB_HCA, NCCL_DEBUG=INFO)
and reads the RESULT line and NCCL's log from this process's output.
"""
import argparse
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, required=True)
p.add_argument("--world", type=int, default=2)
p.add_argument("--addr", required=True, help="rank 0's address (its pod's)")
p.add_argument("--port", type=int, default=29533)
p.add_argument("--mib", type=int, default=64, help="all-reduce size")
p.add_argument("--iters", type=int, default=20)
a = p.parse_args()

torch.cuda.set_device(0)
dist.init_process_group("nccl", init_method=f"tcp://{a.addr}:{a.port}", rank=a.rank, world_size=a.world)
n = a.mib * 2**20 // 4  # float32 elements

# Correctness: rank r contributes r+1 everywhere; the sum is the same on
# every rank and in every element.
x = torch.full((n,), float(a.rank + 1), device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
want = a.world * (a.world + 1) / 2
ok = bool(torch.all(x == want).item())

# Bandwidth: algbw = size / time of one all-reduce, as nccl-tests print it.
y = torch.ones(n, device="cuda")
dist.all_reduce(y)
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(a.iters):
    dist.all_reduce(y)
torch.cuda.synchronize()
dt = (time.perf_counter() - t0) / a.iters
print(f"RESULT rank={a.rank} ok={ok} bytes={n * 4} time_us={dt * 1e6:.0f} algbw_GBps={n * 4 / dt / 1e9:.3f}", flush=True)
dist.destroy_process_group()
