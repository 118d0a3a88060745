"""Issue 34 item 3: the docs are checked against the code, not remembered. A changed default,
recipe proof, `--help` text, jobs/dflash.yaml or its plan fails here until the docs follow."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpujob.spec.recipes.registry import RECIPES
from gpujob.spec.model import Rollback

REPO = Path(__file__).resolve().parents[2]
SPEC_MD = (REPO / "docs" / "spec.md").read_text()


def table_default(section_marker: str, field: str) -> str:
    """The default column of ``field``'s row in the table after ``section_marker``."""
    after = SPEC_MD[SPEC_MD.index(section_marker):]
    m = re.search(rf"^\| `{re.escape(field)}` \| ([^|]+) \|", after, re.M)
    assert m, f"docs/spec.md: no row for {field} after {section_marker}"
    return m.group(1).strip()


def test_rollback_on_default_is_the_codes():
    assert table_default("## `rollback`", "on") == "`[" + ", ".join(Rollback().on) + "]`"


def test_spec_md_says_what_the_recipes_were_proven_on():
    """docs/spec.md called every recipe unproven after each was run on the H200."""
    proven = [r for r in RECIPES.values() if "H200" in r.proven_on]
    assert proven and "none is yet proven" not in SPEC_MD
    if len(proven) == len(RECIPES):
        assert "Each was then\nproven on one H200" in SPEC_MD


COMMANDS_MD = (REPO / "docs" / "commands.md").read_text()
README = (REPO / "README.md").read_text()


def _norm(line: str) -> str:
    """A plan line without what changes from run to run or release to release: the job id's
    suffix (in the header and in the job's own output dir), the hashes of venv keys and the
    agent, the laptop's checkout path."""
    line = re.sub(r"\b[0-9a-f]{12}\b", "<h>", line)
    line = re.sub(r"(\bjob |/outputs/)(dflash(?:-1gpu)?)-[a-z0-9]{4}\b", r"\1\2-<id>", line)
    return line.replace(str(REPO) + "/", "")


def test_commands_md_plan_excerpt_is_what_submit_plan_prints(tmp_path):
    """docs/commands.md "What `submit --plan` shows": each line of its excerpt (a `…` line
    skips steps; a line ending in ` …` is a prefix) is a line of today's plan of jobs/dflash.yaml
    with the clone's example hosts.yaml, in order."""
    import os
    from clirun import cli
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUJOB_", "XDG_"))}
    env.update(HOME=str(tmp_path), COLUMNS="400", GPUJOB_NO_DAEMON="1", GPUJOB_TEST_CWD=str(REPO))
    p = cli(["--hosts", "hosts.yaml", "submit", "jobs/dflash.yaml", "--plan"], env)
    assert p.returncode == 0, p.stderr.decode()
    plan = [_norm(x) for x in p.stdout.decode().splitlines()]
    section = COMMANDS_MD[COMMANDS_MD.index("## What `submit --plan` shows"):]
    assert "An excerpt of `gpujob submit jobs/dflash.yaml --plan`" in section
    excerpt = section.split("```\n", 2)[1].split("```")[0].splitlines()
    at = 0
    for line in excerpt:
        if line.strip() == "…":
            continue
        want = _norm(line)
        found = next((i for i in range(at, len(plan)) if plan[i] == want or
                      (want.endswith(" …") and plan[i].startswith(want[:-2]))), None)
        assert found is not None, f"docs/commands.md's plan excerpt has a line the plan does not print " \
                                  f"(in this order):\n{line}\nthe plan:\n" + "\n".join(plan)
        at = found + 1


def _cli_options(path: tuple) -> set:
    """The options of a command path, from the CLI's own index (tests/local/test_complete.py holds
    gpujob/complete_table.py to the CLI)."""
    from gpujob import complete_table
    return {name for opt in complete_table.TABLE[" ".join(path)]["options"] for name in opt[0]}


