"""Every wait over 2 s says what it waits for (issue 34 item 2): on a terminal rich's
progress display (bytes, rate and a bar when the size is known, else the seconds), in a
pipe a plain line at 2 s and then every 10 s. Nothing is said of a wait that ends sooner."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

AFTER = 2.0  # a wait shorter than this says nothing
EVERY = 10.0  # a pipe's line again after this many seconds


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


class Wait:
    """``with Wait(console, "what") as w:`` ... ``w.say("now this")``, ``w.bytes(done, total)``.
    ``what`` may change while it waits; the line shows the newest."""

    def __init__(self, console, what: str, *, clock: Callable[[], float] = time.monotonic):
        self.console, self.what, self.clock = console, what, clock
        self.done: Optional[int] = None
        self.total: Optional[int] = None
        self._start = self._since = clock()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._progress: Any = None  # rich.progress.Progress once shown on a terminal
        self.lines: list[str] = []  # what a pipe was told (tests read it too)

    def say(self, what: str) -> None:
        with self._lock:
            if what != self.what:
                self.what, self._since = what, self.clock()
                self.done = self.total = None

    def bytes(self, done: int, total: int) -> None:
        with self._lock:
            if self.done is None:
                self._since = self.clock()
            self.done, self.total = done, total

    def text(self) -> str:
        """The line as it stands now (pure on the state, for a pipe)."""
        with self._lock:
            what, done, total, since = self.what, self.done, self.total, self._since
        now = self.clock()
        if done is not None and total:
            rate = done / max(now - since, 1e-3)
            return f"{what}: {_mb(done)} of {_mb(total)}, {_mb(rate)}/s"
        return f"{what} ({now - since:.0f}s)"

    def __enter__(self) -> Wait:
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpujob-wait")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._progress is not None:
            self._progress.stop()

    def _run(self) -> None:
        if self._stop.wait(AFTER):
            return
        if self.console.is_terminal:
            self._terminal()
            return
        while True:
            line = self.text()
            self.lines.append(line)
            from gpujob.show import render
            self.console.print(render.lit(f"· {line}", "dim"), soft_wrap=True)
            if self._stop.wait(EVERY):
                return

    def _terminal(self) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
        p = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
                     TimeElapsedColumn(), console=self.console, transient=True)
        self._progress = p
        task = p.add_task(self.what, total=None)
        p.start()
        while not self._stop.wait(0.2):
            with self._lock:
                done, total = self.done, self.total
            p.update(task, description=self.text(), completed=done or 0,
                     total=total if done is not None else None)
