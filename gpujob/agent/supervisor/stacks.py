"""The Python stacks of a hung trainer, saved before gpujob ends it (stdlib only).

Two ways, best first:

- ``py-spy dump --pid N`` for each Python process of the trainer's process group,
  when py-spy is in the profile's venv or on the container's PATH. The trainer keeps
  running while it is read (py-spy needs ptrace: root in the container has it).
- Otherwise SIGABRT: the trainer runs with ``PYTHONFAULTHANDLER=1`` (jobenv sets it
  unless the spec does), so a SIGABRT makes the interpreter write every thread's
  stack to stderr — the phase log — before it dies. The text is read back from the
  log from where it stood before the signal.

Either way the result is bounded (``MAX_TEXT`` per process, ``MAX_PROCS`` processes),
so a trainer with hundreds of threads cannot bloat the journal.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

from gpujob.agent.base.proc import KEEPER, group_pids

MAX_TEXT = 32 * 1024   # bytes of stack text kept per process
MAX_PROCS = 16         # processes of one group read
PYSPY_TIMEOUT = 20.0   # seconds for one py-spy dump
ABORT_WAIT = 5.0       # seconds for aborted interpreters to write their stacks and die


def _cmdline(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def is_python(argv: list) -> bool:
    """Whether a process's argv is a Python interpreter's (pure)."""
    if not argv:
        return False
    name = os.path.basename(argv[0])
    return name.startswith("python") or name in ("torchrun", "accelerate", "deepspeed", "specforge")


def python_pids(pgid: int) -> list:
    """The group's Python processes, lowest pid first (gpujob's keeper and shells left out)."""
    pids = []
    for pid in sorted(group_pids(pgid)):
        argv = _cmdline(pid)
        if is_python(argv) and not (len(argv) > 4 and argv[3] == "-c" and argv[4] == KEEPER):
            pids.append(pid)
    return pids[:MAX_PROCS]


def find_pyspy(venv: str | None) -> str | None:
    """py-spy from the profile's venv, else the container's PATH."""
    dirs = ([os.path.join(venv, "bin")] if venv else []) + (os.environ.get("PATH") or "").split(os.pathsep)
    return shutil.which("py-spy", path=os.pathsep.join(d for d in dirs if d))


def _clip(text: str) -> str:
    data = text.encode("utf-8", "replace")
    if len(data) <= MAX_TEXT:
        return text
    return data[:MAX_TEXT].decode("utf-8", "ignore") + "\n… (cut)"


def _log_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(MAX_TEXT * MAX_PROCS).decode("utf-8", "replace")
    except OSError:
        return ""


def faulthandler_blocks(text: str) -> str:
    """The part of ``text`` that faulthandler wrote (from its first ``Fatal Python error``
    or thread header on), or all of it when none is found (pure)."""
    for marker in ("Fatal Python error", "Current thread 0x", "Thread 0x"):
        i = text.find(marker)
        if i >= 0:
            return text[i:]
    return text


def capture(pgid: int, log_path: str, venv: str | None, faulthandler: bool) -> dict:
    """The stacks of the group's Python processes: ``{"method", "stacks": [{"pid", "argv",
    "text"}], "note"}``. With SIGABRT the processes are gone afterwards; the caller ends
    the rest of the group as usual."""
    pids = python_pids(pgid)
    if not pids:
        return {"method": "none", "stacks": [], "note": "no Python process in the trainer's group"}
    pyspy = find_pyspy(venv)
    if pyspy:
        stacks, failed = [], []
        for pid in pids:
            try:
                p = subprocess.run([pyspy, "dump", "--pid", str(pid)], capture_output=True,
                                   timeout=PYSPY_TIMEOUT, stdin=subprocess.DEVNULL)
                text = (p.stdout or b"").decode("utf-8", "replace")
                if p.returncode != 0 or not text.strip():
                    failed.append(f"{pid}: {(p.stderr or b'').decode('utf-8', 'replace').strip()[:200]}")
                    continue
            except (OSError, subprocess.TimeoutExpired) as e:
                failed.append(f"{pid}: {e}")
                continue
            stacks.append({"pid": pid, "argv": _cmdline(pid)[:8], "text": _clip(text)})
        if stacks:
            note = f"py-spy ({pyspy})" + (f"; failed for {'; '.join(failed)}" if failed else "")
            return {"method": "py-spy", "stacks": stacks, "note": note}
        if not faulthandler:
            return {"method": "none", "stacks": [], "note": f"py-spy failed: {'; '.join(failed)}"}
    if not faulthandler:
        return {"method": "none", "stacks": [],
                "note": "no py-spy in the profile or on PATH, and PYTHONFAULTHANDLER is off in the job's env"}
    start = _log_size(log_path)
    argvs = {pid: _cmdline(pid)[:8] for pid in pids}
    for pid in pids:
        try:
            os.kill(pid, signal.SIGABRT)
        except OSError:
            pass
    end = time.monotonic() + ABORT_WAIT
    while time.monotonic() < end and any(os.path.exists(f"/proc/{pid}") and _cmdline(pid) for pid in pids):
        time.sleep(0.05)
    text = faulthandler_blocks(_read_from(log_path, start))
    return {"method": "faulthandler",
            "stacks": [{"pid": pids[0], "argv": argvs[pids[0]], "text": _clip(text)}]
            if text.strip() else [],
            "note": "SIGABRT with PYTHONFAULTHANDLER=1: every thread's stack, from the trainer's log"
                    + ("" if text.strip() else " (nothing was written)"),
            "pids": pids}
