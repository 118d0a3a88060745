"""A small real torch.distributed trainer for multi-node jobs (jobs/fleet-torch.yaml).

Launched by torchrun on every node (c10d rendezvous at {rdzv_endpoint}); each step
multiplies a matrix on the node's GPU and all-reduces a CUDA tensor across every
rank (gloo by default: it works with one GPU shared by two nodes; NCCL wants a GPU
per rank: --backend nccl). It prints ``step N | X K tok/s`` per node. Profile
``slow`` (FLEET_SLOW=1) idles after each step, as a bad wheel build would;
``--resume`` continues from the step in its checkpoint (rank 0's step wins).
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100)
p.add_argument("--dim", type=int, default=2048)
p.add_argument("--tokens-per-step", type=int, default=65536)
p.add_argument("--backend", default="gloo")
p.add_argument("--resume", action="store_true")
args = p.parse_args()

dist.init_process_group(args.backend)
rank, world = dist.get_rank(), dist.get_world_size()
local = int(os.environ.get("LOCAL_RANK", "0"))
dev = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
if dev.type == "cuda":
    torch.cuda.set_device(dev)
slow = os.environ.get("FLEET_SLOW") == "1"
ckpt = f"ckpt-rank{rank}.json"
step = 0
if args.resume and os.path.exists(ckpt):
    with open(ckpt) as f:
        step = json.load(f)["step"]
t = torch.tensor([step], device=dev if args.backend == "nccl" else "cpu")
dist.broadcast(t, 0)
step = int(t.item())
if local == 0:
    print(f"rank {rank}/{world} on {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}), "
          f"torch {torch.__version__}, backend {args.backend}, NODE_RANK={os.environ.get('NODE_RANK')}, "
          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '-')}, "
          f"{'resumed at step ' + str(step) if step else 'from step 0'}, {'slow' if slow else 'fast'} build",
          flush=True)
x = torch.randn(args.dim, args.dim, device=dev)
while step < args.steps:
    t0 = time.perf_counter()
    y = x @ x
    g = y.norm().reshape(1)
    dist.all_reduce(g)  # a CUDA tensor through the backend: every rank in step
    if dev.type == "cuda":
        torch.cuda.synchronize()
    time.sleep(0.25 if slow else 0.04)
    step += 1
    tps = args.tokens_per_step / (time.perf_counter() - t0)
    if local == 0:
        print(f"step {step} | {tps / 1000:.1f}K tok/s", flush=True)
        with open(ckpt + ".tmp", "w") as f:
            json.dump({"step": step}, f)
        os.replace(ckpt + ".tmp", ckpt)
dist.barrier()
dist.destroy_process_group()
if local == 0:
    print(f"training finished at step {step}", flush=True)
