"""Decision -> first good sample after a rollback onto a standby, per single-process
recipe, on the CPU stand-ins (issue 23 item 4; no test bed): the goal is 5 s.

``python -m bench.recipes_standby`` runs tests/local/test_recipes_standby.py (act 1 makes
``fast`` known-good; act 2 starts on ``slow`` and rolls back onto the waiting standby of
``fast``, then once more without the standby) with ``RECIPE_FIGURES`` set, ``--runs``
times, and prints each recipe's median (range) from the decision, with the standby and
without. A save that the rollback let finish first (``save_waited``: the checkpoint's
wait, at most the recipe's settle) is taken off, as BENCHMARKS.md does. The test itself
asserts the hand-over and the order of the timings, never these seconds: the suite runs
on a loaded machine, this is run on a quiet one. Exit 1 when a recipe misses the goal.

    python -m bench.recipes_standby --runs 4 [--out FILE] [-k nanogpt]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEST = REPO / "tests" / "local" / "test_recipes_standby.py"
GOAL_S = 5.0


def figures(lines: list[dict]) -> dict:
    """{recipe: {"standby": [s, ...], "no_standby": [s, ...]}}: first good sample from the
    decision, less the save the rollback waited for."""
    out: dict = {}
    for rec in lines:
        got = out.setdefault(rec["recipe"], {"standby": [], "no_standby": []})
        got["standby"].append(rec["standby"]["first_good"] - rec.get("save_waited", 0.0))
        if rec.get("no_standby"):
            got["no_standby"].append(rec["no_standby"]["first_good"] - rec.get("no_standby_save_waited", 0.0))
    return out


def _cell(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.2f} s ({min(xs):.2f}-{max(xs):.2f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.recipes_standby", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", help="keep the runs' JSON lines here (default: a temporary file)")
    ap.add_argument("-k", dest="only", help="pytest -k: the recipes to run")
    a = ap.parse_args(argv)
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="gj-recipes-")) / "figures.jsonl"
    env = dict(os.environ, RECIPE_FIGURES=str(out))
    for i in range(a.runs):
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TEST)]
        if a.only:
            cmd += ["-k", a.only]
        p = subprocess.run(cmd, cwd=REPO, env=env)
        if p.returncode != 0:
            print(f"run {i + 1}: the test failed (exit {p.returncode}): no figures from it", file=sys.stderr)
    lines = [json.loads(ln) for ln in out.read_text().splitlines() if ln.strip()] if out.exists() else []
    if not lines:
        print("no figures", file=sys.stderr)
        return 1
    got = figures(lines)
    print(f"| recipe | first good sample, with standby | without standby | runs |  (goal <= {GOAL_S:g} s)")
    print("|---|---|---|---|")
    missed = []
    for recipe in sorted(got):
        f = got[recipe]
        print(f"| `{recipe}` | {_cell(f['standby'])} | {_cell(f['no_standby'])} | {len(f['standby'])} |")
        if statistics.median(f["standby"]) > GOAL_S:
            missed.append(recipe)
    print(f"figures: {out}")
    if missed:
        print(f"over {GOAL_S:g} s with the standby: {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
