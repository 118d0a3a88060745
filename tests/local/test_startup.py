"""The CLI's start pays only for what the command uses (issue 24: ``--help`` and every
command's start <= 400 ms, ``--version`` and completion without typer or rich). Not a
timed test: the installed console script runs under ``python -X importtime`` and the
modules it imported are checked. bench/startup.py has the figures."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import GPUJOB, REPO

#: what no command's start imports: the inventory and spec models (pydantic, yaml) and the
#: SSH stack load when a command reaches a target or reads a file, not to parse its options
NOT_AT_START = ("pydantic", "yaml", "paramiko", "fabric", "gpujob.inventory.hosts", "gpujob.ops.target",
                "gpujob.spec.model", "gpujob.transport.ssh", "gpujob.ops.state")


def imported(args: list[str], env: dict | None = None) -> set[str]:
    """Every module ``gpujob ARGS`` imported (the console script, as installed)."""
    p = subprocess.run([sys.executable, "-X", "importtime", str(GPUJOB), *args], capture_output=True,
                       env=env or dict(os.environ, COLUMNS="100"), cwd=str(REPO), timeout=120,
                       stdin=subprocess.DEVNULL)
    assert p.returncode in (0, 2), p.stderr.decode()[-2000:]
    return {ln.split("|")[-1].strip() for ln in p.stderr.decode().splitlines()
            if ln.startswith("import time:")}


def commands() -> list[list[str]]:
    """Every command and sub-command of the CLI, as argv."""
    from gpujob.cli import conventions
    from gpujob.cli.main import app
    root = conventions.build(app)
    out = []
    for name, cmd in root.commands.items():
        subs = getattr(cmd, "commands", None)
        out += [[name, sub] for sub in subs] if subs else [[name]]
    return out


def test_help_imports_no_model_and_no_ssh():
    got = imported(["--help"])
    assert "typer" in got  # it did render typer's help
    assert not got & set(NOT_AT_START), sorted(got & set(NOT_AT_START))
    # typer's help module without its markdown and traceback parts (unused here)
    assert "typer.rich_utils" in got and not got & {"markdown_it", "pygments", "rich.markdown",
                                                    "rich.traceback"}


@pytest.mark.parametrize("argv", commands(), ids=" ".join)
def test_every_commands_start_imports_no_model_and_no_ssh(argv):
    got = imported([*argv, "--help"])
    assert "typer" in got
    assert not got & set(NOT_AT_START), sorted(got & set(NOT_AT_START))


def test_an_option_left_unset_or_text_needs_no_pydantic(tmp_path):
    """typer coerces values through pydantic; a value with nothing to convert is not (the
    root's --hosts is processed on every command)."""
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), XDG_RUNTIME_DIR=str(tmp_path))
    got = imported(["--hosts", str(tmp_path / "none.yaml"), "disconnect"], env)
    assert "typer" in got and "pydantic" not in got


@pytest.mark.parametrize("args", [["--version"], ["disconnect"]])
def test_answered_without_typer_or_rich(args, tmp_path):
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    got = imported(args, env)
    assert not {m.split(".")[0] for m in got} & {"typer", "rich", "pydantic", "yaml", "paramiko"}


def test_paramiko_without_invoke_until_a_match_exec_needs_it(tmp_path):
    """paramiko imports invoke (for ``Match exec`` only): gpujob defers it, and a config
    with such a line still runs it."""
    code = ("import sys\nimport gpujob.transport.ssh\nimport paramiko\n"
            "print('invoke.runners' in sys.modules)\n"
            f"c = paramiko.SSHConfig.from_text('Match exec \"touch {tmp_path}/ran\"\\n  User someone\\n')\n"
            "print(c.lookup('h').get('user'), 'invoke.runners' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=str(REPO))
    assert p.stdout.split() == ["False", "someone", "True"], p.stderr
    assert (tmp_path / "ran").exists()
