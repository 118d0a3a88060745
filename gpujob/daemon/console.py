"""The client's console, shaped like its own (the daemon's half of it): binary sinks on
the client's descriptors, its stdin read only while a request lasts, and a rich console
built as the client's own process would build it (its terminal's size, its environment)."""

from __future__ import annotations

import io
import os
import select
import threading


class FdSink:
    """A binary sink onto the client's descriptor (what sys.stdout.buffer is there)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.failed = False  # a write to the client's descriptor failed (its reader is gone)

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except BlockingIOError:
                select.select([], [self.fd], [])
                continue
            except OSError:
                self.failed = True
                raise
            view = view[n:]
        return len(data)

    def flush(self) -> None:
        pass


class PolledStdin:
    """The client's stdin, read only while its request lasts: a feeder thread still
    waiting when the command is over takes nothing more from it."""

    def __init__(self, fd: int, done: threading.Event):
        self.fd, self.done = fd, done

    def read(self, n: int = 65536) -> bytes:
        while not self.done.is_set():
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.2)
                if ready:
                    return os.read(self.fd, n if n and n > 0 else 65536)
            except OSError:
                return b""
        return b""


def _dims(env: dict, fds: list[int], terminal: bool) -> tuple[int, int]:
    """rich's Console.size as the client's own process would compute it."""
    columns, lines = env.get("COLUMNS"), env.get("LINES")
    w_env = int(columns) if columns and columns.isdigit() else None
    h_env = int(lines) if lines and lines.isdigit() else None
    if w_env is not None and h_env is not None:
        return w_env, h_env
    if terminal and env.get("TERM", "").lower() in ("dumb", "unknown"):
        return 80, 25
    width = height = None
    for fd in fds:  # rich probes stdin, stdout, stderr in that order
        try:
            width, height = os.get_terminal_size(fd)
            break
        except OSError:
            pass
    return (w_env or width or 80), (h_env or height or 25)


class ReaderGone(BrokenPipeError):
    """The client's stdout reader went away (``gpujob status | head -2``): the request ends
    quietly with exit 0, as a closed pipe ends the full CLI (server.py)."""


def _quiet_on_broken_pipe(console) -> None:
    """rich's own answer (dup2 devnull over sys.stdout, SystemExit) would be the daemon's:
    its worker thread would end without an answer and the client would say it died."""
    console.quiet = True
    raise ReaderGone()


def client_console(fd: int, encoding: str, env: dict, fds: list[int]):
    """render.console() as the client's own process would build it: on its descriptor,
    under its environment (piped: soft-wrapped at gpujob's piped width, unless $COLUMNS)."""
    from rich.console import Console

    from gpujob.show import render
    text = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=encoding, write_through=True)
    settings = render.console_settings(os.isatty(fd), env)
    c = Console(file=text, _environ=env, **settings)
    c.on_broken_pipe = lambda: _quiet_on_broken_pipe(c)  # type: ignore[method-assign]
    width, c.height = _dims(env, fds, c.is_terminal)
    c.width = settings.get("width", width)
    return c


class LazyConsole:
    """client_console(...) made on first use: an ``exec`` that has nothing of gpujob's own
    to say (the usual case) never imports rich, which a cold one (oneshot.py) then saves."""

    def __init__(self, *args):
        self._args = args
        self._console = None

    def __getattr__(self, name):
        if self._console is None:
            self._console = client_console(*self._args)
        return getattr(self._console, name)
