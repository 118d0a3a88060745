"""The boot hook of jobs marked ``resume_after_reboot`` (stdlib only).

When the container restarts, everything in it dies, the supervisor included, and
the laptop may be away. For such jobs gpujob puts one line in the container's
``/etc/rc.local``, which both systemd (``rc-local.service``, when the file is
executable) and sysvinit run at boot: it starts ``agent boot``, which gives every
such job whose supervisor is gone a new one. That supervisor sees that the
container restarted under the job's command and starts it again from its
checkpoint (``resume_args``). The line names gpujob's home; it goes when no job
of that home needs it any more. Both edits write a temp file and rename it.
"""

from __future__ import annotations

import os
import shlex

RC_LOCAL = "/etc/rc.local"
HEADER = "#!/bin/sh\n# rc.local: run at the end of boot (systemd's rc-local.service, sysvinit)\n"


def marker(home: str) -> str:
    return f"# gpujob-boot {home}"


def hook_line(python: str, agent: str, home: str) -> str:
    cmd = shlex.join([python, agent, "--home", home, "boot"])
    log = shlex.quote(os.path.join(home, "boot.log"))
    return f"{cmd} >>{log} 2>&1 &  {marker(home)}"


def with_line(text: str, line: str, home: str) -> str:
    """``text`` (an rc.local, maybe empty) with our line for ``home`` in it, once,
    before a closing ``exit 0``."""
    lines = [ln for ln in (text or HEADER).splitlines() if not ln.endswith(marker(home))]
    at = len(lines)
    while at > 0 and not lines[at - 1].strip():
        at -= 1
    if at > 0 and lines[at - 1].strip() == "exit 0":
        at -= 1
    lines.insert(at, line)
    return "\n".join(lines) + "\n"


def without_line(text: str, home: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if not ln.endswith(marker(home))) + "\n"


def _write(path: str, text: str) -> None:
    tmp = f"{path}.gpujob-tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)


def install(python: str, agent: str, home: str, path: str = RC_LOCAL) -> str:
    """Put the hook in; returns the line."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    line = hook_line(python, agent, home)
    new = with_line(text, line, home)
    if new != text or not os.access(path, os.X_OK):
        _write(path, new)
    return line


def remove(home: str, path: str = RC_LOCAL) -> bool:
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return False
    if marker(home) not in text:
        return False
    _write(path, without_line(text, home))
    return True


def boot_identity() -> str:
    """Changes whenever the container (or the machine) starts again: the kernel's
    boot id and the start time of this PID namespace's init."""
    from gpujob.agent.proc import start_ticks
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{boot}/{start_ticks(1)}"
