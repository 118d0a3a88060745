"""The ``gpujob`` command line (typer). The only place that prints.

Every error a user can cause ends as one line on stderr and a non-zero exit
code (2 for bad input), never a traceback.
"""

from __future__ import annotations

import sys

from gpujob.cli import conventions, render
from gpujob.cli.app import app, ctx, err
# the commands register on app as their modules load, in this order (the order --help lists them)
from gpujob.cli import target_cmds, jobs_cmds, cache_cmds, demo_cmd, replay_cmds  # noqa: F401
from gpujob.errors import GpujobError


def main() -> None:
    try:  # usage errors one line (exit 2), global options after the command too
        code = conventions.run(app, err=lambda line: err.print(render.lit(line), soft_wrap=True))
    except GpujobError as e:
        err.print(render.lit(f"gpujob: {e.message}"), soft_wrap=True)
        if e.hint:
            err.print(render.lit(f"  hint: {e.hint}"), soft_wrap=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err.print("\ninterrupted")
        sys.exit(130)
    finally:
        ctx.close()
    sys.exit(code)


if __name__ == "__main__":
    main()
