"""The boot hook of jobs marked ``resume_after_reboot`` (stdlib only).

When the container restarts, everything in it dies, the supervisor included, and
the laptop may be away. For such jobs gpujob puts one line in the container's
``/etc/rc.local``, which both systemd (``rc-local.service``, when the file is
executable) and sysvinit run at boot: it starts ``agent boot``, which gives every
such job whose supervisor is gone a new one. That supervisor sees that the
container restarted under the job's command and starts it again from its
checkpoint (``resume_args``). The line names gpujob's home; it goes when no job
of that home needs it any more.

The file runs as root at every boot, so the edit is careful: the line is built
from quoted words only and refused if any of them holds a control character
(nothing in it can end the line and start another); it goes before the file's
last top-level ``exit`` (``exit 0 # done``, ``exit 1``), where it still runs; a
file without a shebang gets ``#!/bin/sh`` (systemd execs it); a symlinked
rc.local is edited where it points (the link stays); both edits write a temp file
from ``mkstemp`` beside the real file and rename it.
"""

from __future__ import annotations

import os
import re
import shlex

from gpujob.agent.base.fsio import temp_beside

RC_LOCAL = "/etc/rc.local"
SHEBANG = "#!/bin/sh\n"
HEADER = SHEBANG + "# rc.local: run at the end of boot (systemd's rc-local.service, sysvinit)\n"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_EXIT = re.compile(r"exit(\s+\S+)?\s*(;\s*)?(#.*)?")  # a top-level exit statement, maybe commented


def marker(home: str) -> str:
    return f"# gpujob-boot {home}"


def _words(*words: str) -> None:
    for word in words:
        if _CONTROL.search(word):
            raise ValueError(f"refusing a boot line with a control character in {word!r}")


def hook_line(python: str, agent: str, home: str) -> str:
    _words(python, agent, home)
    cmd = shlex.join([python, agent, "--home", home, "boot"])
    log = shlex.quote(os.path.join(home, "boot.log"))
    return f"{cmd} >>{log} 2>&1 &  {marker(home)}"


def _ours(line: str, home: str) -> bool:
    return line.endswith("&  " + marker(home))


def with_line(text: str, line: str, home: str) -> str:
    """``text`` (an rc.local, maybe empty) with our line for ``home`` in it, once,
    before its last top-level ``exit``; a shebang first if it had none."""
    if not text.strip():
        text = HEADER
    elif not text.startswith("#!"):
        text = SHEBANG + text
    lines = [ln for ln in text.splitlines() if not _ours(ln, home)]
    exits = [i for i, ln in enumerate(lines) if _EXIT.fullmatch(ln.rstrip())]
    if exits:
        at = exits[-1]
    else:
        at = len(lines)
        while at > 1 and not lines[at - 1].strip():
            at -= 1
    lines.insert(at, line)
    return "\n".join(lines) + "\n"


def without_line(text: str, home: str) -> str:
    return "".join(ln for ln in text.splitlines(keepends=True) if not _ours(ln.rstrip("\n"), home))


def _write(path: str, text: str) -> None:
    """Replace the file ``path`` names (through a symlink: the link stays) atomically,
    executable, keeping its other mode bits."""
    real = os.path.realpath(path)
    try:
        mode = os.stat(real).st_mode & 0o777
    except FileNotFoundError:
        mode = 0o755
    fd, tmp = temp_beside(real, mode if mode & 0o100 else mode | 0o111)
    try:
        with open(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, real)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def install(python: str, agent: str, home: str, path: str = RC_LOCAL) -> str:
    """Put the hook in; returns the line."""
    text = _read(path)
    line = hook_line(python, agent, home)
    new = with_line(text, line, home)
    if new != text or not os.access(path, os.X_OK):
        _write(path, new)
    return line


def remove(home: str, path: str = RC_LOCAL) -> bool:
    text = _read(path)
    new = without_line(text, home)
    if new == text:
        return False
    _write(path, new)
    return True


def boot_identity() -> str:
    """Changes whenever the container (or the machine) starts again: the kernel's
    boot id and the start time of this PID namespace's init."""
    from gpujob.agent.base.proc import start_ticks
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{boot}/{start_ticks(1)}"
