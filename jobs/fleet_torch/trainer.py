"""A small data-parallel trainer for multi-node gpujob jobs (jobs/fleet-torch.yaml; issues 16 and 17).

Started by ``torchrun`` on every node (``--rdzv_backend c10d``): one process per
GPU, gradients all-reduced through NCCL (gloo on CPU). The model is a stack of
wide MLP blocks, so a step is dominated by matrix work and its speed depends on
the profile's numerics: ``DDP_PRECISION=bf16`` (profile ``fast``: autocast to
bfloat16) or ``fp32`` (profile ``slow``: TF32 off, full float32 matmuls, many
times slower on an H200). Every node's local rank 0 prints the node's throughput
as ``step N | loss X | 123.4K tok/s`` (gpujob's ``ktok`` format), so each node's
supervisor watches its own node.

Checkpoints: every ``--ckpt-every`` seconds (a step count agreed by all ranks,
so every node writes the same step), each node's local rank 0 writes
``<ckpt-dir>/step_<N>.pt`` atomically and keeps the last two; a start without
``--resume`` first removes an earlier run's checkpoints (the workdir outlives the
job, and a new run is a new series). ``--resume``
loads the newest step that *every* node has (an all-reduce of each node's
newest), so a node killed between two saves never splits the fleet.

Runs without a GPU (``--device cpu``, gloo) for a smoke test.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="auto", help="auto, cuda or cpu")
    p.add_argument("--backend", default="auto", help="auto (nccl on GPUs, gloo on CPU), nccl or gloo "
                   "(gloo lets two nodes share one GPU)")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="sequences per rank per step")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--time-limit", type=float, default=0.0, help="seconds of training, then exit 0")
    p.add_argument("--print-every", type=float, default=0.5)
    p.add_argument("--ckpt-dir", default="ckpt")
    p.add_argument("--ckpt-every", type=float, default=5.0)
    p.add_argument("--resume", action="store_true")
    return p.parse_args(argv)


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def step_files(ckpt_dir: str) -> dict[int, str]:
    out = {}
    for path in glob.glob(os.path.join(ckpt_dir, "step_*.pt")):
        m = re.search(r"step_(\d+)\.pt$", path)
        if m:
            out[int(m.group(1))] = path
    return out


def main(argv=None) -> int:
    a = parse_args(argv)
    use_cuda = torch.cuda.is_available() if a.device == "auto" else a.device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = a.backend if a.backend != "auto" else ("nccl" if use_cuda else "gloo")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    node_rank = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))
    precision = os.environ.get("DDP_PRECISION", "bf16")
    torch.backends.cuda.matmul.allow_tf32 = precision != "fp32"
    torch.backends.cudnn.allow_tf32 = precision != "fp32"
    speaker = local_rank == 0
    if speaker:
        print(f"node {node_rank}: rank {rank}/{world} on {device}, precision {precision}, "
              f"backend {dist.get_backend()}", flush=True)

    torch.manual_seed(0)
    model = nn.Sequential(*[Block(a.width) for _ in range(a.layers)]).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=a.lr)
    step = 0

    if not a.resume and speaker:  # a fresh start begins a new series: never resume an older run's
        for path in step_files(a.ckpt_dir).values():
            os.unlink(path)
    if a.resume:
        mine = max(step_files(a.ckpt_dir), default=-1) if speaker else 2 ** 62
        t = torch.tensor([mine], dtype=torch.long, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)  # the newest step every node has
        common = int(t.item())
        if common >= 0:
            path = os.path.join(a.ckpt_dir, f"step_{common}.pt")
            state = torch.load(path, map_location=device, weights_only=True) if os.path.exists(path) else None
            flag = torch.tensor([0 if state is None else 1], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            if state is None or not int(flag.item()):
                # a non-speaker rank on a node reads the node's file too; absent = scratch for all
                if speaker:
                    print("resume: no checkpoint common to every node, starting from scratch", flush=True)
            else:
                model.load_state_dict(state["model"])
                opt.load_state_dict(state["opt"])
                step = state["step"]
                if speaker:
                    print(f"resumed from {path} at step {step}", flush=True)
        elif speaker:
            print("resume: no checkpoint, starting from scratch", flush=True)

    tokens_per_step = a.batch * a.seq_len * world
    gen = torch.Generator(device=device).manual_seed(1000 + rank)
    start = last_print = last_ckpt = time.time()
    done = 0
    while True:
        x = torch.randn(a.batch, a.seq_len, a.width, device=device, generator=gen)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = (ddp(x) - x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        done += tokens_per_step
        if step % 4:
            continue
        # decide together every 4 steps (one small all-reduce), so every rank prints,
        # saves and stops at the same step and no collective is ever left unmatched
        now = time.time()
        flags = torch.tensor([1 if a.time_limit and now - start >= a.time_limit else 0,
                              1 if a.ckpt_every and now - last_ckpt >= a.ckpt_every else 0,
                              1 if now - last_print >= a.print_every else 0], device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop, save, show = (int(v) for v in flags.tolist())  # .tolist() waits for the GPU
        if show:
            now = time.time()
            if speaker:
                # the node's share of the fleet's tokens: gpujob sums the nodes (aggregate: sum)
                node_tps = done / (now - last_print) * int(os.environ.get("LOCAL_WORLD_SIZE", "1")) / world
                print(f"step {step} | loss {loss.item():.4f} | {node_tps / 1e3:.1f}K tok/s", flush=True)
            last_print, done = now, 0
        if save:
            if speaker:
                os.makedirs(a.ckpt_dir, exist_ok=True)
                path = os.path.join(a.ckpt_dir, f"step_{step}.pt")
                state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}
                torch.save(state, path + ".tmp")
                os.replace(path + ".tmp", path)
                files = step_files(a.ckpt_dir)
                for old in sorted(files)[:-2]:
                    os.unlink(files[old])
                print(f"checkpoint {path}", flush=True)
            last_ckpt = last_print = time.time()  # the save is not training time
            done = 0
        if stop:
            break
    dist.barrier()
    dist.destroy_process_group()
    if speaker:
        print(f"done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