def _command_path(words: list) -> tuple:
    from gpujob import complete_table
    assert words[0] in complete_table.TABLE, f"no command {words[0]!r}"
    if len(words) > 1 and f"{words[0]} {words[1]}" in complete_table.TABLE:
        return (words[0], words[1])
    return (words[0],)


def test_the_readmes_commands_are_the_clis():
    """Every `gpujob …` line of the README's code blocks names a command and options it has."""
    lines, inside = [], False
    for ln in README.splitlines():
        if ln.startswith("```"):
            inside = not inside
        elif inside:
            lines.append(ln.split("#")[0].strip())
    checked = 0
    for ln in lines:
        m = re.search(r"(?:^|&& |\.venv/bin/)gpujob ((?:--accept-new )?)(\S.*)", ln)
        if not m:
            continue
        words = m.group(2).split()
        path = _command_path(words)
        opts = _cli_options(path)
        for w in words[len(path):]:
            if w == "--":
                break
            if w.startswith("-"):
                assert w.split("=")[0] in opts, f"README: `{ln}`: gpujob {' '.join(path)} has no option {w}"
        checked += 1
    assert checked >= 15


def test_the_readme_describes_the_dflash_spec_it_names():
    """README step 3 says what jobs/dflash.yaml is: SpecForge from the index at its pinned
    version, one process per GPU as jobs/dflash/run.yaml ships it, what it syncs."""
    from gpujob.spec.model import load_spec
    spec = load_spec(REPO / "jobs" / "dflash.yaml")
    step3 = README[README.index("**3. Check, plan, run, watch.**"):README.index("## Documentation")]
    pinned = [r for r in spec.requirements if "specforge" in str(r)]
    version = re.search(r"specforge==([\d.]+)", str(pinned)).group(1)
    assert f"`specforge=={version}` from the package index" in step3
    run = yaml.safe_load((REPO / "jobs" / "dflash" / "run.yaml").read_text())
    assert f"`jobs/dflash/run.yaml`, {run['deployment']['trainer']['nproc_per_node']} as shipped" in step3
    assert [f"jobs/{s.src}/" for s in spec.sync] == re.findall(r"ships `(jobs/[^`]+)`", step3)
    assert "../SpecForge" not in step3 and "warmup_drafter" not in COMMANDS_MD


def test_dflash_1gpu_is_dflash_on_one_process():
    """jobs/dflash-1gpu.yaml differs from jobs/dflash.yaml only in its name and one process."""
    import json
    from gpujob.spec.model import load_spec
    one = load_spec(REPO / "jobs" / "dflash-1gpu.yaml").to_agent_dict()
    full = load_spec(REPO / "jobs" / "dflash.yaml").to_agent_dict()
    text = json.dumps(one).replace(" deployment.trainer.nproc_per_node=1", "")
    assert json.loads(text) == dict(full, name="dflash-1gpu")
    assert "deployment.trainer.nproc_per_node=1" in one["train"]["command"]


def test_commands_md_options_are_the_clis():
    """Each option docs/commands.md's table lists for a command is one of that command's."""
    rows = re.findall(r"^\| `([^`]+)` \|[^\n]*\| ([^\n]*) \|$", COMMANDS_MD, re.M)
    checked = 0
    for head, opts_cell in rows:
        words = [w for w in head.replace("\\|", "|").split() if re.fullmatch(r"[a-z][a-z-]*", w)]
        if not words:
            continue
        try:
            path = _command_path(words)
        except AssertionError:
            continue  # not a command row (a field table)
        have = _cli_options(path)
        quoted = opts_cell.split("`")[1::2]  # what the backticks hold, paired from the start
        for tok in [m.group(1) for q in quoted
                    if (m := re.match(r"(--?[a-z][a-z-]*(?:/--?[a-z][a-z-]*)*)", q))]:
            for name in tok.split("/"):
                name = name.split("=")[0]
                if name.startswith("-"):
                    assert name in have, f"docs/commands.md: `{head}` lists {name}, which gpujob " \
                                         f"{' '.join(path)} does not have"
        checked += 1
    assert checked >= 20
