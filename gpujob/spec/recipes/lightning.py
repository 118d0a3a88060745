"""The recipe for LightningCLI scripts."""

from __future__ import annotations

from gpujob.spec.recipes.base import Recipe, RecipeError, append, argv_of, flag, own_rate, standby

#: what a fresh interpreter of the trainer imports before its first step (the standby)
PRELOAD = ["torch", "lightning", "lightning.pytorch", "lightning.pytorch.cli"]


#: LightningCLI's progress bar that prints while it runs without a terminal: with rich
#: installed (gpujob's own dependency, and in the CUDA images) Lightning picks its
#: RichProgressBar, which draws nothing into a pipe until the run ends.
LIGHTNING_BAR = "--trainer.callbacks+=TQDMProgressBar"


#: LightningCLI arguments that change when and where a run saves, logs and stops, nothing
#: compiled: a change of them alone keeps the warmup's cache warm (warmup.ignore_flags)
UNCOMPILED = ["--trainer.max_steps", "--trainer.max_epochs", "--trainer.max_time",
              "--trainer.default_root_dir",
              "--trainer.callbacks.every_n_train_steps", "--trainer.callbacks.save_top_k",
              "--trainer.callbacks.dirpath", "--trainer.log_every_n_steps", "--trainer.val_check_interval",
              "--trainer.check_val_every_n_epoch", "--trainer.enable_model_summary", "--trainer.logger",
              "--ckpt_path", "--seed_everything"]


def derive(data: dict) -> dict:
    """The spec's data -> the recipe's fragment (RecipeError for a spec it cannot complete)."""
    command = (data.get("train") or {}).get("command")
    argv = argv_of(command)
    rate = not own_rate(data, "tqdm_steps")
    if rate and "tokens_per_step" not in (data.get("throughput") or {}):
        raise RecipeError("throughput.tokens_per_step", "missing (required) for recipe lightning: its "
                          "progress bar counts steps (it/s), and a LightningModule's batch is not read from "
                          "the command")
    root = flag(argv, "--trainer.default_root_dir") or "lightning_logs"
    root = root.replace("{workdir}/", "").rstrip("/")
    path = (f"{root}/version_*/checkpoints/*.ckpt" if root == "lightning_logs"
            else f"{root}/**/checkpoints/*.ckpt")
    # Each run logs into a new version_N, and `--ckpt_path last` looks only in the new
    # run's own (empty) folder: the resumed run gets the file gpujob chose. A .ckpt is
    # written in one go (Lightning's _atomic_save: the whole file from a buffer, moved into
    # place by an fsspec transaction) and never rewritten: finished once unchanged for 1 s. A
    # fast run saves every few seconds under a new name and deletes the one before (save_top_k
    # 1), so a 5 s settle never finished any: a stop or a rollback had nothing to resume from.
    train: dict = {"checkpoint": {"path": path, "every": "15m", "settle": "1s"},
                   "resume_args": ["--ckpt_path", "{resume_from}"]}
    if rate and not any("ProgressBar" in a for a in argv):
        train["command"] = append(command, [LIGHTNING_BAR])
    train.update(standby(command, PRELOAD))
    # No --trainer.enable_checkpointing false: Lightning refuses it beside a configured
    # ModelCheckpoint (how a run saves every N steps); the warmup's own root dir keeps its saves apart.
    warm = append(train.get("command", command), ["--trainer.max_steps", "3", "--trainer.default_root_dir",
                                                  "{workdir}/gpujob-warmup"])
    frag = {"train": train,
            # emptied before each warmup run: each leaves a version_N with a whole .ckpt (model and
            # optimizer), which would pile up with every cold warmup
            "warmup": {"command": warm, "when": "cold", "timeout": "30m", "ignore_flags": UNCOMPILED,
                       "scratch": "gpujob-warmup"}}
    # the bar's step counter over time, each step once, restored steps not counted
    # (Lightning's it/s is the run's average: smoothing=0; agent/judge/steprate.StepRate)
    return dict(frag, throughput={"format": "tqdm_steps"}) if rate else frag


RECIPE = Recipe(name="lightning", trainer="lightning", revision=6,
                read_from="lightning 2.5 and 2.6.6 (LightningCLI)",
                proven_on="lightning 2.6.6, a LightningCLI script, on one H200 through gpujob, 2026-12-02 "
                          "(torch 2.11.0+cu130; BENCHMARKS.md)",
                summary="LightningCLI scripts: the TQDM progress bar's step counter over time x "
                        "tokens_per_step (its it/s is the run's average; the bar "
                        "added: Lightning's rich bar prints nothing into a pipe), "
                        "version_N/checkpoints/*.ckpt (settled 1 s), --ckpt_path {resume_from}",
                derive=derive, versions=("2.5", "2.6"),
                preload=tuple(PRELOAD),
                sample_command="python main.py fit --config config.yaml")
