"""Many commands over one ``pct exec``: the client of ``mux_server.py``.

One server per container and connection runs every command as its own child,
so a command costs a frame on an open channel instead of a new SSH channel, a
``pct`` process (Perl on Proxmox) and an ``lxc-attach``. Output still streams as
it comes, stdin still streams in, exit codes and timeouts mean what they mean
for every other transport, and commands may run concurrently.

The protocol (docs/wire.md): each side first writes ``PREAMBLE`` (the magic
``GJMX`` and a version byte); the client skips up to ``MAX_STRAY`` stray bytes before
the server's (a motd, an ``lxc-attach`` warning on ``pct exec``'s stdout), and any
other header after it is one clear error, never a misread frame. Then frames are
``type (1 byte) | id (4) | length (4) | payload``
(``HEADER``, network order). To the server: ``O`` open a command (JSON: argv,
timeout, stdin), ``I`` stdin data, ``E`` stdin EOF, ``K`` kill it. From the
server: ``H`` hello (once, ready), ``o`` stdout, ``e`` stderr, ``x`` exit (JSON:
code, timed_out). Two more kinds never travel on the wire: the reader thread
puts them on a waiting call's queue to end it on this side —
``SINK_FAILED`` (``b"!!"``, payload: the exception a caller's output sink raised,
re-raised in the caller after the command is killed) and ``LOST`` (``b"!"``, the
channel closed before the command's ``x``: ConnectionLost).
"""

from __future__ import annotations

import itertools
import json
import queue
import struct
import threading
import time
from pathlib import Path
from typing import NamedTuple, Sequence

from gpujob.errors import ConnectionLost, HostMisbehaving
from gpujob.transport.base import (KILL_AFTER, MAX_ANSWER, TIMEOUT_EXIT, OnData, Result, Stdin, iter_chunks,
                                   too_much)

HEADER = struct.Struct("!cII")
MAGIC = b"GJMX"
VERSION = 1
PREAMBLE = MAGIC + bytes([VERSION])
MAX_STRAY = 64 << 10       # bytes skipped before the server's preamble, at most
MAX_FRAME = 64 << 20       # the largest payload either side sends is far smaller (1 MiB reads)
MAX_SERVER_FRAME = 2 << 20  # what the client takes from the server: its o/e frames are reads of 1 MiB
SERVER_KINDS = (b"H", b"o", b"e", b"x")
SERVER_SOURCE = (Path(__file__).parent / "mux_server.py").read_text()
SINK_FAILED = b"!!"  # local only: a caller's sink raised (payload: the exception)
LOST = b"!"          # local only: the channel closed before the command's exit frame


class _Call:
    """One command in flight. Output goes to its sinks straight from the reader
    thread; only the end (or a sink's error) travels to the waiting caller."""

    def __init__(self, on_stdout: OnData | None, on_stderr: OnData | None, argv: Sequence[str] = ()):
        self.argv = list(argv)
        self.out, self.err = bytearray(), bytearray()
        self.sinks = {b"o": (on_stdout, self.out), b"e": (on_stderr, self.err)}
        self.done: queue.Queue = queue.Queue()
        self.failed = False

    def deliver(self, kind: bytes, payload: bytes) -> bool:
        """Hand on one frame; False when a captured answer would pass MAX_ANSWER (the
        host is misbehaving: the reader closes the channel)."""
        if kind in self.sinks:
            if self.failed:
                return True
            cb, buf = self.sinks[kind]
            if cb is None:
                if len(buf) + len(payload) > MAX_ANSWER:
                    self.failed = True
                    self.out.clear()
                    self.err.clear()
                    return False
                buf += payload
                return True
            try:
                cb(payload)
            except BaseException as e:  # the caller's sink failed: end the command there
                self.failed = True
                self.done.put((SINK_FAILED, e))
        else:
            self.done.put((kind, payload))
        return True


