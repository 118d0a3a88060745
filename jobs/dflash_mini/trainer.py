"""A DFlash-like drafter trainer that really trains (the gpujob example of issue 15).

One process. A small frozen *target* model (causal transformer) runs on the GPU(s)
of the ``target`` group; one *drafter* thread per GPU of the ``drafter`` group
trains its own drafter on the target's hidden states (both roles share the GPU
when there is only one). The drafter's attention is
``torch.nn.attention.flex_attention`` under a DFlash-like block mask (causal
across blocks, bidirectional inside a block of ``--block-size`` tokens): compiled
with ``torch.compile`` when ``DFLASH_COMPILE=1`` (profile ``fast``), run eagerly
otherwise (profile ``slow``: flex_attention's reference path, many times slower).

It prints ``step N | loss X | 123.4K tok/s`` (gpujob's ``ktok`` format), writes
``<ckpt-dir>/step_<N>.pt`` every ``--ckpt-every`` seconds (atomically) and with
``--resume`` continues from the newest one. ``--warmup`` runs a few drafter steps
on one device to fill the compile cache (gpujob runs it per drafter GPU with
CUDA_VISIBLE_DEVICES set) and prints how long its first step took.

Runs on CPU too (``--device cpu``, float32), for a smoke test without a GPU.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

T0 = time.time()
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402

IMPORT_S = time.time() - T0


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="auto", help="auto, cuda or cpu")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--batch", type=int, default=8, help="sequences per drafter per step")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--target-layers", type=int, default=4)
    p.add_argument("--drafter-layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--steps", type=int, default=10 ** 9)
    p.add_argument("--time-limit", type=float, default=0.0, help="seconds of training, then exit 0")
    p.add_argument("--print-every", type=float, default=0.5, help="seconds between tok/s lines")
    p.add_argument("--ckpt-dir", default="ckpt")
    p.add_argument("--ckpt-every", type=float, default=5.0, help="seconds between checkpoints")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--warmup", action="store_true", help="compile warmup: a few drafter steps, then exit")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--compile", choices=["env", "yes", "no"], default="env",
                   help="compile flex_attention; env: DFLASH_COMPILE=1")
    return p.parse_args(argv)


def gpu_group(name: str) -> list:
    """GPU indices of a gpujob group (GPUJOB_GPUS_<NAME>), [] when not set."""
    text = os.environ.get(f"GPUJOB_GPUS_{name.upper()}", "")
    return [int(x) for x in text.split(",") if x.strip()]


def devices(args) -> tuple:
    """(target device, [drafter devices]); one GPU: both roles on it."""
    kind = args.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cpu":
        n = max(1, len(gpu_group("drafter")))
        return torch.device("cpu"), [torch.device("cpu")] * n
    visible = torch.cuda.device_count()
    if visible == 0:
        sys.exit("dflash-mini: --device cuda but torch sees no GPU")
    if args.warmup:  # gpujob runs it once per drafter GPU with CUDA_VISIBLE_DEVICES=<gpu>
        return torch.device("cuda", 0), [torch.device("cuda", 0)]
    drafters = gpu_group("drafter") or [0]
    target = (gpu_group("target") or drafters)[0]
    for g in [target, *drafters]:
        if g >= visible:
            sys.exit(f"dflash-mini: GPU {g} of the job's groups, but torch sees {visible} GPU(s)")
    return torch.device("cuda", target), [torch.device("cuda", g) for g in drafters]


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, attend):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))
        self.attend = attend

    def forward(self, x, mask=None):
        b, s, h = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = self.attend(q, k, v, mask).transpose(1, 2).reshape(b, s, h)
        x = x + self.out(a)
        return x + self.mlp(self.n2(x))


def causal_sdpa(q, k, v, _mask):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Target(nn.Module):
    """The frozen target model: embeddings, causal blocks, LM head."""

    def __init__(self, a):
        super().__init__()
        self.emb = nn.Embedding(a.vocab, a.hidden)
        self.blocks = nn.ModuleList(Block(a.hidden, a.heads, causal_sdpa) for _ in range(a.target_layers))
        self.head = nn.Linear(a.hidden, a.vocab, bias=False)

    @torch.no_grad()
    def forward(self, tokens):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x)
        return x, self.head(x).argmax(-1)  # hidden states, the target's next-token choices


class Drafter(nn.Module):
    """Predicts the target's next tokens from its hidden states, block by block."""

    def __init__(self, a, attend):
        super().__init__()
        self.emb = nn.Embedding(a.vocab, a.hidden)
        self.proj = nn.Linear(a.hidden, a.hidden, bias=False)
        self.blocks = nn.ModuleList(Block(a.hidden, a.heads, attend) for _ in range(a.drafter_layers))
        self.norm = nn.LayerNorm(a.hidden)
        self.head = nn.Linear(a.hidden, a.vocab, bias=False)

    def forward(self, tokens, hidden, mask):
        x = self.emb(tokens) + self.proj(hidden)
        for blk in self.blocks:
            x = blk(x, mask)
        return self.head(self.norm(x))


