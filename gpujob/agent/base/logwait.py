"""Wait for a log to grow (stdlib only): inotify through ctypes, with a timed poll as
the fallback.

The watch loop reads a phase log that is often quiet (a trainer's start, an eval, a
save, a trainer that prints once a second). Looking every 50 ms made 20 wakeups a
second of a process with nothing to do; this wait sleeps until the file grows past the
offset read so far, another descriptor becomes readable (the command's pidfd: its
end), or ``timeout`` passes (the loop's next round of checks), whichever is first. A
write after the size check queues an inotify event, so no growth is slept through.
Where inotify is missing (not Linux, no ``inotify_init1`` in libc, the per-user limits
reached) or fails, it waits ``poll`` seconds at most, as before.
"""

from __future__ import annotations

import errno
import os
import select
import sys
import time

IN_MODIFY, IN_ATTRIB, IN_MOVE_SELF, IN_DELETE_SELF, IN_IGNORED = 0x2, 0x4, 0x800, 0x400, 0x8000
MASK = IN_MODIFY | IN_ATTRIB | IN_MOVE_SELF | IN_DELETE_SELF


class _Inotify:
    """One inotify descriptor watching one file at a time (re-aimed when the file changes)."""

    def __init__(self):
        import ctypes  # only here: a supervisor without inotify never loads it
        libc = ctypes.CDLL(None, use_errno=True)
        self._add, self._rm = libc.inotify_add_watch, libc.inotify_rm_watch
        self._add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        self._errno = ctypes.get_errno
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.fd = fd
        self.wd = -1
        self.watched = None  # (path, inode) of the watched file

    def aim(self, path: str, ino: int) -> bool:
        """Watch ``path`` (inode ``ino``); True when the watch is new."""
        if self.watched == (path, ino):
            return False
        if self.wd >= 0:
            self._rm(self.fd, self.wd)  # (fails harmlessly when its watch already ended)
            self.wd = -1
        wd = self._add(self.fd, os.fsencode(path), MASK)
        if wd < 0:
            raise OSError(self._errno() or errno.EINVAL, "inotify_add_watch", path)
        self.wd, self.watched = wd, (path, ino)
        return True

    def drain(self) -> None:
        """Read the queued events; one saying the watched file is gone (its watch ended: a
        new file may get the same inode number) re-aims the next ``aim``."""
        try:
            while True:
                buf = os.read(self.fd, 65536)
                if not buf:
                    return
                for at in range(0, len(buf) - 15, 16):  # (wd, mask, cookie, len): no names for a file
                    wd = int.from_bytes(buf[at:at + 4], sys.byteorder, signed=True)
                    mask = int.from_bytes(buf[at + 4:at + 8], sys.byteorder)
                    if wd == self.wd and mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
                        self.watched = None  # (not a watch this one removed itself when re-aimed)
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.fd)


class LogWait:
    def __init__(self):
        self._ino = None
        self.failed = False  # inotify could not be used: the timed poll from then on
        self._pid = None

    def _inotify(self):
        if self.failed:
            return None
        if self._ino is None or self._pid != os.getpid():
            try:
                self._ino, self._pid = _Inotify(), os.getpid()
            except (OSError, AttributeError, ImportError):
                self.failed = True
                return None
        return self._ino

    def wait(self, path, offset: int, fds: list, timeout: float, poll: float) -> None:
        """Until ``path`` is longer than ``offset``, one of ``fds`` is readable, or
        ``timeout`` passed (``poll`` at most without inotify, or without a ``path``)."""
        fds = [fd for fd in fds if fd is not None]
        timeout = max(0.0, timeout)
        ino = self._inotify() if path else None
        if ino is not None:
            try:
                ino.drain()  # events of bytes already read (and whether the file went)
                st = os.stat(path)
                if ino.aim(path, st.st_ino):  # a write from here on queues an event
                    ino.drain()  # (the end of the watch it replaced)
                    st = os.stat(path)  # (a write before the watch began is in the size)
                if st.st_size > offset:
                    return
                select.select([ino.fd, *fds], [], [], timeout)
                return
            except FileNotFoundError:
                pass  # not there yet: the poll
            except OSError:
                self.failed = True
                ino.close()
                self._ino = None
        timeout = min(timeout, poll)
        if fds:
            select.select(fds, [], [], timeout)
        elif timeout:
            time.sleep(timeout)


_WAIT = LogWait()
_LAST_READ = [0.0]  # monotonic time of the last read that found output


def after_read(relay, fd, got: bool, timeout: float, poll: float, coalesce: float) -> None:
    """The watch loop's wait after a read (``got``: it found output, less than a fast
    writer's read): until the log ``relay`` copies (``dir``, ``src``, ``offset``:
    agent/home/relay.py) grows, ``fd`` (the command's pidfd, or None) is readable, or
    ``timeout`` (the checks are due). Output that keeps coming (two reads with output
    within ``2 * coalesce``) is let gather for ``coalesce`` instead, as before: one
    wakeup per ``coalesce`` for a trainer printing 1,000 lines a second, while one that
    prints a line now and then wakes once a line, at once, and otherwise only for the
    checks (was: every ``poll``)."""
    t = time.monotonic()
    if got:
        last, _LAST_READ[0] = _LAST_READ[0], t
        if t - last < 2 * coalesce:
            if fd is not None:
                select.select([fd], [], [], coalesce)
            else:
                time.sleep(coalesce)
            return
    path = os.path.join(relay.dir, relay.src) if relay.src else None
    _WAIT.wait(path, relay.offset, [fd], timeout, poll)
