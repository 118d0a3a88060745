"""Copy a phase log into job.log exactly once per byte, across supervisor deaths.

The phase command writes its own log file (``train.log``...); the supervisor
reads it and appends what it reads to ``job.log``, the combined log that
``gpujob logs`` follows. Before each append it records its intent in
``relay.json`` (source, source offset, length, job.log size before the append).
A new supervisor reads that record first: job.log's size tells how much of the
last append landed, and it completes exactly the rest, so no byte is lost or
doubled whenever the previous one died (job.log is written by the supervisor
alone, and only appended to).
"""

from __future__ import annotations

import errno
import json
import os

from gpujob.agent.base.fsio import write_bytes, write_json

CHUNK = 1 << 20
CURSOR_SIZE = 512  # relay.json's fixed size (one pwrite, inside one page)


def _encode(cur: dict) -> bytes:
    """``json.dumps(cur, sort_keys=True)`` of a cursor (int offsets, a str name), formatted
    directly: it is written before every append."""
    return b'{"dst": %d, "len": %d, "off": %d, "src": %s}' % (
        cur["dst"], cur["len"], cur["off"], json.encoder.encode_basestring_ascii(cur["src"]).encode())


class JobLog:
    """job.log: the relay's appends and gpujob's own banner lines, which always start
    on a line of their own."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.at_line_start = self._ends_with_newline()

    def _ends_with_newline(self) -> bool:
        size = os.fstat(self.fd).st_size
        if size == 0:
            return True
        with open(self.path, "rb") as f:
            f.seek(size - 1)
            return f.read(1) == b"\n"

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def append(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        if data:
            self.at_line_start = data.endswith(b"\n")

    def banner(self, line: str) -> None:
        self.append((b"" if self.at_line_start else b"\n") + line.encode("utf-8", "replace") + b"\n")


class Relay:
    def __init__(self, job_dir: str, joblog: JobLog):
        self.dir = job_dir
        self.joblog = joblog
        self.cursor_path = os.path.join(job_dir, "relay.json")
        self.src: str | None = None  # name of the phase log being relayed
        self.offset = 0
        self._fd: int | None = None  # the source, kept open between polls
        self._cur_fd: int | None = None  # relay.json, kept open for the in-place cursor writes

    def _cursor(self) -> dict | None:
        try:
            with open(self.cursor_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _write_cursor(self, cur: dict) -> None:
        """Record the intent of the next append (it guards against process deaths).

        Written before every append, several times a second, so in place: one
        ``pwrite`` of a fixed-size record (JSON padded with spaces to ``CURSOR_SIZE``)
        into relay.json kept open, instead of a temp file, a write and a rename each
        time. A process dies between system calls, never inside one, so a reader finds
        the old record or the new one whole; a longer record (an odd phase log name)
        takes the atomic rename as before."""
        data = _encode(cur)
        if len(data) >= CURSOR_SIZE:
            self._close_cursor()
            write_json(self.cursor_path, cur, durable=False)
            return
        record = data + b" " * (CURSOR_SIZE - 1 - len(data)) + b"\n"
        if self._cur_fd is None:
            # a file of another size (an older supervisor's, or a long record's) is
            # replaced whole first: a pwrite over a longer one would leave its tail
            write_bytes(self.cursor_path, record, durable=False)
            self._cur_fd = os.open(self.cursor_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            if os.fstat(self._cur_fd).st_size == CURSOR_SIZE:
                return
            self._close_cursor()
            raise OSError(errno.EIO, "relay.json changed under the supervisor", self.cursor_path)
        if os.pwrite(self._cur_fd, record, 0) != CURSOR_SIZE:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.cursor_path)

    def _close_cursor(self) -> None:
        if self._cur_fd is not None:
            os.close(self._cur_fd)
            self._cur_fd = None

    def recover(self) -> None:
        """Finish the append a dead supervisor had started, if it had not."""
        cur = self._cursor()
        if not cur:
            return
        landed = max(0, min(cur["len"], self.joblog.size() - cur["dst"]))
        if landed < cur["len"]:
            with open(os.path.join(self.dir, cur["src"]), "rb") as f:
                f.seek(cur["off"] + landed)
                self.joblog.append(f.read(cur["len"] - landed))
        self.close()
        self.src, self.offset = cur["src"], cur["off"] + cur["len"]

    def follow(self, src: str, start: int) -> None:
        """Relay ``src`` from byte ``start`` on; if the cursor is already on ``src``
        past ``start`` (a re-adopted phase), go on from the cursor."""
        if self.src == src and self.offset >= start:
            return
        self.src, self.offset = src, start
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def poll(self, limit: int = CHUNK) -> bytes:
        """Copy what is new in the source (at most ``limit`` bytes); return it."""
        if self.src is None:
            return b""
        try:
            if self._fd is None:
                self._fd = os.open(os.path.join(self.dir, self.src), os.O_RDONLY | os.O_CLOEXEC)
            data = os.pread(self._fd, limit, self.offset)  # one call, not a seek and a read
        except OSError:
            self.close()
            return b""
        if data:
            self._write_cursor({"src": self.src, "off": self.offset, "len": len(data),
                                "dst": self.joblog.size()})
            self.joblog.append(data)
            self.offset += len(data)
        return data

    def drain(self):
        """Everything left in the source, in chunks."""
        while True:
            data = self.poll()
            if not data:
                return
            yield data
