"""A JSONL metrics file the trainer appends to, as a throughput source (stdlib only):
``throughput.source: file``. It polls the file for whole new lines and reads each with
``sources.parse_record``; it answers ``from_line`` and ``poll`` as ``sources.LineSource`` does.
"""

from __future__ import annotations

import os

from gpujob.agent.judge.sources import parse_record


class FileSource:
    MAX_LINE = 1 << 20  # a longer "line" is not a metrics record: skipped

    def __init__(self, path: str, field: str, step_field: str | None, offset: int | None = None,
                 scale: float = 1.0):
        self.path, self.field, self.step_field, self.scale = path, field, step_field, scale
        # a file left by an earlier run (a resumed trainer appends to it): only what comes now
        self.offset = offset if offset is not None else (os.path.getsize(path) if os.path.exists(path) else 0)

    def from_line(self, line: str):
        return None

    def candidates(self, lines) -> list:
        return []  # no output line holds a sample

    def poll(self) -> list:
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return []
        if size < self.offset:  # the trainer started the file afresh
            self.offset = 0
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(min(size - self.offset, 16 << 20))
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) > self.MAX_LINE:
                self.offset += len(data)
            return []
        self.offset += end + 1
        out = []
        for line in data[:end].split(b"\n"):
            got = parse_record(line, self.field, self.step_field) if line.strip() else None
            if got is not None:
                out.append((got[0] * self.scale, got[1]))
        return out

    def position(self):
        return self.offset
