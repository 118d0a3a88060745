"""A tiny, download-free Hugging Face ``transformers.Trainer`` run (for trace recording).

A LlamaForCausalLM built from a config (random init) with
``attn_implementation="flex_attention"`` (under TORCHDYNAMO_DISABLE=1 flex_attention
runs eagerly, really slower), random token data made in code, the Trainer's own
tqdm bar (forced: ``disable_tqdm=False``, redrawn with ``\\r`` even without a TTY),
``logging_steps`` dict lines, and ``checkpoint-N/`` saves (``trainer_state.json``
last) about every ``--save-every-s`` seconds (a callback sets ``should_save``: the
Trainer's own save path writes them), ``save_total_limit=2``. ``--resume`` passes
``resume_from_checkpoint=True``. Training stops ``--time-limit`` seconds after the first
step (which compiles).
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seq: int, vocab: int):
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, self.vocab, (self.seq,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


class Clock(TrainerCallback):
    """Stop after time_limit seconds; ask for a save every save_every seconds."""

    def __init__(self, time_limit: float, save_every: float):
        self.time_limit, self.save_every = time_limit, save_every
        self.start = self.last_save = None

    def on_step_end(self, args, state, control, **kw):
        now = time.time()
        if self.start is None:  # the clocks start after the first step (it compiles)
            self.start = self.last_save = now
        if self.save_every and now - self.last_save >= self.save_every:
            control.should_save = True
        if self.time_limit and now - self.start >= self.time_limit:
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kw):
        self.last_save = time.time()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="hf_out")
    p.add_argument("--time-limit", type=float, default=90)
    p.add_argument("--save-every-s", type=float, default=15)
    p.add_argument("--attn", default="flex_attention")
    p.add_argument("--compile", action="store_true", help="TrainingArguments(torch_compile=True)")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--max-steps", type=int, default=200000)
    p.add_argument("--logging-steps", type=int, default=50)
    p.add_argument("--cpu", action="store_true")
    a = p.parse_args()
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=3 * a.hidden,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.heads, max_position_embeddings=a.seq)
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation=a.attn)
    print(f"hf_trainer: torch {torch.__version__}, attn {a.attn}, compile {a.compile}, "
          f"params {sum(x.numel() for x in model.parameters()) / 1e6:.1f}M, "
          f"tokens/step {a.batch * a.seq}", flush=True)
    args = TrainingArguments(
        output_dir=a.out, max_steps=a.max_steps, per_device_train_batch_size=a.batch,
        learning_rate=3e-4, warmup_steps=10, logging_steps=a.logging_steps,
        save_strategy="steps", save_steps=10 ** 9, save_total_limit=2,
        bf16=not a.cpu, use_cpu=a.cpu, torch_compile=a.compile, disable_tqdm=False,
        report_to="none", dataloader_num_workers=2 if not a.cpu else 0, seed=0)
    trainer = Trainer(model=model, args=args,
                      train_dataset=RandomTokens(a.max_steps * a.batch, a.seq, a.vocab),
                      callbacks=[Clock(a.time_limit, a.save_every_s)])
    trainer.train(resume_from_checkpoint=True if a.resume else None)
    print("hf_trainer: done", flush=True)


if __name__ == "__main__":
    main()
