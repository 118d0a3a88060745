"""The one bounded reader of JSON Lines (stdlib only; the controller uses it too): traces,
journals (events.jsonl, samples.jsonl), samples files, the ledger and registers, and the
streams of them that come back from a host. A file from outside (a trace someone shared,
a job dir a trainer can write) is data that may be hostile, so every read is bounded:

- the decompressed size of a gzip file (``MAX_TEXT``: a bomb stops there),
- the length of a line (``MAX_LINE``: read in chunks, never a ``readline()`` without a limit),
- the nesting of a JSON value (``MAX_DEPTH``: checked before ``json.loads``),
- and, through a ``check`` per record, the types of the fields a reader uses.

A bad file is answered with :class:`BadFile`: one line, ``file:line: what was wrong``. A
reader that must go on (the supervisor, ``status``) passes ``strict=False``: a bad line is
skipped and counted instead. A torn last line (a writer that died mid-record) and a
trimmed journal's punched-out start (NULs) are never errors.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from itertools import compress
from typing import Callable, Iterable, Iterator, Optional

MAX_TEXT = 1 << 30  # decompressed bytes of a gzip file, at least (text_limit: more for a large one)
MAX_RATIO = 200  # decompressed to compressed: a trainer's log compresses ~10-50x, a gzip bomb ~1000x
MAX_LINE = 4 << 20  # one record (a trainer line in a trace is far shorter)
MAX_DEPTH = 64  # nesting of one record (a trace record is 3 deep, a ledger 6)
CHUNK = 1 << 16  # a file is read in pieces of this
PIECE = 1 << 20  # decompressed pieces

_BRACKETS = re.compile(rb"[\[\]{}]")
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


def text_limit(compressed: int) -> int:
    """The decompressed size a gzip file of ``compressed`` bytes may have: MAX_TEXT, or
    MAX_RATIO times its size when that is more (a trace rotates at journal.keep_log, 256 MiB
    by default: its text is far over MAX_TEXT; the reader streams it, never holding it)."""
    return max(MAX_TEXT, MAX_RATIO * max(0, compressed))


class BadFile(ValueError):
    """A file (or stream) that is not what it should be: ``name:line: what``."""

    def __init__(self, name: str, line: Optional[int], what: str):
        self.name, self.line, self.what = name, line, what
        super().__init__(f"{name}:{line}: {what}" if line else f"{name}: {what}")


def too_deep(data: bytes, max_depth: int = MAX_DEPTH) -> bool:
    """Does the JSON value in ``data`` nest deeper than ``max_depth`` (brackets inside
    strings not counted)? Cheap for the usual record: fewer brackets than that in all."""
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return False
    level = 0
    for m in _BRACKETS.finditer(_STRINGS.sub(b'""', data)):
        level += 1 if m.group() in (b"[", b"{") else -1
        if level > max_depth:
            return True
    return False


def loads(data, max_depth: int = MAX_DEPTH):
    """``json.loads`` that refuses (ValueError) a value nested deeper than ``max_depth``
    instead of a RecursionError."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if too_deep(raw, max_depth):
        raise ValueError(f"nested deeper than {max_depth} levels")
    try:
        return json.loads(raw)
    except RecursionError:  # a max_depth above the interpreter's limit
        raise ValueError("nested too deep") from None
    except UnicodeDecodeError:
        raise ValueError("not UTF-8") from None


