"""Following a job's log (``gpujob logs -f``): streamed from a byte offset through the
agent's ``tail``, reconnecting after a drop without losing or repeating a byte."""

from __future__ import annotations

import time
from typing import Callable

from gpujob.agent.base import protocol
from gpujob.agent.base.protocol import OffsetSplitter
from gpujob.errors import ConnectError, ConnectionLost, RemoteError
from gpujob.ops.target import Target, refusal_error


def follow_log(target: Target, job_id: str, *, file: str = "job.log", follow: bool = True,
               offset: int = 0, last: int | None = None, write: Callable[[bytes], None],
               notice: Callable[[str], None], max_backoff: float = 8.0) -> int:
    """Stream a job's log from ``offset`` (or from its last ``last`` lines); after a
    dropped connection, reconnect with backoff and resume from the byte reached, so
    no byte is lost or printed twice. Returns the final offset."""
    base, got = offset, 0  # position = base + got: base is fixed by what the agent reports
    got0 = 0  # bytes written before the current agent call
    located = last is None  # with ``last``, the agent tells the offset it starts from

    def sink(chunk: bytes) -> None:
        nonlocal got
        write(chunk)
        got += len(chunk)

    def started_at(rec: dict) -> None:
        # the agent's first record says where it starts: where we asked, or later when
        # the part of the log we asked for was trimmed away (it then says how much we skip)
        nonlocal base, located
        base, located = rec["offset"] - got0, True
        if rec.get("skipped"):
            notice(f"{rec['skipped']} bytes of {file} before this point were trimmed "
                   f"(journal.keep_log)")

    backoff = 0.25
    while True:
        start = ["--offset", str(base + got)] if located else ["--last", str(last)]
        got0 = got
        try:
            args = ["tail", job_id, "--file", file, *start] + (["--follow"] if follow else [])
            head = OffsetSplitter(sink, started_at)
            r = target.agent(*args, timeout=None, on_stdout=head)
            if r.exit_code == protocol.REFUSED and head.answer is not None:  # as every verb's refusal
                raise refusal_error(head.answer)
            if r.exit_code != 0:
                raise RemoteError(f"reading {file} of {job_id} failed"
                                  + (f": {head.error}" if head.error else ""), r)
            return base + got
        except ConnectionLost as e:
            notice(f"connection lost ({e.message}); reconnecting from byte {base + got}")
        while True:
            time.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)
            try:
                target.driver.reconnect(target)
                notice("reconnected")
                backoff = 0.25
                break
            except ConnectError as e:
                notice(f"reconnect failed ({e.message}); next try in {backoff:g}s")
