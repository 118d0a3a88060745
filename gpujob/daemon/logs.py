"""Where the daemon's own lines go (when it started and stopped, a dropped request, a bug's
traceback; never what ran): its stderr, which is conn.log (conn/client.py starts it so). A
cold ``exec`` runs the same handler in the command's own process (oneshot.py) and points
them at that same file, so none of them reaches the user's terminal."""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import TextIO

#: the file the lines go to; None: stderr
to: TextIO | None = None


def log(msg: str) -> None:
    out = to or sys.stderr
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} gpujob-conn[{os.getpid()}]: {msg}", file=out, flush=True)


def exception() -> None:
    """The exception being handled, with its traceback."""
    out = to or sys.stderr
    traceback.print_exc(file=out)
    out.flush()
