"""The registry of recipes (``recipe:``), and how a recipe's keys go under a spec's own.

Recipes: what a trainer's conventions fix, filled into a spec (`recipe: NAME`).

Pure: a spec's data (as loaded from YAML) in, the data with the recipe's keys
merged under it out, plus the dotted keys that came from the recipe (the plan
marks them). Every key the spec sets wins: mappings merge key by key, lists and
scalars are replaced whole.

A recipe's keys are partly fixed (a throughput pattern) and partly derived from
the spec's own train command (the warmup is the trainer itself for a few steps,
the checkpoint path follows its output directory, tokens per step its batch
arguments where they can be read). Where tokens per step cannot be read, the
spec must give ``throughput.tokens_per_step``: one line says so.
"""

from __future__ import annotations

import copy
from typing import Any

from gpujob.spec.recipes import hf, lightning, nanogpt, specforge, torchtitan
from gpujob.spec.recipes.base import Recipe, RecipeError

#: every recipe by its name: a new trainer is one module beside these and one line here
RECIPES: dict[str, Recipe] = {r.name: r for r in (
    specforge.RECIPE,
    hf.RECIPE,
    nanogpt.RECIPE,
    torchtitan.RECIPE,
    lightning.RECIPE,
)}

#: each recipe's standby preloads (agent/supervisor/standby.py), by recipe name
PRELOAD = {r.name: list(r.preload) for r in RECIPES.values() if r.preload}


def merge(base: dict, over: dict) -> dict:
    """``over`` on top of ``base``: mappings merge key by key, anything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def leaves(data: dict, prefix: tuple = ()) -> dict:
    """{dotted key: value} of a nested mapping's leaves (lists are leaves)."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(leaves(value, prefix + (str(key),)))
        else:
            out[".".join(str(p) for p in prefix + (key,))] = value
    return out


def apply(data: dict) -> tuple[dict, dict]:
    """(the spec's data with its recipe's keys under it, {dotted key: value} that came
    from the recipe). No ``recipe`` key: the data unchanged. RecipeError for a spec
    that the recipe cannot complete; KeyError is never raised (the name is checked)."""
    name = data.get("recipe")
    if name is None:
        return data, {}
    recipe = RECIPES[name]
    train, tput = data.get("train"), data.get("throughput", {})
    if not (isinstance(train, dict) and isinstance(train.get("command"), (str, list))
            and all(isinstance(a, str)
                    for a in (train["command"] if isinstance(train["command"], list) else []))
            and isinstance(tput, (dict, type(None)))):
        return data, {}  # a malformed train or throughput: validation says what is wrong, in one line
    spec_own = {k: True for k in leaves(data)}
    frag = _yield_tied(recipe.derive(data), train)
    # The recipe's train.command (the log interval appended) only when the spec's own
    # command is what it was derived from; every other recipe key yields to the spec.
    merged = merge(frag, data)
    if "command" in frag.get("train", {}):
        merged["train"]["command"] = frag["train"]["command"]
    def owned(key: str) -> bool:  # the spec set it, or a mapping above it (`warmup: null`)
        parts = key.split(".")
        return any(".".join(parts[:n]) in spec_own for n in range(1, len(parts) + 1))
    came = {k: v for k, v in leaves(frag).items() if not owned(k) or k == "train.command"}
    return merged, came


def _yield_tied(frag: dict, train: dict) -> dict:
    """Keys of a recipe that only hold with another of its keys yield with it: its
    "finished" rule (done_file, settle) belongs to its checkpoint path, and resume_args
    with {resume_from} need a checkpoint (a spec's ``checkpoint: null`` drops them)."""
    ft = frag.get("train") or {}
    ck = train.get("checkpoint", {})
    if isinstance(ck, dict) and "path" in ck and isinstance(ft.get("checkpoint"), dict):
        ft["checkpoint"] = {k: v for k, v in ft["checkpoint"].items() if k not in ("done_file", "settle")}
    if ck is None and any("{resume_from}" in a for a in ft.get("resume_args") or []):
        del ft["resume_args"]
    return frag


def describe(name: str, sample_command=None) -> dict:
    """What a recipe sets, for `gpujob recipes`: its info and the keys of its fragment
    for a sample command (tokens per step given only where the recipe requires it)."""
    recipe = RECIPES[name]
    sample: dict[str, dict[str, Any]] = {"train": {"command": sample_command or recipe.sample_command}}
    try:
        frag = recipe.derive(sample)
    except RecipeError:
        sample["throughput"] = {"tokens_per_step": 4096}
        frag = recipe.derive(sample)
    return {**recipe.info(), "summary": recipe.summary, "sample_command": sample["train"]["command"],
            "sets": leaves(frag), **({"given": leaves({"throughput": sample["throughput"]})}
                                     if "throughput" in sample else {})}
