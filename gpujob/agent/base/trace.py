"""The per-run trace (CONTRACT's trace format v1, stdlib only): timestamped raw output
lines, checkpoint file events, run starts and ends and the live decisions, as gzip
JSON Lines in the job dir (``trace.jsonl.gz``). ``gpujob replay`` reads it back.

Cheap to write: records go into a gzip stream in memory-buffered blocks, flushed
(a gzip sync point: a reader sees every record written) at most once per
``FLUSH`` seconds from the watch loop. Bounded like the logs: past ``limit``
compressed bytes the file becomes ``trace.1.jsonl.gz`` (the older one dropped)
and a new one starts with its own header; readers read both, oldest first.
A supervisor that dies leaves at most its last second unflushed; a truncated
last block or line is tolerated by :func:`read_records`.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from typing import IO

from gpujob.agent.base import jsonl

NAME, OLD = "trace.jsonl.gz", "trace.1.jsonl.gz"
_quote = json.encoder.encode_basestring_ascii  # what json.dumps(a str) returns
FLUSH = 1.0


class TraceWriter:
    def __init__(self, directory: str, header: dict, limit: int = 64 << 20):
        self.dir, self.header, self.limit = directory, header, max(1 << 16, int(limit))
        self.raw: IO[bytes] | None = None
        self.gz: gzip.GzipFile | None = None
        self.last_flush = 0.0
        self._buf: list = []  # encoded records not yet in the gzip stream (until the next tick)
        self._size = 0

    def _open(self) -> None:
        path = os.path.join(self.dir, NAME)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        self.raw = raw = os.fdopen(fd, "ab")
        self.gz = gzip.GzipFile(fileobj=raw, mode="ab", compresslevel=5)
        if os.fstat(raw.fileno()).st_size == 0:
            self._put({"trace": 1, **self.header})

    def _put(self, rec: dict) -> None:
        self._add((json.dumps(rec, separators=(",", ":")) + "\n").encode("utf-8", "replace"))

    def _add(self, data: bytes) -> None:
        """Records reach the gzip stream in one write per tick (one a line cost a third of
        the supervisor's CPU at 1,000 lines/s); nothing is readable before the sync flush anyway."""
        self._buf.append(data)
        self._size += len(data)
        if self._size >= 1 << 16:
            self._drain()

    def _drain(self) -> None:
        if self._buf:
            assert self.gz is not None  # records are buffered only once the file is open (_open)
            self.gz.write(b"".join(self._buf))
            self._buf, self._size = [], 0

    def write(self, rec: dict) -> None:
        if self.gz is None:
            self._open()
        self._put(rec)

    def out(self, t: float, line: str) -> None:
        if self.gz is None:
            self._open()
        # the bytes json.dumps({"t": …, "out": line}, separators=(",", ":")) gives, without its dict walk
        self._add(('{"t":' + repr(round(t, 3)) + ',"out":' + json.dumps(line) + "}\n")
                  .encode("utf-8", "replace"))

    def out_lines(self, t: float, lines) -> None:
        """``out(t, line)`` for each of ``lines``, the same bytes, built as one string (the
        watch loop's lines of one read share their ``t``)."""
        if not lines:
            return
        if self.gz is None:
            self._open()
        head = '{"t":' + repr(round(t, 3)) + ',"out":'
        # json.dumps(str) is encode_basestring_ascii(str): ASCII, so the encode cannot fail
        self._add((head + ("}\n" + head).join(map(_quote, lines)) + "}\n").encode("ascii"))

    def tick(self, t: float) -> None:
        """From the watch loop: a sync flush at most every FLUSH seconds; rotation."""
        gz, raw = self.gz, self.raw
        if gz is None or raw is None or t - self.last_flush < FLUSH:
            return
        self.last_flush = t
        self._drain()
        gz.flush(zlib.Z_SYNC_FLUSH)
        raw.flush()
        if raw.tell() > self.limit:
            self.close()
            os.replace(os.path.join(self.dir, NAME), os.path.join(self.dir, OLD))

    def close(self) -> None:
        if self.gz is not None:
            self._drain()
            self.gz.close()
            if self.raw is not None:
                self.raw.close()
            self.gz = self.raw = None


#: the fields each kind of record may carry, with their types (a reader uses them as such)
_FIELDS = {"t": "number", "out": "string", "run": "?object", "ckpt": "string", "op": "?string",
           "size": "?number", "recorded": "?object", "meta": "?object"}
_RUN = {"profile": "?string", "baseline": "?number", "phase": "?string", "resume": "?bool"}
_RECORDED = {"verdict": "?string", "reason": "?string"}


def check_record(rec: dict):
    """What is wrong with a trace record's fields (None when nothing): a number where a
    number is expected, an object where an object is."""
    return (jsonl.field_error(rec, _FIELDS) or jsonl.field_error(rec.get("run") or {}, _RUN, "run.")
            or jsonl.field_error(rec.get("recorded") or {}, _RECORDED, "recorded.")
            or jsonl.field_error(rec.get("meta") or {}, {"throughput": "?object"}, "meta."))


def iter_records(chunks, name: str, limit: int = jsonl.MAX_TEXT):
    """Each record of a trace's gzip bytes (``chunks``: pieces of them), header included,
    read as the bounded reader reads (agent/base/jsonl.py): ``BadFile`` with the file and
    line of the first record that is too long, too deep or of the wrong types; a cut last
    block or line is dropped. Several gzip members (one per writer) read as one stream."""
    for _n, rec in jsonl.records(jsonl.gunzip(chunks, name, limit), name, check=check_record):
        yield rec


def read_records(path: str) -> list:
    """Every record of a trace file (header included)."""
    with open(path, "rb") as f:
        return list(iter_records(jsonl.file_chunks(f), path, jsonl.text_limit(os.fstat(f.fileno()).st_size)))


def parse(data: bytes, name: str = "trace") -> list:
    """Every record of a trace's bytes (header included)."""
    return list(iter_records([data], name, jsonl.text_limit(len(data))))


def job_records(directory: str) -> list:
    """The records of a job dir's trace (the rotated older file first)."""
    recs = []
    for name in (OLD, NAME):
        p = os.path.join(directory, name)
        if os.path.exists(p):
            recs += read_records(p)
    return recs
