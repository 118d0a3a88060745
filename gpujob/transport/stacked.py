"""A place entered through another transport, as ``pct exec`` enters a container over
ssh (``docker exec`` or ``kubectl exec`` would be the same shape): a subclass says only
how the inner side runs an argv inside (:meth:`Stacked.host_argv`, a prefix) and how it
says the place cannot be entered at all (:meth:`Stacked.refusal`).

Commands ride one multiplexed exec channel (see mux.py) opened on first use over the
inner transport; when the place cannot run it (no python3), each command gets an
entering command of its own instead, its timeout enforced inside.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from typing import Sequence

from gpujob.errors import ConnectError, ConnectionLost
from gpujob.transport.base import (KILL_AFTER, OnData, Result, Stdin, Transport, timed_out_by,
                                   with_timeout)
from gpujob.transport.mux import SERVER_SOURCE, MuxClient

MUX_START_TIMEOUT = 30.0


class Stacked(Transport):
    #: exit codes of the entering command itself, never the command's (pct: 2 and 255)
    entry_exits: tuple[int, ...] = ()

    def __init__(self, inner: Transport, name: str, *, mux: bool = True):
        self.inner = inner
        self.name = name
        self.use_mux = mux
        self._mux: MuxClient | None = None
        self._mux_lock = threading.Lock()

    @abstractmethod
    def host_argv(self, argv: Sequence[str]) -> list[str]:
        """The argv the inner transport runs to run ``argv`` inside."""

    def refusal(self, said: str) -> ConnectError | None:
        """gpujob's own line for what the entering command said when the place cannot be
        entered at all (stopped, missing); None for anything else."""
        return None

    def describe(self) -> str:
        return f"{self.name} on {self.inner.describe()}"

    def mux_argv(self) -> list[str]:
        return self.host_argv(["python3", "-c", SERVER_SOURCE])

    def mux(self) -> MuxClient | None:
        """The open exec channel (started on first use, restarted after a drop), or
        None when this place cannot run it."""
        with self._mux_lock:
            if self._mux is not None and self._mux.alive:
                return self._mux
            if not self.use_mux:
                return None
            stream = self.inner.open_stream(self.mux_argv())
            client = MuxClient(stream, self.describe())
            if client.wait_ready(MUX_START_TIMEOUT):
                self._mux = client
                return client
            said = stream.stderr()
            client.close()
            known = self.refusal(said.decode("utf-8", "replace"))
            if known is not None:  # stopped or missing: no command can run there
                raise known
            if client.error:  # something else on the channel: say what, never misread it
                raise ConnectionLost(client.error)
            if said.strip():
                # the entering command or the place said why (stopped, no python3): an
                # entering command per command from now on, whose results carry that message
                self.use_mux = False
                return None
            # nothing said: the link itself went (a connection cut while starting)
            raise ConnectionLost(f"lost the connection to {self.inner.describe()} while opening "
                                 f"the exec channel into {self.name}")

    def begin(self, argv: Sequence[str], *, timeout: float | None = None):
        """``argv`` sent on the exec channel if it is open already, without awaiting its
        end: ``(channel, pending)`` for ``channel.result(pending)``; None when the channel
        is not open yet (opening it waits on the connection: ``run`` it instead)."""
        mux = self._mux
        if mux is None or not mux.alive:
            return None
        return mux, mux.start(argv, timeout=timeout)

    def close(self) -> None:
        with self._mux_lock:
            if self._mux is not None:
                self._mux.close()
                self._mux = None

    def run(self, argv: Sequence[str], *, stdin: Stdin = None, timeout: float | None = None,
            on_stdout: OnData | None = None, on_stderr: OnData | None = None) -> Result:
        mux = self.mux()
        if mux is not None:
            return mux.run(argv, stdin=stdin, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr)
        # The timeout is enforced inside, so the command and its children end there;
        # the inner transport only gets a later backstop.
        inner_timeout = None if timeout is None else timeout + KILL_AFTER + 5
        result = self.inner.run(self.host_argv(with_timeout(argv, timeout)), stdin=stdin,
                                timeout=inner_timeout, on_stdout=on_stdout, on_stderr=on_stderr)
        result.argv = list(argv)
        if result.exit_code in self.entry_exits and not result.stdout:
            known = self.refusal(result.stderr.decode("utf-8", "replace"))
            if known is not None:  # the entering command's own exit code is not the command's
                raise known
        if timeout is not None and not result.timed_out and \
                timed_out_by(timeout, result.duration, result.exit_code):
            result.timed_out, result.exit_code = True, 124
        return result

    def open_stream(self, argv: Sequence[str]):
        """``argv`` inside as a raw byte stream (the entering command over the inner stream)."""
        return self.inner.open_stream(self.host_argv(argv))
