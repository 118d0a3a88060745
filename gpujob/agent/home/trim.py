"""Keeping a weeks-long job's journal small (stdlib only).

Logs are never renamed or rewritten while something may write or follow them:
the trainer holds its log open (O_APPEND) and ``gpujob logs -f`` follows byte
offsets. Instead the old part of a log is *punched out* (``fallocate`` with
``FALLOC_FL_PUNCH_HOLE``): its disk blocks are freed, the file keeps its length,
every offset stays valid, and a writer never notices. ``trimmed.json`` records
where each file's kept part begins (always at the start of a line); readers start
there, so a follower never sees the hole and never skips a line it has not read.

Throughput samples go to ``samples.jsonl`` at full rate; that file is trimmed to
the last ``full_rate`` seconds, and one summary record a minute
(``samples_1m``: median, min, max, count) goes to events.jsonl for good.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from gpujob.agent.base.fsio import read_json, write_json

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02

_libc = None


def _fallocate():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    return _libc.fallocate


def punch(path: str, start: int, end: int) -> bool:
    """Free the disk blocks of bytes [start, end) of ``path``; False when the
    filesystem cannot (nothing changes then)."""
    if end <= start:
        return True
    fd = os.open(path, os.O_WRONLY)
    try:
        rc = _fallocate()(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, start, end - start)
    finally:
        os.close(fd)
    return rc == 0


def line_start_at_or_after(path: str, pos: int, limit: int) -> int | None:
    """The first line start at or after ``pos`` and before ``limit`` (None: none)."""
    if pos == 0:
        return 0
    with open(path, "rb") as f:
        f.seek(pos - 1)
        while f.tell() < limit:
            block = f.read(min(1 << 16, limit - f.tell()))
            if not block:
                return None
            i = block.find(b"\n")
            if i >= 0:
                at = f.tell() - len(block) + i + 1
                return at if at < limit else None
    return None


class Trimmer:
    """Where each log of one job's directory begins now, and the trimming."""

    def __init__(self, job_dir: str):
        self.dir = job_dir
        self.path = os.path.join(job_dir, "trimmed.json")
        self.unsupported = False
        self._starts: dict | None = None  # read once: the supervisor is the only writer

    def starts(self) -> dict:
        if self._starts is None:  # bounded and typed: a file the job's dir holds is data from outside
            got = read_json(self.path, {}, limit=1 << 20)
            self._starts = {k: v for k, v in got.items() if isinstance(v, int) and not isinstance(v, bool)
                            and v >= 0} if isinstance(got, dict) else {}
        return self._starts

    def start_of(self, name: str) -> int:
        return int(self.starts().get(name, 0))

    def _record(self, name: str, at: int) -> None:
        data = dict(self.starts())
        data[name] = at
        self._starts = data
        write_json(self.path, data, durable=False)

    def trim(self, name: str, keep: int, upto: int | None = None) -> int:
        """Free all but the last ``keep`` bytes of ``name`` once it holds twice that,
        never past ``upto`` (what a reader still needs, e.g. what is not relayed yet).
        Returns how many bytes were freed."""
        if self.unsupported:
            return 0
        path = os.path.join(self.dir, name)
        try:
            size = os.path.getsize(path)
        except OSError:
            return 0
        begin = self.start_of(name)
        if size - begin <= 2 * keep:
            return 0
        limit = min(size - keep, upto if upto is not None else size)
        cut = line_start_at_or_after(path, limit - 1, size) if limit > begin else None
        if cut is None or cut <= begin or (upto is not None and cut > upto):
            return 0
        return self._free(name, begin, cut)

    def trim_before(self, name: str, cut: int) -> int:
        """Free ``name`` before byte ``cut`` (a line start) when that frees much."""
        begin = self.start_of(name)
        if self.unsupported or cut - begin < (1 << 20):
            return 0
        return self._free(name, begin, cut)

    def _free(self, name: str, begin: int, cut: int) -> int:
        # write down where the log now begins before freeing it: a reader that comes
        # between the two steps starts at the new beginning and sees no hole
        self._record(name, cut)
        if not punch(os.path.join(self.dir, name), begin, cut):
            self.unsupported = True
            return 0
        return cut - begin


def read_jsonl_from(path: str, start: int) -> list:
    """Whole JSON records of ``path`` from byte ``start`` (a line start)."""
    from gpujob.agent.base import jsonl
    try:
        f = open(path, "rb")
    except OSError:
        return []
    with f:
        f.seek(start)  # read as the bounded reader reads (a line too long or too deep: passed over)
        return [rec for _n, rec in jsonl.records(jsonl.file_chunks(f), path, strict=False)]
