"""`gpujob init --recipe R -- COMMAND ...`: a commented spec to start from (pure text)."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from gpujob.spec.recipes.base import RecipeError
from gpujob.spec.recipes.registry import RECIPES, apply

_TOKENS_HINT = {
    "specforge": "the mean tokens per sample of data.hidden_states_path (SpecForge logs samples/s)",
    "hf_trainer": "per_device_train_batch_size x max_seq_length x gradient_accumulation_steps x processes",
    "lightning": "the tokens of one optimizer step over every process (the bar counts steps)",
    "nanogpt": "gradient_accumulation_steps x batch_size x block_size (a config file's values are not read)",
}


#: a module's last part that names no job (``-m torchtitan.train``: the job is "torchtitan")
GENERIC = ("train", "main", "cli", "run", "__main__")


def runnable(command: list) -> tuple:
    """(the command as init writes it, a note or None): a leading ``torchrun`` becomes
    ``python -m torch.distributed.run`` (the same launcher), which runs wherever the
    profile's Python has torch; ``torchrun`` is a console script that a profile with
    system site packages (init's ``base``) may not have on the job's PATH."""
    if command and command[0] == "torchrun":
        return (["python", "-m", "torch.distributed.run", *command[1:]],
                "torchrun written as `python -m torch.distributed.run` (the same launcher): the "
                "profile's python finds it wherever torch is installed, torchrun only where it is on PATH")
    return list(command), None


def job_name(command: list) -> str:
    """The script's (or module's) basename made a valid job name: lowercase letters,
    digits and '-', at most 40 (a module's generic last part gives way to its package:
    ``-m torchtitan.train`` names the job torchtitan)."""
    script = next((a for a in command if a.endswith(".py")), None)
    mods = [command[i + 1] for i, a in enumerate(command[:-1]) if a == "-m"]
    mods = [m for m in mods if m != "torch.distributed.run"]
    if script is None and mods:
        parts = [p for p in mods[-1].split(".") if p]
        while len(parts) > 1 and parts[-1] in GENERIC:
            parts.pop()
        script = ".".join(parts[-1:]) or mods[-1]
    base = (script or (command[0] if command else "job")).rsplit("/", 1)[-1]
    base = re.sub(r"\.py$", "", base).split(".")[-1] if script else base
    name = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-")[:40].strip("-")
    return name or "job"


def spec_text(recipe: str, command: list, *, name: str, target: str, sync: tuple = (),
              own_flags: frozenset | None = None) -> str:
    """The YAML of a spec that uses ``recipe`` for ``command``; it passes `submit --plan`
    as written (the base interpreter's packages, tokens_per_step where the recipe needs it).
    ``sync``: (laptop path relative to the spec, dest in the workdir) of each file to ship;
    ``own_flags``: the flags the script's own argparse defines (None: unknown), so that the
    recipe's warmup and resume flags the script lacks are turned off, not invented."""
    r = RECIPES[recipe]
    command, note = runnable(command)
    cmd = shlex.join(command)
    data: dict[str, Any] = {"recipe": recipe, "train": {"command": cmd}}
    need_tokens = False
    try:
        _, came = apply(data)
    except RecipeError:
        need_tokens = True
        _, came = apply({**data, "throughput": {"tokens_per_step": 1}})
        came = {k: v for k, v in came.items() if k != "throughput.tokens_per_step"}
    off = _lacking(came, cmd, own_flags)
    if off:
        data = {**data, **({"warmup": None} if "warmup" in off else {}),
                "train": dict(data["train"], **({"checkpoint": None} if "checkpoint" in off else {}))}
        _, came = apply(data if not need_tokens else {**data, "throughput": {"tokens_per_step": 1}})
        came = {k: v for k, v in came.items() if k != "throughput.tokens_per_step" or not need_tokens}
    lines = [
        f"# A gpujob spec for a {r.trainer} job (recipe {recipe}, revision {r.revision}).",
        f"# The recipe's conventions were read from {r.read_from}; proven on: {r.proven_on}.",
        "# It fills in what the trainer fixes; every key written here wins over it",
        "# (`gpujob recipes` lists what it sets; `gpujob submit THIS --plan` marks each).",
        "",
        f"recipe: {recipe}",
        f"name: {name}",
        f"target: {json.dumps(target)}            # CHANGE ME: your container (hosts.yaml)",
        "",
        *_sync_lines(sync),
        "# Wheel profiles: the first is where a submit starts; a rollback goes to a known-good one.",
        "profiles:",
        "  - name: base                # the container's own interpreter and packages",
        "    system_site_packages: true",
        "  # - name: cu128             # CHANGE ME: a pinned torch build, e.g.",
        "  #   index_url: https://download.pytorch.org/whl/cu128",
        '  #   packages: ["torch==2.11.0+cu128"]',
        '  #   cuda: "12.8"',
        "",
        "train:",
        f"  command: {json.dumps(cmd)}   # CHANGE ME",
        *([f"  # {note}"] if note else []),
        *([f"  checkpoint: null            # CHANGE ME: the recipe resumes with {off['checkpoint']}, which "
           "the script does not define;", "  #   give its checkpoint {path, every} and resume_args"]
          if "checkpoint" in off else []),
        "",
        *([f"warmup: null                  # CHANGE ME: the recipe's warmup adds {off['warmup']}, which the",
           "#   script does not define; give a warmup command of its own (a few steps, no saves)", ""]
          if "warmup" in off else []),
    ]
    lines += ["throughput:",  # every recipe reads its trainer's rate
              "  min_ratio: 0.8              # CHANGE ME: below 80% of the known-good baseline is a breach"]
    if need_tokens:
        lines.append(f"  tokens_per_step: 4096       # CHANGE ME: "
                     f"{_TOKENS_HINT.get(recipe, 'tokens per step')}")
    # else the plan opens with "a rollback can come before the first checkpoint"
    if "train.checkpoint.path" in came:
        lines += ["", "rollback:",
                  "  wait_for_checkpoint: true    # an automatic rollback waits for this run's first "
                  "checkpoint,", "  #   so the resumed trainer never starts from scratch"]
    lines += ["", "# What the recipe fills in for this command (uncomment a line to change it):"]
    for key, value in came.items():
        lines.append(f"#   {key}: {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def _sync_lines(sync) -> list:
    """The spec's ``sync:``: the files the command names and what its script needs beside it."""
    if not sync:
        return ["# sync:                      # CHANGE ME: the code the command needs (none of its words",
                "#   - {src: ., dest: .}      # is a file here); the workdir holds only what sync ships", ""]
    lines = ["# The files the command names and what its script imports or opens beside it (the",
             "# container's workdir holds only what is shipped; add what else it reads):",
             "sync:"]
    for src, dest in sync:
        lines.append(f"  - {{src: {json.dumps(src)}, dest: {json.dumps(dest)}}}")
    return lines + [""]


def _lacking(came: dict, cmd: str, own: frozenset | None) -> dict:
    """{"warmup" | "checkpoint": the flags of the recipe's warmup or resume_args that the script's
    own parser lacks}: those parts are turned off in the spec, with a CHANGE ME."""
    if own is None:
        return {}
    from gpujob.spec.cmdfiles import invented
    off = {}
    warm = invented(came.get("warmup.command"), cmd, own)
    if warm:
        off["warmup"] = ", ".join(warm)
    resume = invented(came.get("train.resume_args"), cmd, own)
    if resume:
        off["checkpoint"] = ", ".join(resume)
    return off
