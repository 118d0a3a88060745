"""The ``gpujob`` command line (typer). The only place that prints.

Every error a user can cause ends as one line on stderr and a non-zero exit
code (2 for bad input), never a traceback. Under ``--json`` that line is one JSON
object, ``{"error": ..., "code": <the exit code>}`` (a stream's last line). A
reader that goes away (``gpujob status | head -2``) ends the command quietly with
exit 0, as it does for the other tools of a pipeline.
"""

from __future__ import annotations

import json
import os
import sys

from gpujob.cli import conventions
from gpujob.show import render
from gpujob.cli.app import app, ctx, err
# the commands register on app as their modules load, in this order (the order --help lists them)
from gpujob.cli import target_cmds, jobs_cmds, cache_cmds, demo_cmd, recipe_cmds, replay_cmds  # noqa: F401
from gpujob.cli import bisect_cmds  # noqa: F401
from gpujob.errors import GpujobError


class _ReaderGone(Exception):
    """stdout's reader closed the pipe. Not an OSError: typer turns an EPIPE OSError
    into exit 1 on its own; this one reaches main()."""


class _Stdout:
    """sys.stdout, with a closed pipe raised as _ReaderGone."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise _ReaderGone() from None

    def flush(self):
        try:
            return self._stream.flush()
        except BrokenPipeError:
            raise _ReaderGone() from None

    @property
    def buffer(self):  # exec's output goes to the bytes below: a closed pipe there ends quietly too
        return _Stdout(self._stream.buffer)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _wants_json(argv: list) -> bool:
    """--json among gpujob's own arguments (not after ``--``, the remote command's)."""
    own = argv[:argv.index("--")] if "--" in argv else argv
    return "--json" in own


def _reader_gone() -> None:
    """Quiet from here on: stdout to /dev/null, so no flush at exit complains."""
    stdout = sys.__stdout__
    if stdout is None:  # no stdout to quiet (pythonw, a closed fd 1)
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def main() -> None:
    as_json = _wants_json(sys.argv[1:])

    def say(message: str, code: int, hint: str | None = None, refused: str | None = None) -> None:
        if as_json:
            body: dict = {"error": message, "code": code}
            if hint:
                body["hint"] = hint
            if refused:  # the agent's refusal code (agent/base/wire.py Code)
                body["refused"] = refused
            sys.stderr.write(json.dumps(body) + "\n")
            return
        err.print(render.lit(message), soft_wrap=True)
        if hint:
            err.print(render.lit(f"  hint: {hint}"), soft_wrap=True)

    usage = []
    sys.stdout = _Stdout(sys.stdout)
    try:  # usage errors one line (exit 2), global options after the command too
        code = conventions.run(app, err=(lambda line: usage.append(line)) if as_json else
                               (lambda line: err.print(render.lit(line), soft_wrap=True)))
        if usage:
            say(usage[-1].removeprefix("gpujob: "), code)
    except GpujobError as e:
        say(f"gpujob: {e.message}" if not as_json else e.message, e.exit_code, e.hint, e.refusal)
        sys.exit(e.exit_code)
    except _ReaderGone:
        _reader_gone()
        sys.exit(0)
    except KeyboardInterrupt:
        if as_json:
            say("interrupted", 130)
        else:
            err.print("\ninterrupted")
        sys.exit(130)
    finally:
        ctx.close()
    sys.exit(code)


if __name__ == "__main__":
    main()
