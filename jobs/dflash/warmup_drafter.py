"""Single-threaded compile warmup for a DFlash drafter GPU.

gpujob runs this once per drafter GPU, one after another, with
CUDA_VISIBLE_DEVICES set to that GPU and TORCHINDUCTOR_CACHE_DIR /
TRITON_CACHE_DIR pointing at the current wheel profile's own cache. It compiles
flex_attention with a block mask at the training shapes, so the three drafter
processes later find their kernels in the cache instead of compiling them at
the same moment (the FX-tracing race of the seeds).
"""

import argparse
import os
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

p = argparse.ArgumentParser()
p.add_argument("--heads", type=int, default=32)
p.add_argument("--head-dim", type=int, default=128)
p.add_argument("--seq-len", type=int, default=4096)
p.add_argument("--block-size", type=int, default=16, help="DFlash block size")
p.add_argument("--dtype", default="bfloat16")
args = p.parse_args()

assert torch.cuda.is_available(), "no CUDA device visible"
dev = torch.device("cuda")
dtype = getattr(torch, args.dtype)
print(f"warmup: torch {torch.__version__} (CUDA {torch.version.cuda}) on "
      f"{torch.cuda.get_device_name(dev)}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}, "
      f"cache {os.environ.get('TORCHINDUCTOR_CACHE_DIR')}", flush=True)


def block_causal(b, h, q_idx, kv_idx):
    # a query sees every earlier block and its own block (block diffusion)
    return (q_idx // args.block_size) >= (kv_idx // args.block_size)


t0 = time.time()
mask = create_block_mask(block_causal, B=None, H=None, Q_LEN=args.seq_len, KV_LEN=args.seq_len, device=dev)
attn = torch.compile(flex_attention)
q, k, v = (torch.randn(1, args.heads, args.seq_len, args.head_dim, device=dev, dtype=dtype,
                       requires_grad=True) for _ in range(3))
out = attn(q, k, v, block_mask=mask)
out.sum().backward()  # the backward kernels are compiled too
torch.cuda.synchronize()
print(f"warmup: flex_attention forward+backward compiled in {time.time() - t0:.1f}s", flush=True)
