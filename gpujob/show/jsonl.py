"""``--json`` on streams: JSON Lines, one object a line, written as they come.

``Lines`` turns a byte stream into JSON Lines: a journal's records as they were
written (``logs --events --json``, ``--samples``), or ``{"line": TEXT}`` for each line
of a log. ``Chunks`` does ``exec --json``: ``{"stream": "stdout", "data": TEXT}``
per chunk. Text is decoded as UTF-8 incrementally (a character split between two
chunks stays whole); bytes that are not UTF-8 become U+FFFD.
"""

from __future__ import annotations

import codecs
import json
import sys
import threading
from typing import Callable, Optional


_lock = threading.Lock()  # stdout and stderr chunks may come from two threads


def emit(obj, out=None) -> None:
    """One JSON object as one line, flushed (a reader sees it at once)."""
    out = out or sys.stdout
    with _lock:
        out.write(json.dumps(obj, ensure_ascii=False) + "\n")
        out.flush()


class Lines:
    """Records are read as the bounded reader reads them (agent/base/jsonl.py): a line past
    its length is never held (a log line is cut there, a record is skipped as damaged), one
    nested too deep is skipped too; ``damaged(n)`` says so."""

    def __init__(self, records: bool, *, extra: Optional[dict] = None,
                 damaged: Callable[[int], None] = lambda n: None, out=None):
        from gpujob.agent.base.jsonl import Splitter
        self.records, self.extra, self.damaged, self.out = records, extra or {}, damaged, out
        self.split = Splitter()

    def __call__(self, chunk: bytes) -> None:
        for _n, ln in self.split.feed(chunk):
            self._one(ln)

    def close(self) -> None:
        """The last line, when the stream did not end with a newline."""
        last = self.split.close()
        if last is not None:
            self._one(last[1])

    def _one(self, ln: Optional[bytes]) -> None:
        if ln is None:  # past the bound: not held
            self.damaged(-1)
            return
        if not self.records:
            emit(dict(self.extra, line=ln.decode("utf-8", "replace")), self.out)
            return
        ln = ln.lstrip(b"\0")  # a trimmed journal's punched-out start reads as NULs
        if not ln.strip():
            return
        from gpujob.agent.base.jsonl import loads
        try:
            rec = loads(ln)
        except ValueError:  # a torn record (its writer died mid-line), or nested too deep: skipped, said
            self.damaged(len(ln))
            return
        emit(rec, self.out)


class Chunks:
    """``exec --json``: each chunk of a stream as it comes, then the exit."""

    def __init__(self, stream: str, out=None):
        self.stream, self.out = stream, out
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")

    def __call__(self, chunk: bytes) -> None:
        text = self.dec.decode(chunk)
        if text:
            emit({"stream": self.stream, "data": text}, self.out)

    def close(self) -> None:
        text = self.dec.decode(b"", final=True)
        if text:
            emit({"stream": self.stream, "data": text}, self.out)