def gunzip(chunks: Iterable[bytes], name: str, limit: int = MAX_TEXT) -> Iterator[bytes]:
    """The decompressed bytes of a gzip stream (several members read as one), in pieces of
    at most PIECE; past ``limit`` bytes, BadFile. A cut last member ends the stream (a
    writer that died); bytes that are not gzip at all are BadFile."""
    d = zlib.decompressobj(zlib.MAX_WBITS | 16)
    total, started = 0, False
    for chunk in chunks:
        while chunk:
            try:
                out = d.decompress(chunk, PIECE)
            except zlib.error as e:
                if not started:
                    raise BadFile(name, None, f"is not gzip ({e})") from None
                return  # damage after whole records: what came before stands
            started = True
            chunk = d.unconsumed_tail
            if d.eof:
                chunk, d = d.unused_data + chunk, zlib.decompressobj(zlib.MAX_WBITS | 16)
            total += len(out)
            if total > limit:
                raise BadFile(name, None, f"decompresses to more than {limit >> 20} MiB (a gzip bomb?)")
            if out:
                yield out


class Splitter:
    """Bytes in, whole lines out (``feed`` returns ``[(line number, bytes or None)]``); a
    line longer than ``max_line`` is never held: it comes out as ``None`` as soon as it is
    past the bound, and its bytes are dropped up to its newline. NULs that start a line (a
    trimmed journal's punched-out hole, as long as what was trimmed) are never held.
    ``close`` gives the last line when the data did not end in a newline (a torn record, as
    its reader sees fit)."""

    def __init__(self, max_line: int = MAX_LINE):
        self.max_line = max_line
        self.buf = bytearray()
        self.lineno = 0
        self.dropping = False

    def feed(self, chunk: bytes) -> list:
        out: list = []
        if not chunk.translate(None, b"\n"):  # only newlines (a bomb of them): counted, never looped over
            n = len(chunk)
            if n:
                self._line(b"", out)
                self.lineno += n - 1
            return out
        parts = chunk.split(b"\n")
        if len(parts) == 1:
            self._keep(chunk, out)
            return out
        self._line(parts[0], out)  # the line held from before ends at the first newline
        base, middle = self.lineno, parts[1:-1]
        for i, piece in compress(enumerate(middle, 1), middle):  # the blank ones passed over in C
            self.lineno = base + i - 1
            self._line(piece, out)
        self.lineno = base + len(middle)
        self._keep(parts[-1], out)
        return out

    def _keep(self, rest: bytes, out: list) -> None:
        """The start of a line; one past ``max_line`` is said at once (``None``), then dropped."""
        if not self.dropping:
            if not self.buf:
                rest = rest.lstrip(b"\0")
            if len(self.buf) + len(rest) > self.max_line:
                self.buf.clear()
                self.dropping = True
                self.lineno += 1
                out.append((self.lineno, None))
            else:
                self.buf += rest

    def _line(self, piece: bytes, out: list) -> None:
        if self.dropping:  # its end: already said
            self.dropping = False
            return
        if not self.buf:
            piece = piece.lstrip(b"\0")
        self.lineno += 1
        if len(self.buf) + len(piece) > self.max_line:
            out.append((self.lineno, None))
        else:
            self.buf += piece
            out.append((self.lineno, bytes(self.buf)))
        self.buf.clear()
        self.dropping = False

    def close(self) -> Optional[tuple]:
        if not self.buf or self.dropping:
            return None
        self.lineno += 1
        line = bytes(self.buf)
        self.buf.clear()
        return self.lineno, line


class Stats:
    """What a lenient read passed over."""

    def __init__(self):
        self.skipped = 0
        self.first: Optional[str] = None  # the first reason, ``line N: what``

    def skip(self, lineno: int, what: str) -> None:
        self.skipped += 1
        if self.first is None:
            self.first = f"line {lineno}: {what}"


