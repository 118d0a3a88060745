"""The transport protocol: run an argv somewhere, stream its output, get a Result.

A failed command is a value (exit code and output), not an exception; only a
transport that cannot do its job at all (connection refused, dropped) raises.

Quoting rule: a transport receives an argv (a list of strings) and is the one
place that turns it into whatever its layer needs. ``ssh`` quotes each argument
exactly once for the remote login shell; ``pct`` passes the argv through
``pct exec VMID -- argv`` which hands it to ``lxc-attach`` without a shell.
No caller ever builds a shell string, so nested ``bash -c "... \\$PATH"`` quoting
cannot happen.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterable, Protocol, Sequence, Union

from gpujob.errors import HostMisbehaving


class Readable(Protocol):
    """What a transport reads a command's stdin from: a file, or any object with ``read``
    (RawStdin, tarstream.Concat, the daemon's frame queues)."""

    def read(self, n: int = ..., /) -> bytes: ...


Stdin = Union[bytes, BinaryIO, Readable, None]
OnData = Callable[[bytes], None]

#: Exit code of a command ended by its timeout (the coreutils ``timeout`` convention).
TIMEOUT_EXIT = 124
#: Seconds between SIGTERM and SIGKILL when a timeout ends a command.
KILL_AFTER = 3
#: The most one captured stream of a command (its answer read into memory: ``ps``/``status``
#: listings, agent replies, pct output; never output handed to a sink as it comes, like
#: exec's) may hold. Past it the host is misbehaving: the command's connection is closed and
#: HostMisbehaving raised, so no host can make the CLI or the daemon grow (issue 35 row 2).
MAX_ANSWER = 8 << 20


def too_much(where: str, argv: Sequence[str]) -> str:
    what = " ".join(str(a) for a in argv[:4])
    return (f"{where} is misbehaving: it sent more than {MAX_ANSWER >> 20} MiB answering "
            f"`{what[:80]}`; its connection was closed")


def keep(buf: bytearray, chunk: bytes, where: str, argv: Sequence[str]) -> None:
    """Add ``chunk`` to a captured answer; HostMisbehaving once it would pass MAX_ANSWER
    (the caller closes the command's connection on its way out)."""
    if len(buf) + len(chunk) > MAX_ANSWER:
        buf.clear()
        raise HostMisbehaving(too_much(where, argv))
    buf += chunk


@dataclass
class Result:
    argv: list[str]
    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    def tail(self, lines: int = 3) -> str:
        """The last lines of stderr (or stdout when stderr is empty), joined with ' | '."""
        src = self.stderr if self.stderr.strip() else self.stdout
        kept = [ln.strip() for ln in src.decode("utf-8", "replace").splitlines() if ln.strip()]
        return " | ".join(kept[-lines:])


class Stream(Protocol):
    """A started command as bytes: ``send`` to its stdin, ``recv`` from its stdout
    (b"" at its end), ``stderr`` what it said there so far, ``close`` ends it."""

    def send(self, data: bytes) -> None: ...
    def recv(self, n: int) -> bytes: ...
    def stderr(self) -> bytes: ...
    def close(self) -> None: ...


class Transport(ABC):
    """Runs argv lists in one place. Subclasses override :meth:`run`,
    :meth:`open_stream` and :meth:`describe`."""

    @abstractmethod
    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: Stdin = None,
        timeout: float | None = None,
        on_stdout: OnData | None = None,
        on_stderr: OnData | None = None,
    ) -> Result:
        """Run ``argv``; stream output to the callbacks as it comes.

        A stream with a callback is not captured (``Result.stdout``/``stderr`` stay
        empty for it), so a 200 MB log never sits in memory. ``timeout`` ends the
        command and everything it started, then returns ``exit_code`` 124 and
        ``timed_out`` True.
        """

    @abstractmethod
    def open_stream(self, argv: Sequence[str]) -> "Stream":
        """Start ``argv`` and hand back its raw byte stream (stdin in, stdout out, no PTY);
        the exec channel (mux.py) rides on one."""

    @abstractmethod
    def describe(self) -> str:
        """A short human name: ``root@10.1.2.6:22``, ``ct200 (vmid 200) via root@…``."""

    def close(self) -> None:  # pragma: no cover - trivial default
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def with_timeout(argv: Sequence[str], timeout: float | None) -> list[str]:
    """Wrap argv in coreutils ``timeout`` so the far side ends the command itself.

    ``timeout`` (without --foreground) signals the whole process group it leads,
    so children go too; SIGKILL follows after KILL_AFTER seconds.
    """
    if timeout is None:
        return list(argv)
    return ["timeout", "-k", str(KILL_AFTER), f"{max(timeout, 0.001):.3f}", *argv]


def timed_out_by(timeout: float | None, elapsed: float, code: int) -> bool:
    """Did a ``with_timeout`` wrapper end the command? (124 after SIGTERM, 137 after SIGKILL.)"""
    return timeout is not None and elapsed >= timeout and code in (TIMEOUT_EXIT, 128 + 9)


class RawStdin:
    """A file descriptor (the CLI's stdin) read straight, unbuffered: each read returns
    what is there now, so an idle open pipe never holds a command back; and a feeder
    thread still waiting in it when the command has exited holds no buffered reader's
    lock that would stop the interpreter from exiting ("Fatal Python error")."""

    def __init__(self, fd: int = 0):
        self.fd = fd

    def read(self, n: int = 65536) -> bytes:
        try:
            return os.read(self.fd, n if n and n > 0 else 65536)
        except OSError:
            return b""


def iter_chunks(stdin: Stdin, size: int = 256 * 1024) -> Iterable[bytes]:
    if stdin is None:
        return
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        mv = memoryview(stdin)
        for i in range(0, len(mv), size):
            yield bytes(mv[i:i + size])
        return
    while True:
        chunk = stdin.read(size)
        if not chunk:
            return
        yield chunk
