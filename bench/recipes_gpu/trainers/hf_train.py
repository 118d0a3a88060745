"""A tiny, download-free training script in the shape of Hugging Face's example
scripts (run_clm.py): ``HfArgumentParser`` over our data/model arguments and the real
``TrainingArguments``, so every flag is HF's own (``--output_dir``,
``--per_device_train_batch_size``, ``--max_steps``, ``--save_steps``,
``--resume_from_checkpoint``, ...), plus ``--max_seq_length`` as run_clm's data
argument. A LlamaForCausalLM built from a config (random init) with
``attn_implementation="flex_attention"`` (under TORCHDYNAMO_DISABLE=1 flex_attention
runs eagerly: really slower), random tokens made in code, the Trainer's own tqdm bar
(redrawn with ``\\r``), ``checkpoint-N/`` directories (``trainer_state.json`` last).

``BENCH_STEP_DELAY`` (seconds, default 0) sleeps after each step: only for the
CPU rehearsal of the device driver, where no compiled/eager gap exists.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch
from transformers import (HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments)

from hf_trainer import RandomTokens  # bench/traces/hf_trainer.py, synced beside this script


@dataclass
class DataArguments:
    max_seq_length: int = field(default=1024, metadata={"help": "tokens per sequence"})
    vocab_size: int = field(default=8192)
    hidden_size: int = field(default=512)
    num_layers: int = field(default=8)
    num_heads: int = field(default=8)
    attn: str = field(default="flex_attention")


class StepDelay(TrainerCallback):
    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kw):
        time.sleep(self.seconds)


def main():
    data, args = HfArgumentParser((DataArguments, TrainingArguments)).parse_args_into_dataclasses()
    cfg = LlamaConfig(vocab_size=data.vocab_size, hidden_size=data.hidden_size,
                      intermediate_size=3 * data.hidden_size, num_hidden_layers=data.num_layers,
                      num_attention_heads=data.num_heads, num_key_value_heads=data.num_heads,
                      max_position_embeddings=data.max_seq_length)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation=data.attn)
    import transformers
    print(f"hf_train: transformers {transformers.__version__}, torch {torch.__version__}, attn {data.attn}, "
          f"params {sum(x.numel() for x in model.parameters()) / 1e6:.1f}M, tokens/step "
          f"{args.per_device_train_batch_size * data.max_seq_length * args.gradient_accumulation_steps}",
          flush=True)
    steps = args.max_steps if args.max_steps > 0 else 10 ** 6
    delay = float(os.environ.get("BENCH_STEP_DELAY") or 0)
    trainer = Trainer(model=model, args=args,
                      train_dataset=RandomTokens(steps * args.per_device_train_batch_size
                                                 * args.gradient_accumulation_steps,
                                                 data.max_seq_length, data.vocab_size),
                      callbacks=[StepDelay(delay)] if delay else [])
    if args.resume_from_checkpoint:
        print(f"hf_train: resuming from {args.resume_from_checkpoint}", flush=True)
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    print("hf_train: done", flush=True)


if __name__ == "__main__":
    main()