def dflash_mask(block_size: int):
    def mask_mod(b, h, q_idx, kv_idx):  # causal + block-diagonal (bidirectional inside a block)
        return (kv_idx <= q_idx) | (q_idx // block_size == kv_idx // block_size)
    return mask_mod


def make_attend(compiled: bool):
    fn = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention

    def attend(q, k, v, mask):
        return fn(q, k, v, block_mask=mask)
    return attend


def dense_mask(block_size: int, seq_len: int, device):
    """The same mask as a dense boolean matrix (for SDPA)."""
    i = torch.arange(seq_len, device=device)
    return dflash_mask(block_size)(None, None, i[:, None], i[None, :])


def sdpa_attend(q, k, v, mask):
    """CPU stand-in: flex_attention has no backward on CPU, so the same block mask
    goes densely through SDPA (a smoke test of everything else)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class DrafterWorker:
    """One drafter on one device: its model, optimiser, block mask and step."""

    def __init__(self, a, device, dtype, compiled: bool):
        self.device, self.dtype = device, dtype
        torch.manual_seed(1)
        flex = device.type == "cuda"
        self.model = Drafter(a, make_attend(compiled) if flex else sdpa_attend).to(device=device, dtype=dtype)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=a.lr, fused=device.type == "cuda")
        self.mask = create_block_mask(dflash_mask(a.block_size), None, None, a.seq_len, a.seq_len,
                                      device=str(device)) if flex else \
            dense_mask(a.block_size, a.seq_len, device)

    def step(self, tokens, hidden, labels) -> float:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        tokens = tokens.to(self.device, non_blocking=True)
        hidden = hidden.to(self.device, dtype=self.dtype, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        logits = self.model(tokens, hidden, self.mask)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


def sync(devs) -> None:
    for d in {d for d in devs if d.type == "cuda"}:
        torch.cuda.synchronize(d)


def newest_checkpoint(ckpt_dir: str):
    found = glob.glob(os.path.join(ckpt_dir, "step_*.pt"))
    if not found:
        return None
    return max(found, key=lambda p: int(re.search(r"step_(\d+)\.pt$", p).group(1)))


def save(ckpt_dir: str, step: int, workers) -> str:
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, f"step_{step}.pt")
    state = {"step": step, "drafters": [{"model": w.model.state_dict(), "opt": w.opt.state_dict()}
                                        for w in workers]}
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)
    found = sorted(glob.glob(os.path.join(ckpt_dir, "step_*.pt")),
                   key=lambda p: int(re.search(r"step_(\d+)\.pt$", p).group(1)))
    for old in found[:-2]:  # keep the two newest
        os.unlink(old)
    return path


def batch(a, gen, device):
    return torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=gen).to(device)


def main(argv=None) -> int:
    a = parse_args(argv)
    compiled = {"yes": True, "no": False}.get(a.compile, os.environ.get("DFLASH_COMPILE") == "1")
    tdev, ddevs = devices(a)
    dtype = torch.bfloat16 if tdev.type == "cuda" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = True
    attention = ('flex_attention ' + ('compiled' if compiled else 'eager')) if tdev.type == 'cuda' \
        else 'SDPA dense mask (CPU)'
    print(f"dflash-mini: torch {torch.__version__} (import {IMPORT_S:.1f}s), target on {tdev}, "
          f"drafters on {', '.join(map(str, ddevs))}, attention {attention}, "
          f"seq {a.seq_len} block {a.block_size} batch {a.batch}", flush=True)
    torch.manual_seed(0)
    target = Target(a).to(device=tdev, dtype=dtype).eval()
    workers = [DrafterWorker(a, d, dtype, compiled) for d in ddevs]
    gen = torch.Generator().manual_seed(1234)
    step = 0
    if a.warmup:
        for i in range(a.warmup_steps):
            t = time.time()
            tokens = batch(a, gen, tdev)
            hidden, choice = target(tokens)
            workers[0].step(tokens, hidden, choice.roll(-1, dims=1))
            sync([tdev])
            print(f"warmup step {i + 1}: {time.time() - t:.2f}s" +
                  (f" | first_step_s={time.time() - t:.3f}" if i == 0 else ""), flush=True)
        return 0
    if a.resume:
        path = newest_checkpoint(a.ckpt_dir)
        if path:
            state = torch.load(path, map_location="cpu", weights_only=False)
            for w, s in zip(workers, state["drafters"]):
                w.model.load_state_dict(s["model"])
                w.opt.load_state_dict(s["opt"])
            step = state["step"]
            print(f"resumed from {path} at step {step}", flush=True)
        else:
            print("resume: no checkpoint, starting from scratch", flush=True)
    pool = ThreadPoolExecutor(len(workers), thread_name_prefix="drafter")
    stand_in_delay = float(os.environ.get("DFLASH_CPU_STEP_DELAY", "0")) if tdev.type == "cpu" else 0.0
    tokens_per_step = a.batch * a.seq_len * len(workers)
    start = last_print = last_ckpt = time.time()
    done_tokens, first = 0, True
    while step < a.steps:
        t = time.time()
        batches = []
        for _ in workers:  # the target model on its GPU: hidden states for every drafter
            tokens = batch(a, gen, tdev)
            hidden, choice = target(tokens)
            batches.append((tokens, hidden, choice.roll(-1, dims=1)))
        if first:  # one drafter after another: concurrent torch.compile in threads races (the seeds)
            losses = [w.step(*b) for w, b in zip(workers, batches)]
        else:
            losses = list(pool.map(lambda wb: wb[0].step(*wb[1]), zip(workers, batches)))
        if stand_in_delay:  # CPU smoke test only: a slow profile where compile makes no difference
            time.sleep(stand_in_delay)
        step += 1
        done_tokens += tokens_per_step
        now = time.time()
        if first:
            sync([tdev, *ddevs])
            now = time.time()
            print(f"first step {now - t:.2f}s | first_step_s={now - t:.3f}", flush=True)
            first, last_print, done_tokens = False, now, 0
            continue
        if now - last_print >= a.print_every:
            loss = sum(float(x) for x in losses) / len(losses)  # syncs the drafters
            now = time.time()
            tps = done_tokens / (now - last_print)
            print(f"step {step} | loss {loss:.4f} | {tps / 1000:.1f}K tok/s", flush=True)
            last_print, done_tokens = now, 0
        if a.ckpt_every and now - last_ckpt >= a.ckpt_every:
            t_save = time.time()
            path = save(a.ckpt_dir, step, workers)
            print(f"checkpoint {path} ({time.time() - t_save:.2f}s)", flush=True)
            last_ckpt = time.time()
            last_print, done_tokens = last_ckpt, 0  # the save is not training time
        if a.time_limit and now - start >= a.time_limit:
            break
    print(f"training finished at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "target"
    sys.exit(main())
