"""The bed's processes, read from /proc: who is alive, who descends from whom, which
belong to a bed (its env marker, its path in their command line, their descendants), and
killing them all."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from testbed.host import MARKER, TestBedError


def proc_stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, comm, starttime) of a process, None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    lp, rp = data.find("("), data.rfind(")")
    comm = data[lp + 1:rp]
    rest = data[rp + 2:].split()
    # rest[0] = state, rest[1] = ppid, ..., rest[19] = starttime
    if rest[0] == "Z":
        return None
    return int(rest[1]), comm, int(rest[19])


def _all_pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def alive(pid: int | None, starttime: int | None = None) -> bool:
    if not pid:
        return False
    st = proc_stat(pid)
    if st is None:
        return False
    return starttime is None or st[2] == starttime


def descendants(roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        st = proc_stat(pid)
        if st:
            children.setdefault(st[0], []).append(pid)
    out: set[int] = set()
    todo = list(roots)
    while todo:
        p = todo.pop()
        for c in children.get(p, ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _self_and_ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        st = proc_stat(pid)
        if st is None:
            break
        pid = st[0]
    return out


def bed_processes(root: Path) -> set[int]:
    """Every live process that belongs to the bed at ``root``: those carrying
    the bed's env marker, those whose command line names the bed's dir (sshd -f,
    [lxc monitor] LXCPATH), and all their descendants."""
    root_b = str(root).encode()
    marker = f"{MARKER}={root}".encode()
    found: set[int] = set()
    for pid in _all_pids():
        env = read(f"/proc/{pid}/environ")
        if marker in env.split(b"\0"):
            found.add(pid)
            continue
        cmd = read(f"/proc/{pid}/cmdline")
        if root_b + b"/" in cmd or cmd.replace(b"\0", b" ").rstrip().endswith(root_b):
            found.add(pid)
    found |= descendants(found)
    found -= _self_and_ancestors()
    return {p for p in found if proc_stat(p) is not None}


def kill_all(pids_fn, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        pids = pids_fn()
        if not pids:
            return
        if time.monotonic() > deadline:
            raise TestBedError(f"processes survive SIGKILL: {sorted(pids)}")
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
