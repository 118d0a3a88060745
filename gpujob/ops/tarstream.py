"""A tar archive produced while it is read: shipping 1 GB holds one chunk in memory.

The size is known before the first byte (the agent reads exactly that many bytes of
each stream), because every header is built up front from ``stat``; file bodies are
read only when the transport asks for the next chunk. Modes keep only the
permission bits (no setuid, setgid or sticky), owners are root.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Iterator

BLOCK = tarfile.BLOCKSIZE
RECORD = tarfile.RECORDSIZE
CHUNK = 256 * 1024


def _padding(size: int, unit: int = BLOCK) -> int:
    return -size % unit


def header(rel: str, size: int, mtime: float, mode: int) -> bytes:
    info = tarfile.TarInfo(rel)
    info.size = size
    info.mtime = int(mtime)
    info.mode = mode & 0o777
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


class TarStream:
    """``read(n)`` yields the archive of ``files`` (relative to ``src``, or ``src``
    itself when it is a file) piece by piece; ``size`` is its exact length.

    A file that grows or shrinks between ``stat`` and reading is cut or padded with
    NULs to the size announced (the tar stays valid) and its name lands in ``changed``."""

    def __init__(self, src: Path, files: list[str]):
        self.entries: list[tuple[bytes, Path, int]] = []
        total = 0
        for rel in files:
            path = src if src.is_file() else src / rel
            st = os.stat(path)
            head = header(rel, st.st_size, st.st_mtime, st.st_mode)
            self.entries.append((head, path, st.st_size))
            total += len(head) + st.st_size + _padding(st.st_size)
        total += 2 * BLOCK
        self.size = total + _padding(total, RECORD)
        self.changed: list[str] = []
        self._pieces: Iterator[bytes] | None = None
        self._buf = b""

    def _generate(self) -> Iterator[bytes]:
        for head, path, size in self.entries:
            yield head
            left = size
            with open(path, "rb") as f:
                while left > 0:
                    data = f.read(min(CHUNK, left))
                    if not data:  # shrank while we shipped it
                        self.changed.append(str(path))
                        data = b"\0" * min(CHUNK, left)
                    left -= len(data)
                    yield data
                if f.read(1):
                    self.changed.append(str(path))
            yield b"\0" * _padding(size)
        yield b"\0" * (self.size - self._body_size())

    def _body_size(self) -> int:
        return sum(len(h) + s + _padding(s) for h, _, s in self.entries)

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that is left when ``n`` < 0): the next piece as it was
        read from its file, without copying it (less than ``n`` is not the end; b"" is)."""
        if self._pieces is None:
            self._pieces = self._generate()
        if n is None or n < 0:
            rest = [self._buf, *self._pieces]
            self._buf = b""
            return b"".join(rest)
        while not self._buf:
            piece = next(self._pieces, None)
            if piece is None:
                return b""
            self._buf = piece
        if len(self._buf) <= n:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def seek(self, pos: int) -> None:
        if pos != 0:
            raise ValueError("a TarStream can only start over")
        self._pieces, self._buf, self.changed = None, b"", []


class Concat:
    """Several readables (bytes or objects with ``read``) read one after the other;
    ``seek(0)`` starts all of them over (the agent may have to be shipped first)."""

    def __init__(self, parts: list, on_read=None):
        self.parts = [p if hasattr(p, "read") else _Bytes(p) for p in parts]
        self.index = 0
        self.on_read = on_read  # called with (bytes read so far, bytes in all) as it is read
        self.total = sum(p.size if hasattr(p, "size") else len(p.data) if isinstance(p, _Bytes) else 0
                         for p in self.parts)
        self.done = 0

    def read(self, n: int = -1) -> bytes:
        while self.index < len(self.parts):
            data = self.parts[self.index].read(n)
            if data:
                self.done += len(data)
                if self.on_read is not None:
                    self.on_read(self.done, self.total)
                return data
            self.index += 1
        return b""

    def seek(self, pos: int) -> None:
        if pos != 0:
            raise ValueError("Concat can only start over")
        for part in self.parts:
            part.seek(0)
        self.index = self.done = 0


class _Bytes:
    def __init__(self, data: bytes):
        self.data, self.pos = bytes(data), 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n is None or n < 0 else self.pos + n
        out = self.data[self.pos:end]
        self.pos += len(out)
        return out

    def seek(self, pos: int) -> None:
        self.pos = pos
