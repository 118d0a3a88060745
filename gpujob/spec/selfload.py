"""Trainers that load a checkpoint by themselves at a fresh start (pure; issue 38 row 3).

gpujob never passes an earlier job's checkpoint to a fresh job, but some trainers look
for one on their own. What each recipe's trainer does at a fresh start, as far as its
command says:

- torchtitan loads the newest step-N of its checkpoint folder whenever saving is on.
  The recipe gives each job a folder of its own (``checkpoint/{job_id}``); a command
  that names its own ``--checkpoint.folder`` without ``{job_id}`` shares it with every
  earlier job.
- HF's example scripts of transformers 4.x (``run_clm.py`` and the scripts made from
  them) take the newest ``checkpoint-N`` of ``--output_dir`` unless
  ``--overwrite_output_dir`` is given (5.x dropped both; ``Trainer.train(
  resume_from_checkpoint=True)`` still takes the newest there). The recipe gives each job
  its own ``--output_dir OUT/{job_id}`` when the command names one; without one (HF's
  default ``trainer_output``), or with a spec's own checkpoint path, the dir is shared.
- nanoGPT started with ``--init_from=resume`` loads ``OUT/ckpt.pt`` (``--out_dir``, default
  ``out``), and every save rewrites that one file. The recipe gives each job its own
  ``--out_dir=OUT/{job_id}`` (``submit --resume-from``'s checkpoint is copied there before
  the trainer starts); a command whose ``--out_dir`` has no ``{job_id}``, with a spec's own
  checkpoint path, shares the file with every earlier job.
- Lightning loads what ``--ckpt_path`` names.
- SpecForge loads what ``training.resume_from=`` names.

``self_loads`` says which of these holds for a command (one phrase), or None.
"""

from __future__ import annotations

import shlex


def _argv(command) -> list:
    if isinstance(command, list):
        return [str(a) for a in command]
    try:
        return shlex.split(command or "")
    except ValueError:
        return (command or "").split()


def _value(argv: list, *names: str):
    """The value of the last ``--name V`` / ``--name=V`` of any of ``names`` (argparse's
    rule: the last one wins; a recipe appends its own after the command's), else None."""
    found = None
    for i, a in enumerate(argv):
        for name in names:
            if a == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif a.startswith(name + "="):
                found = a[len(name) + 1:]
    return found


def self_loads(recipe: str | None, command) -> str | None:
    """How this trainer picks up a checkpoint by itself at a fresh start, or None."""
    argv = _argv(command)
    if recipe == "torchtitan":
        folder = _value(argv, "--checkpoint.folder")
        if "--checkpoint.no-enable" in argv or "--checkpoint.no_enable" in argv:
            return None
        if folder is not None and "{job_id}" not in folder:
            return (f"torchtitan loads the newest step-N in its checkpoint folder ({folder}, named by the "
                    "command) by itself at a fresh start, an earlier job's included; drop "
                    "--checkpoint.folder (the recipe gives each job its own) or put {job_id} in it")
    if recipe == "hf_trainer":
        if _value(argv, "--resume_from_checkpoint") is not None:
            return "the command's --resume_from_checkpoint is loaded at every start"
        out = _value(argv, "--output_dir", "--output-dir")
        if "--overwrite_output_dir" in argv or (out is not None and "{job_id}" in out):
            return None
        where = out or "trainer_output, the default"
        return ("HF's example scripts of transformers 4.x (run_clm.py and the scripts made from them) load "
                f"the newest checkpoint-N of --output_dir ({where}) by themselves "
                "at a fresh start, an earlier job's included, unless --overwrite_output_dir is given; name "
                "--output_dir in the command and leave train.checkpoint.path to the recipe (each job gets "
                "OUT/{job_id}), or put {job_id} in it")
    if recipe == "nanogpt" and _value(argv, "--init_from") == "resume":
        where = _value(argv, "--out_dir") or "out"
        if "{job_id}" not in where:
            return (f"nanoGPT started with --init_from=resume loads {where}/ckpt.pt at a fresh start, "
                    "whoever wrote it")
    if recipe == "lightning" and _value(argv, "--ckpt_path") is not None:
        return "Lightning loads the command's --ckpt_path at every start"
    if recipe == "specforge" and any(a.startswith("training.resume_from=") for a in argv):
        return "SpecForge loads the command's training.resume_from at every start"
    return None


def earlier_note(recipe: str | None, command) -> str:
    """The end of submit's note on checkpoints earlier jobs left: what really happens."""
    why = self_loads(recipe, command)
    if why is None:
        return "this job never resumes from them (gpujob submit --resume-from PATH|JOB to do so)"
    return f"gpujob never passes them to this job, but {why}"


#: where each recipe's trainer reads its save interval (in steps) and its run length from the command
SAVE_FLAGS = {"hf_trainer": (("--save_steps",), ("--max_steps",)),
              "nanogpt": (("--eval_interval",), ("--max_iters",)),
              "lightning": (("--checkpoint.every_n_train_steps", "--trainer.callbacks.every_n_train_steps",
                             "--model_checkpoint.every_n_train_steps"), ("--trainer.max_steps",)),
              "torchtitan": (("--checkpoint.interval",), ("--training.steps",))}


def _int_of(argv: list, names: tuple):
    for n in names:
        v = _value(argv, n)
        if v is not None:
            try:
                return int(float(v))
            except ValueError:
                return None
    return None


def save_warning(recipe: str | None, command, waits: bool, hold_limit: float) -> str | None:
    """--plan's warning when the command's save interval (read by the recipe) means a
    decided rollback would wait for a checkpoint that never comes: the interval is beyond
    the run's length, so it waits the whole hold limit on the slow profile."""
    if not waits or recipe not in SAVE_FLAGS:
        return None
    argv = _argv(command)
    every, length = (_int_of(argv, names) for names in SAVE_FLAGS[recipe])
    if every is None or length is None or every <= length:
        return None
    flag = next(n for n in SAVE_FLAGS[recipe][0] if _value(argv, n) is not None)
    return (f"the command saves every {every} steps ({flag}) and runs {length}: no checkpoint comes before "
            f"it ends, so a rollback decided on a slow profile waits the whole hold limit ({hold_limit:g}s, "
            "rollback.wait_for_checkpoint) on it; save more often, or set rollback.wait_for_checkpoint: "
            "false")


def plan_warnings(spec) -> list:
    """--plan's warnings of this module for a JobSpec."""
    from gpujob.agent.judge.checkpoint import hold_limit
    ck = spec.train.checkpoint
    late = save_warning(spec.recipe, spec.train.command, bool(ck and spec.rollback.wait_for_checkpoint),
                        hold_limit(ck.every) if ck else 0.0)
    return [late] if late else []
