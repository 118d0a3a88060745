"""The recipe for HF transformers.Trainer scripts (run_clm and the like)."""

from __future__ import annotations

import shlex

from gpujob.spec.recipes.base import (COMPILE, SAFE, Recipe, RecipeError, append, argv_of,
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


def per_job_dir(data: dict, argv: list) -> tuple:
    """(the output dir the trainer writes into, the flag that names it, or None when the
    command is left as it is). HF's example scripts of transformers 4.x (run_clm.py and
    the scripts copied from them) call get_last_checkpoint(--output_dir) at every start
    without --overwrite_output_dir and resume from the newest checkpoint-N there, an
    earlier job's included (5.x dropped that flag and that look; Trainer.train(
    resume_from_checkpoint=True) still takes the newest of --output_dir). So a command that
    names --output_dir gets OUT/{job_id}: each job writes into, and can only find, its own.
    Left alone: a dir with {job_id} in it already, and a spec whose own train.checkpoint
    (a path, or null) says where checkpoints go; without --output_dir the script writes
    into HF's default trainer_output (submit says that it may load an earlier job's there)."""
    names = [a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in ("--output_dir", "--output-dir")]
    given = flag(argv, "--output_dir", "--output-dir")
    ck = (data.get("train") or {}).get("checkpoint", {})
    if given is None or "{job_id}" in given or not (isinstance(ck, dict) and "path" not in ck):
        return given or "trainer_output", None
    return given.rstrip("/") + "/{job_id}", names[-1]


def append_dir(command, name: str, out: str):
    """The command with ``name OUT/{job_id}`` appended (the last one wins, as in argparse); a
    dir of other characters than safe ones is quoted up to the placeholder, which stays bare
    for gpujob to fill in (a placeholder inside quotes is refused at submit)."""
    head = out[:-len("{job_id}")]
    if isinstance(command, list) or SAFE.fullmatch(head):
        return append(command, [name, out])
    return f"{command} {name} {shlex.quote(head)}{{job_id}}"


def derive(data: dict) -> dict:
    """The spec's data -> the recipe's fragment (RecipeError for a spec it cannot complete)."""
    command = (data.get("train") or {}).get("command")
    argv = argv_of(command)
    out, rewrite = per_job_dir(data, argv)
    out_dir = out.replace("{workdir}/", "").rstrip("/")
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
    # directory gpujob chose: this job's newest finished, or the one submit --resume-from named
    # (another job's OUT/JOB/checkpoint-N)
    train: dict = {"checkpoint": {"path": f"{out_dir}/checkpoint-*", "done_file": "trainer_state.json",
                                  "every": "15m"},
                   "resume_args": ["--resume_from_checkpoint", "{resume_from}"]}
    if rewrite is not None:
        train["command"] = append_dir(command, rewrite, out)
    train.update(standby(command, PRELOAD))
    warm = append(command, ["--max_steps", "3", "--save_strategy", "no", "--report_to", "none",
                            "--output_dir", "{workdir}/gpujob-warmup"])
    frag.update(train=train,
                warmup={"command": warm, "when": "cold", "timeout": "30m", "ignore_flags": UNCOMPILED,
                        "scratch": "gpujob-warmup"})  # 4.x example scripts refuse a non-empty --output_dir
    return frag


RECIPE = Recipe(name="hf_trainer", trainer="transformers", revision=5,
                read_from="transformers 5.8.1, 5.17 and 5.18 (Trainer); 4.57's example scripts (their own "
                          "resume from --output_dir)",
                proven_on="transformers 5.17.0, a run_clm-style script, on one H200 through gpujob, "
                          "2026-12-02 (torch 2.11.0+cu130; BENCHMARKS.md)",
                summary="transformers.Trainer scripts: the tqdm bar's it/s x tokens per step (read from "
                        "--per_device_train_batch_size, --max_seq_length, --gradient_accumulation_steps, "
                        "--nproc_per_node), an eval's {'eval_loss': ...} line pauses judging, "
                        "checkpoint-N/ directories finished by trainer_state.json in an --output_dir "
                        "of each job's own (OUT/{job_id}: example scripts resume from the newest there "
                        "by themselves, so never an earlier job's), --resume_from_checkpoint {resume_from}",
                derive=derive, versions=("5.8.1", "5.17"),
                preload=tuple(PRELOAD),
                sample_command="python train.py --output_dir out --per_device_train_batch_size 8 "
                               "--max_seq_length 1024")
