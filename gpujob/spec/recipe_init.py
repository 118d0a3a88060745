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


def job_name(command: list) -> str:
    """The script's (or module's) basename made a valid job name: lowercase letters,
    digits and '-', at most 40."""
    script = next((a for a in command if a.endswith(".py")), None)
    if script is None and "-m" in command[:-1]:
        script = command[command.index("-m") + 1]
    base = (script or (command[0] if command else "job")).rsplit("/", 1)[-1]
    base = re.sub(r"\.py$", "", base).split(".")[-1] if script else base
    name = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-")[:40].strip("-")
    return name or "job"


def spec_text(recipe: str, command: list, *, name: str, target: str) -> str:
    """The YAML of a spec that uses ``recipe`` for ``command``; it passes `submit --plan`
    as written (the base interpreter's packages, tokens_per_step where the recipe needs it)."""
    r = RECIPES[recipe]
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
