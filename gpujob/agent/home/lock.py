"""The per-container lock (stdlib only): one job's supervisor at a time, fenced.

``H/lock`` is only ever ``flock``-ed, never written: the kernel holds the lock
for as long as one open file description of it is open, and drops it the moment
its holder dies, so there is no stale lock to guess about and no race between
two processes that both find one. ``H/lock.json`` says who holds it (job, pid,
since, and by: the user@laptop that submitted the job) and the *generation*: a number
that grows by one at every acquisition. Every state write of a job carries the
generation of the lock its writer holds,
and a write from an older generation is refused (``Fenced``): a holder that lost
the lock without knowing it cannot overwrite what its successor wrote.

The lock passes from the agent that takes it to the supervisor it starts as an
inherited file descriptor (``--lock-fd``), so it is never free in between.
"""

from __future__ import annotations

import fcntl
import json
import os
import time


class Fenced(Exception):
    """A write from a lock generation older than the one on disk."""


class Held:
    """An acquired lock: the open file description that holds the flock."""

    def __init__(self, lock: "Lock", fd: int, generation: int, job_id: str):
        self.lock, self.generation, self.job_id = lock, generation, job_id
        self.fd: int | None = fd  # None once released or closed

    def set_pid(self, pid: int) -> None:
        """Say which process now holds it (the supervisor, once started)."""
        from gpujob.agent.base.proc import start_ticks
        info = self.lock.info() or {}
        if info.get("generation") == self.generation:
            self.lock._write_info(dict(info, pid=pid, ticks=start_ticks(pid)))

    def release(self) -> None:
        if self.fd is None:
            return
        info = self.lock.info() or {}
        if info.get("generation") == self.generation:
            self.lock._write_info(dict(info, released_at=time.time(), pid=None))
        os.close(self.fd)  # closing the last copy of the description drops the flock
        self.fd = None

    def close_quietly(self) -> None:
        """Let go of our copy of the descriptor (another process keeps its own)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Lock:
    def __init__(self, root: str):
        self.path = os.path.join(root, "lock")
        self.info_path = os.path.join(root, "lock.json")

    def info(self) -> dict | None:
        try:
            with open(self.info_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _write_info(self, info: dict) -> None:
        from gpujob.agent.base.fsio import write_json
        write_json(self.info_path, info)

    def try_acquire(self, job_id: str, pid: int | None = None, by: str | None = None) -> Held | None:
        """The lock, or None when a live process holds it. ``by``: who asked
        (user@laptop); a job taking its own lock again (a new supervisor) keeps
        the holder and the time it first took it."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        from gpujob.agent.base.proc import start_ticks
        prev = self.info() or {}
        generation = int(prev.get("generation") or 0) + 1
        pid = pid or os.getpid()
        same = prev.get("job_id") == job_id and by is None
        self._write_info({"job_id": job_id, "pid": pid, "ticks": start_ticks(pid),
                          "since": prev.get("since") if same and prev.get("since") else time.time(),
                          "by": prev.get("by") if same else by, "generation": generation})
        return Held(self, fd, generation, job_id)

    @staticmethod
    def inherit(fd: int, generation: int, job_id: str, root: str) -> Held:
        """The lock handed down by the process that started us (``--lock-fd``)."""
        os.set_inheritable(fd, False)
        return Held(Lock(root), fd, generation, job_id)

    def holder(self) -> dict | None:
        """Who holds the lock now, as far as lock.json tells (None: nobody). For
        display only: ``try_acquire`` alone decides."""
        from gpujob.agent.base.proc import is_alive
        info = self.info()
        if not info or info.get("released_at") is not None:
            return None
        return info if is_alive(info.get("pid"), info.get("ticks")) else None
