"""Enter a Proxmox LXC container: ``pct exec VMID -- argv`` through another transport
(the exec channel and the per-command fallback are stacked.py's).

``pct exec`` hands its arguments to ``lxc-attach`` as an argv, without a shell,
so the argv reaches the container exactly as the inner transport delivered it:
quoted once by ``ssh`` (for the host's login shell), never again.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Sequence

from gpujob.errors import ConnectError
from gpujob.transport.base import Transport
from gpujob.transport.stacked import Stacked

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


class PctTransport(Stacked):
    entry_exits = (2, 255)  # pct's usage/config error, lxc-attach's failure

    def __init__(self, inner: Transport, vmid: int, *, pct: str = "pct", name: str | None = None,
                 mux: bool = True):
        if isinstance(vmid, bool) or not isinstance(vmid, int):
            raise TypeError(f"vmid must be an integer, got {vmid!r}")
        super().__init__(inner, name or f"vmid {vmid}", mux=mux)
        self.vmid = vmid
        self.pct = pct

    def describe(self) -> str:
        return f"{self.name} (vmid {self.vmid}) on {self.inner.describe()}"

    def host_argv(self, argv: Sequence[str]) -> list[str]:
        """The argv the host runs: ``pct exec VMID -- argv``."""
        return [self.pct, "exec", str(self.vmid), "--", *argv]

    def refusal(self, said: str) -> ConnectError | None:
        return pct_error(said, self.vmid, self.inner.describe())

    def status_result(self) -> "PctStatus":
        """``pct status VMID`` as it answered: exit code, output, error tail."""
        r = self.inner.run([self.pct, "status", str(self.vmid)], timeout=30)
        return PctStatus(r.exit_code, r.text.strip(), r.tail())

    def status(self) -> str:
        """``running``, ``stopped``, or what ``pct status`` said when it failed."""
        return status_text(self.status_result(), self.vmid)


def status_text(st: PctStatus, vmid: int) -> str:
    """PctTransport.status's reading of a ``pct status VMID`` result (KeptTransport's too)."""
    if st.exit_code == 0 and st.out.startswith("status:"):
        return st.out.split(":", 1)[1].strip()
    if _NO_CONFIG.search(st.err or ""):  # pct's raw config-file line said in gpujob's words
        return f"no such vmid {vmid} on the host (check hosts.yaml; `pct list` lists them)"
    return st.err or f"pct status exited {st.exit_code}"


class PctStatus(NamedTuple):
    exit_code: int
    out: str
    err: str
