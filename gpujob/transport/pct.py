"""Enter a Proxmox LXC container: ``pct exec VMID -- argv`` through another transport.

``pct exec`` hands its arguments to ``lxc-attach`` as an argv, without a shell,
so the argv reaches the container exactly as the inner transport delivered it:
quoted once by ``ssh`` (for the host's login shell), never again.

Commands ride one multiplexed ``pct exec`` (see mux.py) opened on first use;
when the container cannot run it (no python3), each command gets a ``pct exec``
of its own instead.
"""

from __future__ import annotations

import re
import threading
from typing import NamedTuple, Sequence

from gpujob.errors import ConnectError, ConnectionLost
from gpujob.transport.base import (KILL_AFTER, OnData, Result, Stdin, Transport, timed_out_by,
                                   with_timeout)
from gpujob.transport.mux import SERVER_SOURCE, MuxClient

MUX_START_TIMEOUT = 30.0


_NOT_RUNNING = re.compile(r"CT (\d+) not running")
_NO_CONFIG = re.compile(r"Configuration file '[^']*/(\d+)\.conf' does not exist")


def pct_error(text: str | bytes, vmid: int, where: str) -> ConnectError | None:
    """gpujob's own line (exit 3: could not enter the target) for what pct says when
    the container cannot be entered at all: stopped, or no such vmid. None for
    anything else (then the command's own output and exit code stand)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if _NOT_RUNNING.search(first):
        return ConnectError(f"container {vmid} on {where} is not running (pct: {first})",
                            hint=f"start it on the host: pct start {vmid}")
    if _NO_CONFIG.search(first):
        return ConnectError(f"no container {vmid} on {where} (pct: {first})",
                            hint="check the vmid in hosts.yaml (`pct list` on the host lists them)")
    return None


class PctTransport(Transport):
    def __init__(self, inner: Transport, vmid: int, *, pct: str = "pct", name: str | None = None,
                 mux: bool = True):
        if isinstance(vmid, bool) or not isinstance(vmid, int):
            raise TypeError(f"vmid must be an integer, got {vmid!r}")
        self.inner = inner
        self.vmid = vmid
        self.pct = pct
        self.name = name or f"vmid {vmid}"
        self.use_mux = mux
        self._mux: MuxClient | None = None
        self._mux_lock = threading.Lock()

    def describe(self) -> str:
        return f"{self.name} (vmid {self.vmid}) on {self.inner.describe()}"

    def host_argv(self, argv: Sequence[str]) -> list[str]:
        """The argv the host runs: ``pct exec VMID -- argv``."""
        return [self.pct, "exec", str(self.vmid), "--", *argv]

    def mux_argv(self) -> list[str]:
        return self.host_argv(["python3", "-c", SERVER_SOURCE])

    def mux(self) -> MuxClient | None:
        """The open exec channel (started on first use, restarted after a drop), or
        None when this container cannot run it."""
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
            known = pct_error(said, self.vmid, self.inner.describe())
            if known is not None:  # stopped or missing: no command can run there
                raise known
            if client.error:  # something else on the channel: say what, never misread it
                raise ConnectionLost(client.error)
            if said.strip():
                # pct or the container said why (stopped, no python3): a pct exec per
                # command from now on, whose results carry that same message
                self.use_mux = False
                return None
            # nothing said: the link itself went (a connection cut while starting)
            raise ConnectionLost(f"lost the connection to {self.inner.describe()} while opening "
                                 f"the exec channel into {self.name}")

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
        # The timeout is enforced inside the container, so the command and its
        # children end there; the inner transport only gets a later backstop.
        inner_timeout = None if timeout is None else timeout + KILL_AFTER + 5
        result = self.inner.run(self.host_argv(with_timeout(argv, timeout)), stdin=stdin,
                                timeout=inner_timeout, on_stdout=on_stdout, on_stderr=on_stderr)
        result.argv = list(argv)
        if result.exit_code in (2, 255) and not result.stdout:
            known = pct_error(result.stderr.decode("utf-8", "replace"), self.vmid, self.inner.describe())
            if known is not None:  # pct's own exit code is not the command's
                raise known
        if timeout is not None and not result.timed_out and \
                timed_out_by(timeout, result.duration, result.exit_code):
            result.timed_out, result.exit_code = True, 124
        return result

    def status_result(self) -> "PctStatus":
        """``pct status VMID`` as it answered: exit code, output, error tail."""
        r = self.inner.run([self.pct, "status", str(self.vmid)], timeout=30)
        return PctStatus(r.exit_code, r.text.strip(), r.tail())

    def status(self) -> str:
        """``running``, ``stopped``, or what ``pct status`` said when it failed."""
        st = self.status_result()
        if st.exit_code == 0 and st.out.startswith("status:"):
            return st.out.split(":", 1)[1].strip()
        if _NO_CONFIG.search(st.err or ""):  # pct's raw config-file line said in gpujob's words
            return f"no such vmid {self.vmid} on the host (check hosts.yaml; `pct list` lists them)"
        return st.err or f"pct status exited {st.exit_code}"

    def open_stream(self, argv: Sequence[str]):
        """``argv`` in the container as a raw byte stream (``pct exec`` over the inner stream)."""
        return self.inner.open_stream(self.host_argv(argv))


class PctStatus(NamedTuple):
    exit_code: int
    out: str
    err: str
