"""The recipe for HF transformers.Trainer scripts (run_clm and the like)."""

from __future__ import annotations

from gpujob.spec.recipes.base import (COMPILE, Recipe, RecipeError, append, argv_of,
                                      as_int, flag, own_rate, standby)

#: what a fresh interpreter of the trainer imports before its first step (the standby)
PRELOAD = COMPILE + ["transformers", "transformers.trainer"]


HF_EVAL_PATTERN = r"^\{'eval_loss'"

#: TrainingArguments that change when and where a run saves, logs and stops, nothing compiled:
#: a change of them alone keeps the warmup's cache warm (warmup.ignore_flags)
UNCOMPILED = ["--save_steps", "--save_total_limit", "--save_strategy", "--logging_steps",
              "--logging_strategy", "--logging_dir", "--eval_steps", "--eval_strategy",
              "--evaluation_strategy", "--output_dir", "--output-dir", "--report_to", "--run_name",
              "--max_steps", "--num_train_epochs", "--resume_from_checkpoint", "--seed"]


def _nproc(argv: list) -> int:
    return as_int(flag(argv, "--nproc_per_node", "--nproc-per-node")) or 1


def derive(data: dict) -> dict:
    """The spec's data -> the recipe's fragment (RecipeError for a spec it cannot complete)."""
    command = (data.get("train") or {}).get("command")
    argv = argv_of(command)
    out_dir = (flag(argv, "--output_dir", "--output-dir") or "output").replace("{workdir}/", "").rstrip("/")
    tput = dict(data.get("throughput") or {})
    frag: dict = {"throughput": {"pause_pattern": HF_EVAL_PATTERN}}  # an evaluation's metrics line
    if not own_rate(data, "tqdm"):
        frag["throughput"]["format"] = "tqdm"  # the bar's it/s
        if "tokens_per_step" not in tput:
            bs = as_int(flag(argv, "--per_device_train_batch_size"))
            seq = as_int(flag(argv, "--max_seq_length", "--max_length", "--block_size"))
            ga = as_int(flag(argv, "--gradient_accumulation_steps")) or 1
            if not (bs and seq):
                raise RecipeError("throughput.tokens_per_step",
                                  "missing (required) for recipe hf_trainer: the command gives no "
                                  "--per_device_train_batch_size and --max_seq_length (or --block_size) "
                                  "to compute it from")
            frag["throughput"]["tokens_per_step"] = bs * seq * ga * _nproc(argv)
    # A checkpoint is the directory checkpoint-N; trainer_state.json is the last file a save
    # writes: its presence is the "finished" rule. --resume_from_checkpoint gets the
    # directory gpujob chose (HF's example scripts would otherwise take the newest of
    # --output_dir by themselves, an earlier job's included).
    train: dict = {"checkpoint": {"path": f"{out_dir}/checkpoint-*", "done_file": "trainer_state.json",
                                  "every": "15m"},
                   "resume_args": ["--resume_from_checkpoint", "{resume_from}"]}
    train.update(standby(command, PRELOAD))
    warm = append(command, ["--max_steps", "3", "--save_strategy", "no", "--report_to", "none",
                            "--output_dir", "{workdir}/gpujob-warmup"])
    frag.update(train=train,
                warmup={"command": warm, "when": "cold", "timeout": "30m", "ignore_flags": UNCOMPILED})
    return frag


RECIPE = Recipe(name="hf_trainer", trainer="transformers", revision=3,
                read_from="transformers 5.8.1 and 5.17 (Trainer)",
                proven_on="transformers 5.17.0, a run_clm-style script, on one H200 through gpujob, "
                          "2026-12-02 (torch 2.11.0+cu130; BENCHMARKS.md)",
                summary="transformers.Trainer scripts: the tqdm bar's it/s x tokens per step (read from "
                        "--per_device_train_batch_size, --max_seq_length, --gradient_accumulation_steps, "
                        "--nproc_per_node), an eval's {'eval_loss': ...} line pauses judging, "
                        "checkpoint-N/ directories finished by trainer_state.json, "
                        "--resume_from_checkpoint {resume_from}",
                derive=derive, versions=("5.8.1", "5.17"),
                preload=tuple(PRELOAD),
                sample_command="python train.py --output_dir out --per_device_train_batch_size 8 "
                               "--max_seq_length 1024")
