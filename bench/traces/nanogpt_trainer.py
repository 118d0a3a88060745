"""A nanoGPT-style trainer of our own (for trace recording): a small GPT whose
attention is flex_attention under a causal block mask, the whole model under
``torch.compile`` when ``--compile=True`` (under TORCHDYNAMO_DISABLE=1 that is a
no-op and flex_attention runs eagerly). Random token data made in code.

Like nanoGPT's train.py: ``--key=value`` arguments, ``iter N: loss X, time Y ms,
mfu Z%`` every ``log_interval`` iterations (the time of that one iteration), an
eval (``step N: train loss X, val loss Y``) and then ``saving checkpoint to out``
which rewrites the ONE file ``out/ckpt.pt`` in place; ``--init_from=resume``
loads it; ``--eval_interval`` (iterations, as nanoGPT: an eval at every multiple,
iteration 0 included, a save after it from iteration 1 on when the val loss improved
or ``--always_save_checkpoint=True``) and ``--gradient_accumulation_steps`` (micro-steps
of ``--batch_size`` per iteration) as nanoGPT has them. Ours adds ``--eval_interval_s``
(seconds between evals, when ``--eval_interval=0``) and ``--time_limit`` (seconds of
training after the first iteration, which compiles; 0: none). ``BENCH_STEP_DELAY``
(seconds) sleeps after each iteration: only for a CPU rehearsal of the device driver.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

cfg = dict(out_dir="out", init_from="scratch", batch_size=16, block_size=1024, n_layer=8, n_head=8,
           n_embd=512, vocab_size=8192, learning_rate=6e-4, log_interval=10, eval_interval_s=15.0,
           eval_iters=10, time_limit=90.0, eval_interval=0, always_save_checkpoint=True,
           gradient_accumulation_steps=1, max_iters=10 ** 9, compile=True, attn="flex",
           device="cuda", dtype="bfloat16", peak_flops=989e12)
for arg in sys.argv[1:]:
    key, _, val = arg.lstrip("-").partition("=")
    if key not in cfg:
        sys.exit(f"nanogpt_trainer: unknown argument --{key}")
    old = cfg[key]
    cfg[key] = (val == "True") if isinstance(old, bool) else type(old)(val)
C = type("C", (), cfg)


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(C.n_embd, 3 * C.n_embd, bias=False)
        self.proj = nn.Linear(C.n_embd, C.n_embd, bias=False)

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, C.n_head, c // C.n_head).permute(2, 0, 3, 1, 4)
        if C.attn == "flex":
            y = flex_attention(q, k, v, block_mask=mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C.n_embd), nn.LayerNorm(C.n_embd)
        self.attn = Attn()
        self.mlp = nn.Sequential(nn.Linear(C.n_embd, 4 * C.n_embd), nn.GELU(),
                                 nn.Linear(4 * C.n_embd, C.n_embd))

    def forward(self, x, mask):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(C.vocab_size, C.n_embd)
        self.wpe = nn.Embedding(C.block_size, C.n_embd)
        self.blocks = nn.ModuleList(Block() for _ in range(C.n_layer))
        self.ln_f = nn.LayerNorm(C.n_embd)
        self.head = nn.Linear(C.n_embd, C.vocab_size, bias=False)

    def forward(self, idx, targets, mask):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x, mask)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

    def estimate_mfu(self, fwdbwd_per_iter, dt):  # nanoGPT's formula (PaLM appendix B)
        n = sum(p.numel() for p in self.parameters())
        l, h, q, t = C.n_layer, C.n_head, C.n_embd // C.n_head, C.block_size
        flops_per_iter = (6 * n + 12 * l * h * q * t) * t * fwdbwd_per_iter
        return flops_per_iter / dt / C.peak_flops


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def main():
    device = C.device
    ctx = (torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda"
           else torch.autocast("cpu", enabled=False))
    torch.manual_seed(1337)
    ckpt_path = os.path.join(C.out_dir, "ckpt.pt")
    iter_num, best_val = 0, 1e9
    model = GPT().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=C.learning_rate, fused=device == "cuda")
    print(f"number of parameters: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M", flush=True)
    print(f"tokens per iteration will be: {C.gradient_accumulation_steps * C.batch_size * C.block_size:,}",
          flush=True)
    if C.init_from == "resume":
        print(f"Resuming training from {C.out_dir}", flush=True)
        ck = torch.load(ckpt_path, map_location=device)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        iter_num, best_val = ck["iter_num"], ck["best_val_loss"]
    mask = create_block_mask(causal, None, None, C.block_size, C.block_size, device=device) \
        if C.attn == "flex" else None
    raw = model
    if C.compile:
        print("compiling the model... (takes a ~minute)", flush=True)
        model = torch.compile(model)
    gen = torch.Generator(device=device).manual_seed(iter_num)

    def get_batch():
        x = torch.randint(0, C.vocab_size, (C.batch_size, C.block_size), device=device, generator=gen)
        return x, torch.roll(x, -1, 1)

    @torch.no_grad()
    def estimate_loss():
        model.eval()
        out = {}
        for split in ("train", "val"):
            losses = torch.zeros(C.eval_iters)
            for k in range(C.eval_iters):
                with ctx:
                    losses[k] = model(*get_batch(), mask).item()
            out[split] = losses.mean().item()
        model.train()
        return out

    start = time.time()
    last_eval = start
    X, Y = get_batch()
    t0 = time.time()
    local_iter, running_mfu = 0, -1.0
    delay = float(os.environ.get("BENCH_STEP_DELAY") or 0)

    def save():
        print(f"saving checkpoint to {C.out_dir}", flush=True)
        os.makedirs(C.out_dir, exist_ok=True)
        torch.save({"model": raw.state_dict(), "optimizer": opt.state_dict(), "iter_num": iter_num,
                    "best_val_loss": best_val, "config": cfg}, ckpt_path)

    while iter_num < C.max_iters:
        if C.eval_interval and iter_num % C.eval_interval == 0:
            losses = estimate_loss()
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}",
                  flush=True)
            if iter_num > 0 and (losses["val"] < best_val or C.always_save_checkpoint):
                best_val = min(best_val, losses["val"])
                save()
            t0 = time.time()
        for _ in range(C.gradient_accumulation_steps):
            with ctx:
                loss = model(X, Y, mask) / C.gradient_accumulation_steps
            X, Y = get_batch()
            loss.backward()
        if delay:
            time.sleep(delay)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if iter_num % C.log_interval == 0:
            lossf = loss.item() * C.gradient_accumulation_steps
            if local_iter >= 5:
                mfu = raw.estimate_mfu(C.batch_size * C.gradient_accumulation_steps, dt)
                running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
            print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms, mfu {running_mfu * 100:.2f}%",
                  flush=True)
        iter_num += 1
        local_iter += 1
        now = time.time()
        if local_iter == 1:  # the first iteration compiles: the clocks start after it
            last_eval = start = now
        if not C.eval_interval and C.eval_interval_s and now - last_eval >= C.eval_interval_s:
            losses = estimate_loss()
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}",
                  flush=True)
            best_val = min(best_val, losses["val"])
            save()
            last_eval = time.time()
            t0 = time.time()
        if C.time_limit and now - start >= C.time_limit:
            break
    print(f"finished at iter {iter_num}", flush=True)


if __name__ == "__main__":
    main()
