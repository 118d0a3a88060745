"""Trainers that load a checkpoint by themselves at a fresh start (pure; issue 38 row 3).

gpujob never passes an earlier job's checkpoint to a fresh job, but some trainers look
for one on their own. What each recipe's trainer does at a fresh start, as far as its
command says:

- torchtitan loads the newest step-N of its checkpoint folder whenever saving is on.
  The recipe gives each job a folder of its own (``checkpoint/{job_id}``); a command
  that names its own ``--checkpoint.folder`` without ``{job_id}`` shares it with every
  earlier job.
- HF's example scripts (``run_clm.py`` and the like) take the newest ``checkpoint-N``
  of ``--output_dir`` unless ``--overwrite_output_dir`` is given; a script that calls
  ``Trainer.train()`` without ``resume_from_checkpoint`` loads none.
- nanoGPT loads ``out/ckpt.pt`` when started with ``--init_from=resume``.
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


def _value(argv: list, name: str):
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1:]
    return None


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
    if recipe == "hf_trainer" and "--overwrite_output_dir" not in argv:
        if _value(argv, "--resume_from_checkpoint") is not None:
            return "the command's --resume_from_checkpoint is loaded at every start"
        return ("HF's example scripts (run_clm.py and the like) load the newest checkpoint-N of --output_dir "
                "by themselves at a fresh start, an earlier job's included, unless --overwrite_output_dir is "
                "given (a script that calls Trainer.train() alone loads none)")
    if recipe == "nanogpt" and _value(argv, "--init_from") == "resume":
        return ("nanoGPT started with --init_from=resume loads out_dir's ckpt.pt at a fresh start, whoever "
                "wrote it")
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
