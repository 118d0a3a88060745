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

import json
import os

from gpujob.agent.journal import write_json

CHUNK = 1 << 20


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
        self.src = None  # name of the phase log being relayed
        self.offset = 0
        self._f = None  # the source, kept open between polls

    def _cursor(self) -> dict | None:
        try:
            with open(self.cursor_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _write_cursor(self, cur: dict) -> None:
        write_json(self.cursor_path, cur, durable=False)  # it guards against process deaths

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
        if self._f is not None:
            self._f.close()
            self._f = None

    def poll(self, limit: int = CHUNK) -> bytes:
        """Copy what is new in the source (at most ``limit`` bytes); return it."""
        if self.src is None:
            return b""
        try:
            if self._f is None:
                self._f = open(os.path.join(self.dir, self.src), "rb")
            self._f.seek(self.offset)
            data = self._f.read(limit)
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
