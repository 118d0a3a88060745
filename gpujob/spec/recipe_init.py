"""`gpujob init --recipe R -- COMMAND ...`: a commented spec to start from (pure text)."""

from __future__ import annotations

import json
import re
import shlex

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


def spec_text(recipe: str, command: list, *, name: str, target: str) -> str:
    """The YAML of a spec that uses ``recipe`` for ``command``; it passes `submit --plan`
    as written (the base interpreter's packages, tokens_per_step where the recipe needs it)."""
    r = RECIPES[recipe]
    command, note = runnable(command)
    cmd = shlex.join(command)
    data = {"recipe": recipe, "train": {"command": cmd}}
    need_tokens = False
    try:
        _, came = apply(data)
    except RecipeError:
        need_tokens = True
        _, came = apply({**data, "throughput": {"tokens_per_step": 1}})
        came = {k: v for k, v in came.items() if k != "throughput.tokens_per_step"}
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
        "",
    ]
    lines += ["throughput:",  # every recipe reads its trainer's rate
              "  min_ratio: 0.8              # CHANGE ME: below 80% of the known-good baseline is a breach"]
    if need_tokens:
        lines.append(f"  tokens_per_step: 4096       # CHANGE ME: {_TOKENS_HINT.get(recipe, 'tokens per step')}")
    lines += ["", "# What the recipe fills in for this command (uncomment a line to change it):"]
    for key, value in came.items():
        lines.append(f"#   {key}: {json.dumps(value)}")
    return "\n".join(lines) + "\n"
