"""Enter a Proxmox LXC container: ``pct exec VMID -- argv`` through another transport.

``pct exec`` hands its arguments to ``lxc-attach`` as an argv, without a shell,
so the argv reaches the container exactly as the inner transport delivered it:
quoted once by ``ssh`` (for the host's login shell), never again.
"""

from __future__ import annotations

from typing import Sequence

from gpujob.transport.base import (KILL_AFTER, OnData, Result, Stdin, Transport, timed_out_by,
                                   with_timeout)


class PctTransport(Transport):
    def __init__(self, inner: Transport, vmid: int, *, pct: str = "pct", name: str | None = None):
        if isinstance(vmid, bool) or not isinstance(vmid, int):
            raise TypeError(f"vmid must be an integer, got {vmid!r}")
        self.inner = inner
        self.vmid = vmid
        self.pct = pct
        self.name = name or f"vmid {vmid}"

    def describe(self) -> str:
        return f"{self.name} (vmid {self.vmid}) on {self.inner.describe()}"

    def host_argv(self, argv: Sequence[str]) -> list[str]:
        """The argv the host runs: ``pct exec VMID -- argv``."""
        return [self.pct, "exec", str(self.vmid), "--", *argv]

    def run(self, argv: Sequence[str], *, stdin: Stdin = None, timeout: float | None = None,
            on_stdout: OnData | None = None, on_stderr: OnData | None = None) -> Result:
        # The timeout is enforced inside the container, so the command and its
        # children end there; the inner transport only gets a later backstop.
        inner_timeout = None if timeout is None else timeout + KILL_AFTER + 5
        result = self.inner.run(self.host_argv(with_timeout(argv, timeout)), stdin=stdin,
                                timeout=inner_timeout, on_stdout=on_stdout, on_stderr=on_stderr)
        result.argv = list(argv)
        if timeout is not None and not result.timed_out:
            if timed_out_by(timeout, result.duration, result.exit_code):
                result.timed_out, result.exit_code = True, 124
        return result

    def status(self) -> str:
        """``running``, ``stopped``, or what ``pct status`` said when it failed."""
        r = self.inner.run([self.pct, "status", str(self.vmid)], timeout=30)
        text = r.text.strip()
        if r.ok and text.startswith("status:"):
            return text.split(":", 1)[1].strip()
        return (r.tail() or f"pct status exited {r.exit_code}")
