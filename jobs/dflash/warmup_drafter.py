"""Single-threaded compile warmup for a DFlash drafter GPU.

gpujob runs this once per drafter GPU, one after another, with
CUDA_VISIBLE_DEVICES set to that GPU and TORCHINDUCTOR_CACHE_DIR /
TRITON_CACHE_DIR pointing at the current wheel profile's own cache. It compiles
flex_attention with a block mask at the training shapes, so the three drafter
processes later find their kernels in the cache instead of compiling them at
the same moment (the FX-tracing race of the seeds).
"""

import argparse
import json
import os
import time

p = argparse.ArgumentParser()
p.add_argument("--config", help="the drafter's config.json (the train command's --draft-config-path): "
               "heads, head dim, block size and dtype are read from it, so the warmup compiles the "
               "training shapes; the flags below override it")
p.add_argument("--heads", type=int, help="num_attention_heads (default: --config's, else 32)")
p.add_argument("--head-dim", type=int,
               help="head_dim (default: --config's, else hidden_size / heads, else 128)")
p.add_argument("--seq-len", type=int, default=4096, help="the train command's --max-length")
p.add_argument("--block-size", type=int, help="DFlash block size (default: --config's, else 16)")
p.add_argument("--dtype", help="default: --config's dtype (torch_dtype), else bfloat16")
args = p.parse_args()

cfg = {}
if args.config:
    with open(args.config) as f:
        cfg = json.load(f)
heads = args.heads or cfg.get("num_attention_heads") or 32
args.heads = heads
args.head_dim = args.head_dim or cfg.get("head_dim") or (cfg["hidden_size"] // heads if cfg.get("hidden_size")
                                                         else 128)
args.block_size = args.block_size or cfg.get("block_size") or 16
args.dtype = args.dtype or cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
print(f"warmup: shapes heads={args.heads} head_dim={args.head_dim} seq_len={args.seq_len} "
      f"block_size={args.block_size} dtype={args.dtype}" + (f" (from {args.config})" if args.config else ""),
      flush=True)

import torch  # noqa: E402  (after the shapes: they are printed even where torch is missing)
from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402

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
