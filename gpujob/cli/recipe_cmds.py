"""``gpujob recipes`` and ``gpujob init``: the trainers' conventions gpujob knows."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from gpujob.show import render
from gpujob.cli.app import app, err, out
from gpujob.errors import InputError


@app.command("recipes")
def recipes_cmd(as_json: bool = typer.Option(False, "--json", help="every recipe and what it sets, as JSON")):
    """The recipes (`recipe: NAME` in a spec) and the keys each fills in."""
    from gpujob.spec.recipes.registry import RECIPES, describe
    items = [describe(name) for name in RECIPES]
    if as_json:
        out.print_json(json.dumps({"recipes": items}))
        return
    for r in items:
        out.print(render.lit(f"{r['name']}  ({r['trainer']}, revision {r['revision']}; read from "
                             f"{r['read_from']}; proven on: {r['proven_on']})"), soft_wrap=True)
        out.print(render.lit(f"  {r['summary']}"), soft_wrap=True)
        given = "".join(f", {k}: {v}" for k, v in (r.get("given") or {}).items())
        out.print(render.lit(f"  for: {r['sample_command']}{given}"), soft_wrap=True)
        for key, value in r["sets"].items():
            out.print(render.lit(f"    {key}: {json.dumps(value)}"), soft_wrap=True)


@app.command("init", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def init_cmd(command: list[str] = typer.Argument(..., metavar="-- COMMAND ..."),
             recipe: str = typer.Option(..., "--recipe", "-r", help="specforge, hf_trainer, nanogpt, "
                                        "torchtitan or lightning"),
             target: str = typer.Option("local", "--target", "-t", help="the container the spec names"),
             name: Optional[str] = typer.Option(None, "--name", help="the job's name (default: the "
                                                "script's basename, made valid)"),
             output: Optional[Path] = typer.Option(None, "--output", "-o", help="the file to write "
                                                   "(default ./NAME.yaml; never over an existing file)")):
    """Write a commented spec for COMMAND using a recipe's conventions."""
    import re
    from gpujob.spec.recipe_init import job_name, spec_text
    from gpujob.spec.recipes.registry import RECIPES
    from gpujob.yamlsrc import suggest
    if recipe not in RECIPES:
        raise InputError(f"--recipe: expected one of {', '.join(RECIPES)}, got {recipe[:60]!r}"
                         f"{suggest(recipe, RECIPES)}")
    name = name if name is not None else job_name(command)
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,39}", name):
        raise InputError(f"--name: expected lowercase letters, digits and '-' (at most 40), got "
                         f"{name[:60]!r}")
    path = output or Path(f"{name}.yaml")
    from gpujob.spec.cmdfiles import init_sync
    here = Path.cwd()
    folder = (here / path).parent.resolve()
    ship = tuple((os.path.relpath(here / f, folder), f) for f in init_sync(list(command), here))
    from gpujob.spec.cmdfiles import script_flags
    scripts = [f for f in init_sync(list(command), here) if f.endswith(".py") and f in command]
    own = script_flags(here / scripts[0]) if scripts else None
    text = spec_text(recipe, list(command), name=name, target=target, sync=ship, own_flags=own)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        raise InputError(f"{path}: exists already; init never writes over a file (-o another)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    err.print(render.lit(f"wrote {path}: check the CHANGE ME lines, then `gpujob submit {path} --plan`"),
              soft_wrap=True)
