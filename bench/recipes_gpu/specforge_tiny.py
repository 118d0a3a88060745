"""A tiny, download-free SpecForge 0.2.0 offline DFlash run: target model, features, run.yaml.

    python3 specforge_tiny.py --out DIR [--device cuda|cpu] [--samples N] [--seq L]

writes, using only the standard library, torch and transformers:
  DIR/target/     a Qwen3 causal LM with random weights (save_pretrained: config.json and
                  model.safetensors with untied model.embed_tokens.weight and lm_head.weight,
                  which SpecForge's DFlash path loads as the frozen target embedding and head).
                  No tokenizer: offline DFlash loads one only to find a MASK id when
                  model.mask_token_id is unset, and run.yaml sets it.
  DIR/features/   one sample_NNNNN.ckpt per sample, the dict SpecForge's offline reader lists
                  and its DFlash normaliser reads: input_ids [L] int64, loss_mask [L] int64,
                  hidden_states [L, n*H] (n = the drafter's target layers, here 1; H = hidden).
  DIR/run.yaml    jobs/dflash/run.yaml's fields at tiny sizes, one process.
and prints `tokens_per_sample=X`: the mean input_ids length, what throughput.tokens_per_step
must be (SpecForge logs samples/s).

The device call (one H200; from the repo root; carry [".whl"], 3.2 MiB: specforge_wheels.txt):

  bash bench/recipes_gpu/specforge_device.sh     # OUT=/tmp/sfout by default; e.g. OUT=$OUT/sf

which runs, in order (W=/tmp/sfw; python3 below stands for its absolute path, as the script
writes it into the profiles: the job's PATH is the container's login one):
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
  python3 bench/recipes_gpu/specforge_tiny.py --out /tmp/sfw/tiny --device cuda   # -> TPS
  # hosts.yaml: lab/box of kind local, root /tmp/sfw/root; GPUJOB_HOSTS, XDG_STATE_HOME set
  python3 -m gpujob.entry submit jobs/dflash.yaml -t lab/box \
    --set workdir=/tmp/sfw/job1 --set profile=compiled \
    --set 'train.command=python -m specforge.cli train -c /tmp/sfw/tiny/run.yaml output_dir={workdir}/outputs run_id=dflash' \
    --set throughput.tokens_per_step=$TPS \
    --set 'requirements=[]' --set env.PYTHONPATH=/tmp/site \
    --set "profiles=[{name: compiled, system_site_packages: true, python: python3},
                     {name: broken, system_site_packages: true, python: python3, env: {TORCHDYNAMO_DISABLE: '1'}}]" \
    --set 'rollback.fallback=[compiled]' \
    --set throughput.initial_delay=15s --set throughput.good_after=20s --set throughput.settle.timeout=30s \
    --set throughput.no_data_timeout=120s --set train.checkpoint.every=10s
  # act 1 (above): wait for the known_good event, gpujob stop; act 2: the same with
  #   --set workdir=/tmp/sfw/job2 --set profile=broken: gpujob rolls it back to compiled by itself
  #   and resumes from outputs/dflash-stepN; stopped 20 s after its rollback_timing event.
--set takes a YAML value, so `profiles=[...]` replaces the whole list (lists replace); the spec's
own `profile: cu128` must be --set too: with --profile compiled and no --set profile, submit
refuses ("profile: 'cu128' is not a profile"), the spec's key being checked against the new
list. env.PYTHONPATH is needed: the job's environment is the container's login environment, not
the controller's.
"""  # noqa: E501 (two shell lines above: a quoted --set value cannot be wrapped)
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: the tiny target: Qwen3 (DFlash's drafter is Qwen3-shaped and copies these fields)
TARGET = {"vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
          "max_position_embeddings": 4096, "tie_word_embeddings": False}
MASK_TOKEN_ID = TARGET["vocab_size"] - 1  # never produced by the features below


def build_target(out: Path, seed: int) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3Config(**TARGET, pad_token_id=0, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)


def build_features(out: Path, samples: int, seq: int, seed: int) -> float:
    """One .ckpt per sample; lengths vary between seq/2 and seq. Returns the mean length."""
    import torch
    g = torch.Generator().manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    hidden = TARGET["hidden_size"]  # 1 drafter layer -> 1 target layer's hidden state
    total = 0
    for i in range(samples):
        length = int(torch.randint(max(seq // 2, 4), seq + 1, (1,), generator=g))
        ids = torch.randint(3, MASK_TOKEN_ID, (length,), generator=g, dtype=torch.int64)
        mask = torch.ones(length, dtype=torch.int64)
        mask[: length // 4] = 0  # a prompt part that is not supervised, like a chat turn
        states = torch.randn(length, hidden, generator=g).to(torch.bfloat16)
        torch.save({"input_ids": ids, "loss_mask": mask, "hidden_states": states},
                   str(out / f"sample_{i:05d}.ckpt"))
        total += length
    return total / samples


def run_yaml(out: Path, seq: int, args) -> str:
    """jobs/dflash/run.yaml's fields, tiny (JSON is YAML: no PyYAML needed to write it)."""
    cfg = {
        "run_id": "dflash", "output_dir": "./outputs",
        "model": {"target_model_path": str(out / "target"), "draft_num_hidden_layers": 1,
                  "draft_block_size": 16, "torch_dtype": "bfloat16", "mask_token_id": MASK_TOKEN_ID},
        "data": {"hidden_states_path": str(out / "features"), "max_length": seq, "chat_template": "qwen",
                 "dataloader_num_workers": args.workers},
        "training": {"strategy": "dflash",
                     "attention_backend": "flex_attention" if args.device == "cuda" else "sdpa",
                     "batch_size": args.batch, "num_epochs": args.epochs, "max_steps": args.max_steps,
                     "learning_rate": 6.0e-4, "save_interval": args.save_interval, "max_checkpoints": 3,
                     "log_interval": 10, "num_anchors": 64},
        "tracking": {"report_to": "none"},
        "deployment": {"mode": "local_colocated", "trainer": {"nnodes": 1, "nproc_per_node": 1}},
    }
    return json.dumps(cfg, indent=2) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: flex_attention (the compiled path); cpu: sdpa")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--epochs", type=int, default=100000, help="SpecForge stops at max_steps first")
    p.add_argument("--max-steps", type=int, default=100000)
    p.add_argument("--save-interval", type=int, default=100,
                   help="SpecForge saves every N steps (the H200 runs tens of steps a second)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.samples < 1 or args.seq < 8:
        print("specforge_tiny: --samples must be >= 1 and --seq >= 8", file=sys.stderr)
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    build_target(out / "target", args.seed)
    mean = build_features(out / "features", args.samples, args.seq, args.seed)
    (out / "run.yaml").write_text(run_yaml(out, args.seq, args))
    print(f"target={out / 'target'} features={out / 'features'} run_yaml={out / 'run.yaml'}")
    print(f"tokens_per_sample={mean:g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
