"""The file primitives of the agent (stdlib only): atomic, durable writes of JSON and
bytes, appends of whole records, reads that tolerate a torn tail, and whether a pid
still runs. Every wing writes through these; they know nothing of jobs.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
import time

from gpujob.agent.base import jsonl


def now() -> float:
    return time.time()


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: str, data, mode: int = 0o644, durable: bool = True, compact: bool = False) -> None:
    """Atomic: readers see the old file or the new one, never half of one, and a
    failed write (disk full) leaves the old file as it was. Durable (the default):
    after a crash of the machine the rename has reached the disk with the data
    (fsync of the file, rename, fsync of the directory). ``durable=False`` is for
    small files rewritten many times a second that only guard against process deaths.
    ``compact``: one line without spaces, for a file rewritten every second that only
    programs read (state.json): ``indent`` makes json use its pure-Python encoder."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":")) if compact else \
        json.dumps(data, indent=1, sort_keys=True)
    write_bytes(path, (text + "\n").encode(), mode, durable)


def temp_beside(path: str, mode: int) -> tuple:
    """(fd, name) of a new temp file in ``path``'s directory, for an atomic replace of
    ``path``: a fresh name from ``mkstemp`` (O_CREAT|O_EXCL, O_NOFOLLOW), so a file
    or symlink another user planted there is never opened, let alone written
    through; ``mode`` set on the open file (not through its name)."""
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path)[:64] + ".tmp",
                               dir=os.path.dirname(os.path.abspath(path)))
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp


def write_bytes(path: str, payload: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """``write_json``'s atomic replace, for any content (a metrics textfile, which may
    sit in a directory other users write: see temp_beside). The rename replaces a
    symlink at ``path`` itself; it never writes where the link points."""
    fd, tmp = temp_beside(path, mode)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
        os.close(fd)
        fd = None
        os.replace(tmp, path)
    except BaseException:
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


#: the most a JSON file the agent reads whole may hold (job.json, state.json, a request)
MAX_JSON = 64 << 20


def read_json(path: str, default=None, limit: int = MAX_JSON):
    """A JSON file, or ``default`` when it cannot be read, does not parse, is over ``limit``
    bytes or nests too deep (agent/base/jsonl.py's bounds: never a RecursionError)."""
    try:
        return jsonl.loads(jsonl.read_bounded(path, limit))
    except (OSError, ValueError):
        return default


def append_record(fd: int, line: bytes) -> int:
    """Append one whole line to an O_APPEND file in one write; a short write (disk
    full) is cut off again, so the file never ends in half a record. Returns the
    file's size before the append (where the record starts: its one writer)."""
    size = os.fstat(fd).st_size
    try:
        written = os.write(fd, line)
    except OSError:
        _truncate(fd, size)
        raise
    if written != len(line):
        _truncate(fd, size)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return size


def append_line(fd: int, line: bytes) -> None:
    """``append_record`` for a caller that needs not know where the record starts: no
    ``fstat`` before the write (one system call less a sample). A short write is cut off
    the same (the size before it is the size after less what it wrote: the one writer);
    a write that fails wrote nothing (write(2) returns a count once it wrote any)."""
    written = os.write(fd, line)
    if written != len(line):
        _truncate(fd, os.fstat(fd).st_size - written)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _truncate(fd: int, size: int) -> None:
    try:
        if os.fstat(fd).st_size > size:
            os.ftruncate(fd, size)
    except OSError:
        pass


def json_objects(data: bytes, name: str = "data") -> list:
    """The JSON objects of a run of JSON lines, in order: blank lines, a trimmed journal's
    punched-out start (NULs), a torn line, anything not an object and a line past the
    bounded reader's limits (agent/base/jsonl.py: length, nesting) are passed over."""
    return [rec for _n, rec in jsonl.records([data], name, strict=False)]


def read_records(path: str) -> tuple:
    """(records, skipped): the whole JSON lines of a .jsonl file, and how many lines
    could not be read (a torn tail left by a crash, damage, a line too long or too deep:
    read in chunks, never a line held whole past its bound)."""
    stats = jsonl.Stats()
    try:
        f = open(path, "rb")
    except OSError:
        return [], 0
    with f:
        records = [rec for _n, rec in jsonl.records(jsonl.file_chunks(f), path, strict=False, stats=stats)]
    return records, stats.skipped


def pid_alive(pid, needle: str | None = None, ticks=None) -> bool:
    """Is ``pid`` running (not a zombie)? ``ticks`` (its start time) or ``needle``
    (a string its command line holds) guard against a recycled pid."""
    from gpujob.agent.base.proc import is_alive
    if not is_alive(pid, ticks):
        return False
    if needle is None or ticks is not None:
        return True
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            return needle.encode() in f.read()
    except OSError:
        return False
