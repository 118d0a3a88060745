"""The CLI in this process, through typer's test runner (tests/cli/): the same ``main()``
the console script ends in (gpujob/cli/main.py: its one-line errors, exit codes, --json
errors), with argv, the environment and stdin set by ``CliRunner.isolation`` and stdout
and stderr caught as bytes. No process starts, so a check costs milliseconds, not the
interpreter's and typer's start (tests/helpers.py's ``cli`` runs the installed script:
that is tests/local/'s, and the few tests/cli/ checks that need the script itself).

The kept connection stays out of it: the daemon is the entry point's (gpujob/entry.py sets
``paths.FROM_ENTRY``), which this does not go through; tests/bed/test_conn_contract.py holds
the two paths to the same bytes."""

from __future__ import annotations

import os
import subprocess
import sys

from typer.testing import CliRunner

from helpers import REPO


def cli(args: list[str], env: dict, *, input: bytes | None = None, check: bool = False,
        **_ignored) -> subprocess.CompletedProcess:
    """``gpujob ARGS`` under ``env`` (a whole environment, as for the installed script),
    run in-process: a CompletedProcess with the exit code and the output as bytes."""
    from gpujob.cli.app import ctx
    from gpujob.cli.main import main
    from gpujob.conn import paths

    runner = CliRunner()
    whole = {k: None for k in os.environ if k not in env}  # env replaces the environment
    whole.update(env)
    cwd = os.getcwd()
    argv = sys.argv
    code = 0
    with runner.isolation(input=input, env=whole) as (out, err, _mixed):
        os.chdir(env.get("GPUJOB_TEST_CWD", str(REPO)))
        sys.argv = ["gpujob", *args]
        paths.FROM_ENTRY = False
        # a fresh process's context: the inventory and state a command opened are its own
        ctx.__init__()
        ctx.hosts, ctx.accept_new, ctx._targets, ctx._state = None, False, None, None
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            sys.argv = argv
            os.chdir(cwd)
            sys.stdout.flush()
            sys.stderr.flush()
        stdout, stderr = out.getvalue(), err.getvalue()
    p = subprocess.CompletedProcess(["gpujob", *args], code, stdout, stderr)
    if check and code != 0:
        raise AssertionError(f"gpujob {' '.join(args)} exited {code}\n"
                             f"stdout: {stdout.decode()[-3000:]}\nstderr: {stderr.decode()[-3000:]}")
    return p