class Pending(NamedTuple):
    """A command sent on the channel whose end is not awaited yet (``MuxClient.start``)."""
    argv: list
    cid: int
    call: _Call
    started: float
    timeout: float | None


class MuxClient:
    """Speaks the frame protocol over a byte stream (``send``, ``recv``, ``close``)."""

    def __init__(self, stream, where: str):
        self.stream = stream
        self.where = where
        self.alive = True
        self.hello = threading.Event()
        self.error: str | None = None  # why the channel was dropped (a bad preamble or header)
        self.misbehaving = False  # dropped because an answer passed MAX_ANSWER
        self.stray = b""  # what came before the server's preamble (kept to say what it was)
        self._calls: dict[int, _Call] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        try:
            self._send_preamble()  # before any frame, so the server knows it is us
        except ConnectionLost:
            pass  # the reader finds the stream closed and ends every call
        threading.Thread(target=self._reader, daemon=True, name="gpujob-mux").start()

    def wait_ready(self, timeout: float) -> bool:
        return self.hello.wait(timeout) and self.alive

    def close(self) -> None:
        self.alive = False
        self.stream.close()

    def _send(self, kind: bytes, cid: int, payload: bytes = b"") -> None:
        with self._send_lock:
            try:
                self.stream.send(HEADER.pack(kind, cid, len(payload)) + payload)
            except (OSError, EOFError) as e:
                self.alive = False
                raise ConnectionLost(f"lost the exec channel to {self.where}: {e}") from None

    def _send_preamble(self) -> None:
        with self._send_lock:
            try:
                self.stream.send(PREAMBLE)
            except (OSError, EOFError) as e:
                self.alive = False
                raise ConnectionLost(f"lost the exec channel to {self.where}: {e}") from None

    def _sync(self, buf: bytearray) -> bool:
        """Drop what comes before the server's preamble; True once it is found. A wrong
        version, or no preamble within MAX_STRAY bytes, is ``self.error``."""
        i = buf.find(MAGIC)
        if i < 0 or len(buf) < i + len(PREAMBLE):
            if len(buf) > MAX_STRAY:
                self.error = (f"no gpujob exec-channel preamble in the first {MAX_STRAY} bytes from "
                              f"{self.where} (it began {bytes(buf[:60])!r})")
            return False
        if buf[i + len(MAGIC)] != VERSION:
            self.error = (f"the exec channel on {self.where} speaks version {buf[i + len(MAGIC)]}, "
                          f"this gpujob speaks {VERSION}")
            return False
        self.stray = bytes(buf[:i])
        del buf[:i + len(PREAMBLE)]
        return True

    def _reader(self) -> None:
        buf = bytearray()
        synced = False
        try:
            while self.error is None:
                data = self.stream.recv(1 << 20)
                if not data:
                    break
                buf += data
                if not synced:
                    synced = self._sync(buf)
                    if not synced:
                        continue
                pos = 0  # parse every whole frame, then drop them from buf at once
                while len(buf) - pos >= HEADER.size:
                    kind, cid, n = HEADER.unpack_from(buf, pos)
                    if kind not in SERVER_KINDS or n > MAX_SERVER_FRAME:
                        self.error = (f"bad frame header on the exec channel from {self.where}: expected a "
                                      f"kind in H, o, e, x and a length <= {MAX_SERVER_FRAME}, got kind "
                                      f"{kind!r}, length {n}")
                        break
                    end = pos + HEADER.size + n
                    if len(buf) < end:
                        break
                    payload = bytes(buf[pos + HEADER.size:end])
                    pos = end
                    if kind == b"H":
                        self.hello.set()
                        continue
                    with self._lock:
                        call = self._calls.get(cid)
                    if call is not None and not call.deliver(kind, payload):
                        self.misbehaving = True
                        self.error = too_much(self.where, call.argv)
                        break
                del buf[:pos]
        except (OSError, EOFError):
            pass
        finally:
            self.alive = False
            self.hello.set()
            with self._lock:
                for call in self._calls.values():
                    call.done.put((LOST, b""))
            if self.error is not None:  # nothing more is read from a stream that broke its wire
                try:
                    self.stream.close()
                except OSError:
                    pass

    def _feed(self, cid: int, stdin: Stdin) -> None:
        try:
            for chunk in iter_chunks(stdin, 1 << 16):
                if cid not in self._calls:  # the command is over (it stopped reading)
                    return
                self._send(b"I", cid, chunk)
            self._send(b"E", cid)
        except ConnectionLost:
            pass

    def run(self, argv: Sequence[str], *, stdin: Stdin = None, timeout: float | None = None,
            on_stdout: OnData | None = None, on_stderr: OnData | None = None) -> Result:
        return self.result(self.start(argv, stdin=stdin, timeout=timeout, on_stdout=on_stdout,
                                      on_stderr=on_stderr))

    def start(self, argv: Sequence[str], *, stdin: Stdin = None, timeout: float | None = None,
              on_stdout: OnData | None = None, on_stderr: OnData | None = None) -> Pending:
        """Send one command and return at once; ``result`` awaits its end. Several sent
        before any is awaited run at the same time (``gpujob ps`` asks many channels
        from one thread this way)."""
        p = Pending(list(argv), next(self._ids), _Call(on_stdout, on_stderr, argv), time.monotonic(), timeout)
        with self._lock:
            self._calls[p.cid] = p.call
        try:
            if not self.alive:
                raise ConnectionLost(f"lost the exec channel to {self.where}")
            self._send(b"O", p.cid, json.dumps({"argv": p.argv, "timeout": timeout,
                                                "stdin": stdin is not None}).encode())
            if stdin is not None:
                threading.Thread(target=self._feed, args=(p.cid, stdin), daemon=True).start()
        except BaseException:
            self.cancel(p)
            raise
        return p

    def cancel(self, p: Pending) -> None:
        """Forget ``p`` and end its command there (never waited for: Ctrl-C, a deadline)."""
        with self._lock:
            gone = self._calls.pop(p.cid, None) is None
        if not gone and self.alive:
            try:
                self._send(b"K", p.cid)
            except ConnectionLost:
                pass

    def result(self, p: Pending, *, until: float | None = None) -> Result:
        """How ``p`` ended. ``until``: a ``time.monotonic()`` past which it is given up on
        (ended there, TimeoutError here), whatever its own timeout."""
        argv, call, cid, started = p.argv, p.call, p.cid, p.started
        backstop = None if p.timeout is None else started + p.timeout + KILL_AFTER + 15
        try:
            while True:
                wait = 0.5 if until is None else min(0.5, max(0.0, until - time.monotonic()))
                try:
                    kind, payload = call.done.get(timeout=wait)
                except queue.Empty:
                    if until is not None and time.monotonic() >= until:
                        raise TimeoutError(f"no answer from {self.where}") from None
                    if backstop is not None and time.monotonic() > backstop:
                        self._send(b"K", cid)
                        return Result(argv, TIMEOUT_EXIT, bytes(call.out), bytes(call.err), True,
                                      time.monotonic() - started)
                    continue
                if kind == b"x":
                    info = json.loads(payload)
                    return Result(argv, info["code"], bytes(call.out), bytes(call.err), info["timed_out"],
                                  time.monotonic() - started)
                if kind == SINK_FAILED:
                    raise payload
                if self.misbehaving:
                    raise HostMisbehaving(self.error or too_much(self.where, argv))
                raise ConnectionLost(self.error
                                     or f"lost the connection to {self.where} while running {argv[0]}")
        except BaseException:  # Ctrl-C, a deadline or an error on our side: it must not live on
            self.cancel(p)
            raise
        finally:
            with self._lock:
                self._calls.pop(cid, None)