class Records:
    """The push form of :func:`records`: ``feed(chunk)`` and ``close()`` return the
    ``[(line number, record)]`` that bytes completed (for a stream that comes in pieces)."""

    def __init__(self, name: str, *, check: Optional[Callable[[dict], Optional[str]]] = None,
                 strict: bool = True, stats: Optional[Stats] = None, max_line: int = MAX_LINE,
                 max_depth: int = MAX_DEPTH):
        self.name, self.check, self.strict = name, check, strict
        self.stats = stats if stats is not None else Stats()
        self.max_line, self.max_depth = max_line, max_depth
        self.split = Splitter(max_line)

    def feed(self, chunk: bytes) -> list:
        return [(n, rec) for n, rec in ((n, self._one(n, line)) for n, line in self.split.feed(chunk))
                if rec is not None]

    def close(self) -> list:
        last = self.split.close()
        if last is None:
            return []
        try:  # no newline after it: a torn tail is tolerated, whatever it holds
            rec = self._one(*last)
        except BadFile:
            self.stats.skip(last[0], "a torn last record")
            return []
        return [(last[0], rec)] if rec is not None else []

    def _one(self, lineno: int, line: Optional[bytes]):
        if line is None:
            return self._bad(lineno, f"a line longer than {self.max_line} bytes")
        line = line.lstrip(b"\0")  # a trimmed journal's punched-out start reads as NULs
        if not line.strip():
            return None
        if too_deep(line, self.max_depth):
            return self._bad(lineno, f"nested deeper than {self.max_depth} levels")
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            self.stats.skip(lineno, "not a whole JSON record")
            return None
        if not isinstance(rec, dict):
            return self._bad(lineno, f"expected a JSON object, got {kind(rec)}")
        why = self.check(rec) if self.check is not None else None
        return self._bad(lineno, why) if why else rec

    def _bad(self, lineno: int, what: str):
        if self.strict:
            raise BadFile(self.name, lineno, what)
        self.stats.skip(lineno, what)
        return None


def records(chunks: Iterable[bytes], name: str, **kw) -> Iterator[tuple]:
    """``(line number, record)`` for each JSON object of a JSON Lines byte stream. A line
    too long or nested too deep, a record that is not an object and one that ``check``
    refuses (it returns what is wrong, or None) are BadFile when ``strict``, else skipped
    and counted in ``stats``. A line that does not parse is always skipped and counted
    (a torn record: the journal's writer died mid-line), never an error; so is a last
    line without a newline that is bad in any way. Keywords: those of :class:`Records`."""
    r = Records(name, **kw)
    for chunk in chunks:
        yield from r.feed(chunk)
    yield from r.close()


def file_chunks(f, limit: Optional[int] = None, name: str = "") -> Iterator[bytes]:
    """An open binary file's bytes in pieces of at most CHUNK (``limit``: BadFile past it)."""
    total = 0
    while True:
        b = f.read(CHUNK)
        if not b:
            return
        total += len(b)
        if limit is not None and total > limit:
            raise BadFile(name, None, f"is over {limit >> 20} MiB")
        yield b


def read_bounded(path: str, limit: int) -> bytes:
    """A whole small file (job.json, a register), or BadFile past ``limit`` bytes."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise BadFile(path, None, f"is over {limit >> 20} MiB")
    return data


# ---- the types of fields, for the checks readers pass -------------------------------------
def kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number" if math.isfinite(v) else f"{v} (not a finite number)"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    return "an object" if isinstance(v, dict) else type(v).__name__


def is_number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


_KINDS = {"number": ("a number", is_number), "string": ("a string", lambda v: isinstance(v, str)),
          "object": ("an object", lambda v: isinstance(v, dict)),
          "list": ("a list", lambda v: isinstance(v, list)),
          "bool": ("a boolean", lambda v: isinstance(v, bool))}


def field_error(rec: dict, fields: dict, prefix: str = "") -> Optional[str]:
    """What is wrong with ``rec``'s fields (``{name: "number" | "string" | ...}``, a leading
    ``?`` for one that may also be null), or None; absent fields are never wrong."""
    for f, want in fields.items():
        if f not in rec:
            continue
        v = rec[f]
        opt = want.startswith("?")
        label, ok = _KINDS[want.lstrip("?")]
        if (opt and v is None) or ok(v):
            continue
        return f"field {prefix}{f}: expected {label}{' or null' if opt else ''}, got {kind(v)}"
    return None
