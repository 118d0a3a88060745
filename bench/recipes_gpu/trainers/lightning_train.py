"""A tiny, download-free LightningCLI script (``python lightning_train.py fit ...``):
a small GPT whose attention is flex_attention under a causal block mask, compiled
in place (``nn.Module.compile``) in ``configure_model`` (under TORCHDYNAMO_DISABLE=1 that is a
no-op and flex_attention runs eagerly: really slower), random tokens made in code.
Everything else is Lightning's own: the CLI's ``--trainer.*`` / ``--model.*`` /
``--data.*`` flags, the TQDM progress bar's it/s, a ``ModelCheckpoint`` given as
users give it (``--trainer.callbacks+=ModelCheckpoint
--trainer.callbacks.every_n_train_steps=N``) writing
``<root>/lightning_logs/version_N/checkpoints/epoch=E-step=S.ckpt`` (the newest
kept), ``--ckpt_path`` to resume.

``BENCH_STEP_DELAY`` (seconds) sleeps after each step: only for the CPU rehearsal
of the device driver.
"""

from __future__ import annotations

import os
import time

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.cli import LightningCLI
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, attn: str):
        super().__init__()
        self.heads, self.attn = heads, attn
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = flex_attention(q, k, v, block_mask=mask) if self.attn == "flex" else \
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyGPT(L.LightningModule):
    def __init__(self, vocab: int = 8192, dim: int = 512, layers: int = 8, heads: int = 8, seq: int = 1024,
                 lr: float = 3e-4, compile: bool = True, attn: str = "flex"):
        super().__init__()
        self.save_hyperparameters()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, attn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.mask = None
        self.delay = float(os.environ.get("BENCH_STEP_DELAY") or 0)

    def configure_model(self):
        # nn.Module.compile() compiles in place: the state_dict keys stay the same whatever the
        # profile (torch.compile(block) would wrap them as _orig_mod.*, and under TORCHDYNAMO_DISABLE=1
        # it does not wrap: a checkpoint of one profile would not load under the other; seen on the
        # H200, the rollback's resume died in load_state_dict)
        if self.hparams.compile:
            for b in self.blocks:
                b.compile()

    def forward(self, idx):
        if self.mask is None and self.hparams.attn == "flex":
            s = self.hparams.seq
            self.mask = create_block_mask(causal, None, None, s, s, device=idx.device)
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x, self.mask)
        return self.head(self.ln_f(x))

    def training_step(self, batch, _):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
        self.log("loss", loss, prog_bar=True)
        if self.delay:
            time.sleep(self.delay)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class RandomTokens(L.LightningDataModule):
    def __init__(self, batch_size: int = 16, seq: int = 1024, vocab: int = 8192, length: int = 10 ** 7):
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self):
        h = self.hparams

        class Tokens(torch.utils.data.Dataset):
            def __len__(self):
                return h.length

            def __getitem__(self, i):
                g = torch.Generator().manual_seed(i)
                ids = torch.randint(0, h.vocab, (h.seq + 1,), generator=g)
                return ids[:-1], ids[1:]
        return torch.utils.data.DataLoader(Tokens(), batch_size=h.batch_size, num_workers=2)


class CLI(LightningCLI):
    def add_arguments_to_parser(self, parser):
        parser.link_arguments("model.seq", "data.seq")
        parser.link_arguments("model.vocab", "data.vocab")


if __name__ == "__main__":
    print(f"lightning_train: lightning {L.__version__}, torch {torch.__version__}", flush=True)
    CLI(TinyGPT, RandomTokens)
