"""``run``: the detached supervisor's own entry (spawned by submit and revive, never the laptop's)."""

from __future__ import annotations

import sys

from gpujob.agent.home.journal import Home
from gpujob.agent.supervisor.supervisor import run


def cmd_run(home: Home, args) -> None:
    sys.exit(run(home.root, args.job, args.lock_fd, args.generation))
