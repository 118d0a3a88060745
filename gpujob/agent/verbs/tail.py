"""The agent's ``tail``: a job's log as raw bytes from an offset (its first record
says where it starts), following it until the job has ended."""

from __future__ import annotations

import os
import sys
import time

from gpujob.agent.base.protocol import ENDED
from gpujob.agent.home.journal import Home
from gpujob.agent.base import protocol
from gpujob.agent.base.protocol import JobState
from gpujob.agent.home.trim import Trimmer
from gpujob.agent.verbs.lifecycle import job_or_refuse, revive


def cmd_tail(home: Home, args) -> None:
    """Raw bytes of a job's log from ``--offset``; with ``--follow`` until the job is
    final (or its supervisor gone) and the file fully sent."""
    j = job_or_refuse(home, args.job)
    path = j.path(args.file)
    out = sys.stdout.buffer
    offset = args.offset
    if args.last is not None:
        offset = last_lines_offset(path, args.last)
    begins = Trimmer(j.dir).start_of(args.file)  # the part before was trimmed (journal.keep_log)
    skipped = max(0, begins - offset) if args.last is None else 0
    offset = max(offset, begins)
    out.write(protocol.offset_record(offset, skipped))  # the first record; raw bytes follow
    out.flush()
    reader_gone = stdout_watch()
    f = None
    idle = 0.0
    revive_tried = False
    while True:
        if f is None and os.path.exists(path):
            f = open(path, "rb")
            f.seek(offset)
        data = f.read(1 << 20) if f else b""
        if data:
            out.write(data)
            out.flush()
            idle = 0.0
            continue
        if not args.follow:
            return
        # quiet: is the job over? read state only now and then
        if idle == 0.0 or idle >= 0.5:
            if reader_gone():  # the connection that asked is gone: do not linger for weeks
                return
            st = j.effective_state()
            if st.get("state") == JobState.LOST and not revive_tried:
                revive_tried = True
                if (revive(home, args.job) or {}).get("revived"):
                    idle = 0.0
                    continue
            if st.get("state") in ENDED:
                data = f.read() if f else b""
                if data:
                    out.write(data)
                    out.flush()
                return
            idle = 0.0 if idle >= 0.5 else idle
        time.sleep(args.poll)
        idle += args.poll


def stdout_watch():
    """A check that says when nobody reads our stdout any more (its pipe or socket
    was closed: a dropped SSH connection), without having to write to it."""
    import select
    poller = select.poll()
    poller.register(sys.stdout.fileno(), 0)  # POLLERR and POLLHUP are always reported
    bad = select.POLLERR | select.POLLHUP | select.POLLNVAL
    return lambda: any(ev & bad for _fd, ev in poller.poll(0))


def last_lines_offset(path: str, n: int) -> int:
    """The byte offset where the last ``n`` lines of ``path`` start."""
    try:
        f = open(path, "rb")
    except OSError:
        return 0
    with f:
        end = f.seek(0, os.SEEK_END)
        pos, seen = end, 0
        if n <= 0:
            return end
        while pos > 0:
            step = min(pos, 1 << 16)
            pos -= step
            f.seek(pos)
            block = f.read(step)
            if pos + step == end and block.endswith(b"\n"):
                block = block[:-1]  # the final newline ends the last line, it starts none
            for i in range(len(block) - 1, -1, -1):
                if block[i] == 10:
                    seen += 1
                    if seen == n:
                        return pos + i + 1
        return 0
