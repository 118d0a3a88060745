"""The recipe for SpecForge (`specforge train`, DFlash and its other algorithms)."""

from __future__ import annotations

import shlex

from gpujob.spec.recipes.base import (COMPILE, SAFE, Recipe, RecipeError, append, argv_of, dotted,
                                      own_rate, standby)

#: what a fresh interpreter of the trainer imports before its first step (the standby)
PRELOAD = COMPILE + ["torch.nn.attention.flex_attention", "transformers", "accelerate.utils",
                     "specforge.cli", "specforge.application", "specforge.training.trainer",
                     "specforge.algorithms.dflash"]


SPECFORGE_PATTERN = r"^(?:\[?rank\d+\]?:\s*)?step (?P<step>\d+): \{.*'perf/global_samples_per_second': " \
                    r"(?P<value>[0-9.eE+-]+)"


#: SpecForge keys that change when and where a run saves, logs, evaluates and stops, nothing
#: compiled: a change of them alone keeps the warmup's cache warm (warmup.ignore_flags)
UNCOMPILED = ["training.max_steps", "training.save_interval", "training.eval_interval",
              "training.log_interval",
              "training.num_epochs", "training.resume_from", "output_dir", "run_id", "report_to"]


def per_job_dir(data: dict, argv: list) -> tuple:
    """(the output dir the trainer writes into, whether the command gets it appended).
    SpecForge 0.2.0's save of step N first deletes every {run_id}-stepM with M >= N in
    output_dir: a fresh job of the same output_dir and run_id deleted an earlier job's
    checkpoints at its first save. So the command gets output_dir=OUT/{job_id} appended
    (its overrides are last-wins): each job saves into, and deletes in, its own dir only.
    Left alone: a dir with {job_id} in it already, and a spec whose own train.checkpoint
    (a path, or null) says where checkpoints go."""
    given = dotted(argv, "output_dir") or "output"
    ck = (data.get("train") or {}).get("checkpoint", {})
    if "{job_id}" in given or not (isinstance(ck, dict) and "path" not in ck):
        return given, False
    return given.rstrip("/") + "/{job_id}", True


def append_dir(command, out: str):
    """The command with ``output_dir=OUT/{job_id}`` appended; a dir of other characters than
    safe ones is quoted up to the placeholder, which stays bare for gpujob to fill in."""
    head = "output_dir=" + out[:-len("{job_id}")]
    if isinstance(command, list) or SAFE.fullmatch(head):
        return append(command, [head + "{job_id}"])
    return f"{command} {shlex.quote(head)}{{job_id}}"


def derive(data: dict) -> dict:
    """The spec's data -> the recipe's fragment (RecipeError for a spec it cannot complete)."""
    command = (data.get("train") or {}).get("command")
    argv = argv_of(command)
    out_dir, rewrite = per_job_dir(data, argv)
    run_id = dotted(argv, "run_id") or "specforge-run"
    rel = out_dir.replace("{workdir}/", "").rstrip("/")
    # A checkpoint is the directory {run_id}-stepN; rank 0 writes training_state.pt into it
    # after its own training_state_rank0.pt (each by rename), and training.resume_from takes
    # the directory gpujob chose (this job's newest finished). With more than one rank the
    # others' training_state_rank{r}.pt are renamed in during the same collective save, with
    # no barrier before rank 0's done file: so a checkpoint is finished when the done file is
    # there and nothing in the directory has changed for `settle` seconds (the register's
    # rule for every done_file). Run on one GPU; the multi-rank order is from SpecForge
    # 0.2.0's training/checkpoint.py.
    train: dict = {"checkpoint": {"path": f"{rel}/{run_id}-step*", "done_file": "training_state.pt",
                                  "every": "15m"},
                   "resume_args": ["training.resume_from={resume_from}"]}
    if dotted(argv, "training.log_interval") is None:
        train["command"] = append(command, ["training.log_interval=10"])
    train.update(standby(command, PRELOAD))
    warm = append(train.get("command", command),
                  ["training.max_steps=3", "training.save_interval=0", "training.eval_interval=0",
                   "output_dir={workdir}/gpujob-warmup", "run_id=gpujob-warmup"])
    if rewrite:
        train["command"] = append_dir(train.get("command", command), out_dir)
    frag = {"train": train,
            "warmup": {"command": warm, "when": "cold", "timeout": "30m", "ignore_flags": UNCOMPILED}}
    if own_rate(data, "regex"):
        return frag
    if "tokens_per_step" not in (data.get("throughput") or {}):
        raise RecipeError("throughput.tokens_per_step", "missing (required) for recipe specforge: the mean "
                          "tokens per sample of data.hidden_states_path (SpecForge logs samples/s)")
    # every rank prints the same global rate: one rank's line is the sample
    return dict(frag, throughput={"format": "regex", "pattern": SPECFORGE_PATTERN, "ranks": "first"})


RECIPE = Recipe(name="specforge", trainer="specforge", revision=4,
                read_from="specforge 0.2.0 (PyPI, Aug 2026)",
                proven_on="specforge 0.2.0, offline DFlash, 1 process, on one H200 through gpujob, "
                          "2026-12-02 (torch 2.11.0+cu130; BENCHMARKS.md)",
                summary="`specforge train -c RUN.yaml` / `python -m specforge.cli train`: samples/s from "
                        "the per-rank `step N: {...}` line (the first rank's) x tokens per sample, "
                        "{run_id}-stepN/ checkpoints finished by training_state.pt in an output_dir "
                        "of each job's own (OUT/{job_id}: a save deletes the run's later steps there, "
                        "so never an earlier job's), "
                        "training.resume_from={resume_from}",
                derive=derive, versions=("0.2.0",),
                preload=tuple(PRELOAD),
                sample_command="python -m specforge.cli train -c run.yaml output_dir={workdir}/outputs "
                               "run_id=dflash")
