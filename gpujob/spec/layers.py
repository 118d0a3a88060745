"""What goes over a spec file's own data before it is validated: ``submit --set
KEY=VALUE`` (dotted keys, the spec's own values replaced) and then its
``recipe:`` (gpujob/spec/recipes/registry.py: the trainer's conventions, under every key the
spec sets). Both are recorded so the plan can show where each value came from."""

from __future__ import annotations

import re

import yaml

from gpujob.errors import InputError, SpecError
from gpujob.spec.recipes.base import RecipeError
from gpujob.spec.recipes.registry import RECIPES, apply
from gpujob.yamlsrc import Source, describe, load_yaml, render_loc, suggest

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")


def parse_set(item: str) -> tuple[tuple, object]:
    """``train.command=python t.py`` -> (('train', 'command'), 'python t.py'). The value
    is read as one YAML value (``3``, ``true``, ``[a, b]``, ``{k: v}``); an integer
    part of the key indexes a list (``profiles.0.packages``)."""
    key, sep, text = item.partition("=")
    parts = key.split(".") if key else []
    if not sep or not parts or not all(_KEY.fullmatch(p) for p in parts):
        raise InputError(f"--set {describe(item)}: expected KEY=VALUE with a dotted KEY like "
                         "train.command or profiles.0.packages")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except Exception as exc:  # noqa: BLE001 - YAMLError, and a bad tagged value's ValueError/TypeError
        raise InputError(f"--set {key}: the value is not one YAML value ({type(exc).__name__}); "
                         "quote it") from None
    return tuple(int(p) if p.isdigit() else p for p in parts), value


def apply_sets(source: Source, sets: list) -> list[tuple[str, object, object]]:
    """Apply each --set to the source's data, in order; [(key, old value, new value)]."""
    done = []
    for item in sets:
        loc, value = parse_set(item)
        key = render_loc(loc)
        node = source.data
        for i, part in enumerate(loc[:-1]):
            nxt = loc[i + 1]
            if isinstance(node, dict):
                if isinstance(part, int):
                    raise InputError(f"--set {key}: {render_loc(loc[:i]) or 'the spec'} is a mapping, "
                                     f"not a list")
                if node.get(part) is None:
                    node[part] = [] if isinstance(nxt, int) else {}
                node = node[part]
            elif isinstance(node, list):
                if not isinstance(part, int) or part >= len(node):
                    raise InputError(f"--set {key}: {render_loc(loc[:i])} has {len(node)} items "
                                     f"(0 to {len(node) - 1})")
                node = node[part]
            else:
                raise InputError(f"--set {key}: {render_loc(loc[:i])} is {describe(node)}, not a mapping")
        last = loc[-1]
        if isinstance(node, list):
            if not isinstance(last, int) or last >= len(node):
                raise InputError(f"--set {key}: {render_loc(loc[:-1])} has {len(node)} items")
        elif not isinstance(node, dict) or isinstance(last, int):
            raise InputError(f"--set {key}: {render_loc(loc[:-1]) or 'the spec'} is not a mapping")
        old = node[last] if isinstance(node, list) or last in node else None
        node[last] = value
        done.append((key, old, value))
    return done


def apply_recipe(source: Source) -> dict:
    """The source's data completed by its recipe; {dotted key: value} from the recipe.
    The recipe's keys get the line of ``recipe:`` for errors."""
    name = source.data.get("recipe")
    if name is None:
        return {}
    if not isinstance(name, str) or name not in RECIPES:
        raise source.error(("recipe",), f"expected one of {', '.join(RECIPES)}, got {describe(name)}"
                           + (suggest(name, RECIPES) if isinstance(name, str) else ""))
    line = source.line(("recipe",))
    try:
        merged, came = apply(source.data)
    except RecipeError as exc:
        raise SpecError(source.path, line, exc.key, str(exc)) from None
    for key in came:
        loc = tuple(key.split("."))
        for n in range(1, len(loc) + 1):
            source.lines.setdefault(loc[:n], line)
    source.data.clear()
    source.data.update(merged)
    return came


def from_set(error: SpecError, sets: list) -> InputError | None:
    """A validation error about a key that --set gave, as `--set KEY: ...` (else None)."""
    for key, _, _ in reversed(sets):
        if error.field and (error.field == key or error.field.startswith((key + ".", key + "["))):
            return InputError(f"--set {key}: {error.field}: {error.detail}")
    return None


def load(model, path, sets: list, profile: str | None = None):
    """spec.load_spec's body: the file, its --set items, its recipe, then the model.
    ``profile`` (submit --profile) replaces the spec's own ``profile`` when it names one
    of its profiles, so a spec whose profiles a --set replaced is not refused for the
    name it had; one it does not name is refused in one line."""
    source = load_yaml(path)
    done = apply_sets(source, sets)
    if profile is not None and isinstance(source.data, dict) and \
            isinstance(source.data.get("profiles"), list):
        names = [p.get("name") for p in source.data["profiles"] if isinstance(p, dict)]
        if profile not in names:  # as spec.profile_by_name says it, before the spec's own name is judged
            shown = [n if isinstance(n, str) and n.isprintable() and " " not in n else describe(n)
                     for n in names]
            plain = [n for n in names if isinstance(n, str)]
            raise InputError(f"unknown profile {describe(profile)}; profiles: {', '.join(shown)}"
                             f"{suggest(profile, plain)}")
        source.data["profile"] = profile
    try:
        came = apply_recipe(source)
        spec = source.validate(model, context={"spec_dir": path.parent})
    except SpecError as exc:
        raise (from_set(exc, done) or exc) from None
    spec._source_path = path.absolute()
    spec._lines = source.lines
    spec._source_name = str(path)
    spec._layers = {"recipe": came, "sets": done}
    return spec


def layer_steps(spec) -> list:
    """The plan's account of values not written in the spec file: each `--set` and
    each key its recipe filled in (marked `from recipe NAME`)."""
    import json
    from gpujob.steps import Step
    from gpujob.yamlsrc import shorten
    layers = spec._layers or {}
    steps = [Step("set", "laptop", f"--set {key} = {shorten(json.dumps(new), 200)}" +
                  (f" (the spec had {shorten(json.dumps(old), 80)})" if old is not None else ""))
             for key, old, new in layers.get("sets") or []]
    if spec.recipe:
        r = RECIPES[spec.recipe]
        steps.append(Step("recipe", "laptop",
                          f"recipe {r.name} (revision {r.revision}; conventions read from {r.read_from}; "
                          f"proven on: {r.proven_on}); the keys below came from it, every key the spec sets "
                          f"wins"))
        steps += [Step("recipe", "laptop", f"from recipe {r.name}: {key} = {shorten(json.dumps(v), 200)}")
                  for key, v in (layers.get("recipe") or {}).items()]
    return steps
