"""The processes a supervisor starts, watches, re-adopts and ends (stdlib only).

A phase command (install step, warmup, trainer) never hangs on its supervisor:

- its stdout and stderr go straight to the phase's log file, not to a pipe, so a
  dying supervisor takes nothing with it;
- it runs under a tiny *keeper* (``KEEPER`` below, ``python3 -E -s -c``) that is
  the leader of a new process group, waits for the command and writes its exit
  status to a file; the keeper shrugs off SIGTERM/SIGINT/SIGHUP (they reach the
  command, which gets default handlers), so its status file is written whenever
  the command ends, whether or not anybody is watching;
- the group id and the leader's start time (``/proc/PID/stat``, in clock ticks since
  boot) are recorded in the job's state, so a new supervisor can tell its own
  group from a recycled pid and re-adopt it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

KEEPER = r"""
import json, os, signal, subprocess, sys
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, lambda *a: None)  # handled (not ignored): the command gets the defaults back
out = sys.argv[1]
try:
    p = subprocess.Popen(sys.argv[2:])
except OSError as e:
    sys.stdout.write("gpujob: cannot start %s: %s\n" % (sys.argv[2], e.strerror or e))
    sys.stdout.flush()
    code = 127
else:
    code = p.wait()
tmp = out + ".tmp"
with open(tmp, "w") as f:
    f.write(json.dumps({"returncode": code}))
os.replace(tmp, out)
os._exit(0)  # at once: a rollback waits for this group to be empty before the next trainer
"""


def die_here(point: str) -> None:
    """Fault injection for the suite: with ``GPUJOB_TEST_DIE_AT=POINT@MARKER`` in its
    environment the supervisor SIGKILLs itself at ``point``, once (it creates MARKER
    first; a revived supervisor with the same environment goes on)."""
    want = os.environ.get("GPUJOB_TEST_DIE_AT")
    if not want:
        return
    name, _, marker = want.partition("@")
    if name != point or not marker or os.path.exists(marker):
        return
    with open(marker, "w"):
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def hold_here(point: str) -> None:
    """Fault injection for the suite's races: with ``GPUJOB_TEST_HOLD_AT=POINT@FILE`` in
    its environment the supervisor waits at ``point`` while FILE exists (the test removes
    it to let the supervisor go on), at most 10 minutes."""
    want = os.environ.get("GPUJOB_TEST_HOLD_AT")
    if not want:
        return
    name, _, gate = want.partition("@")
    end = time.monotonic() + 600
    while name == point and gate and os.path.exists(gate) and time.monotonic() < end:
        time.sleep(0.05)


def stat_fields(pid: int) -> list | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            stat = f.read()
    except (OSError, ValueError):
        return None
    return stat[stat.rfind(")") + 2:].split()


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (None: no such process)."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields else None


def is_alive(pid, ticks=None) -> bool:
    """``pid`` runs (not a zombie) and, when ``ticks`` is given, is the process that
    started then (not a recycled pid)."""
    if not pid:
        return False
    fields = stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):
        return False
    return ticks is None or int(fields[19]) == int(ticks)


def group_pids(pgid: int) -> list:
    """Live (non-zombie) pids whose process group is ``pgid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(int(entry))
        if fields and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


def keepers_of(exit_files: list) -> dict:
    """{exit file: pid} of the live keepers started for ``exit_files`` (a keeper's
    command line names its exit file): how a new supervisor finds a command whose
    start its dead predecessor had not yet written down."""
    wanted = {os.fsencode(f): f for f in exit_files}
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 5 and argv[3] == b"-c" and argv[4] == KEEPER.encode() and argv[5] in wanted \
                and is_alive(int(entry)):
            found[wanted[argv[5]]] = int(entry)
    return found


def group_gone(pgid: int) -> bool:
    """No live process is left in group ``pgid``: one ``killpg(0)`` when the group is
    empty (zombies included), the /proc scan (which tells zombies apart) otherwise."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return not group_pids(pgid)


def command_pids(pgid: int) -> list:
    """The live children of the keeper ``pgid`` (the command it started)."""
    return [pid for pid in group_pids(pgid) if (stat_fields(pid) or ["", "0"])[1] == str(pgid)]


def term_command_first(pgid: int, first: float, reap=None) -> bool:
    """A quiet stop: SIGTERM only the command the keeper started (a trainer's main
    process, torchrun), so it stops its workers the way its framework does, and wait up
    to ``first`` seconds for it to end. True when nothing of it is left running."""
    pids = command_pids(pgid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    die_here("command_signalled")
    end = time.monotonic() + first
    wait = 0.002  # a trainer that ends on SIGTERM is gone within milliseconds: look soon, then less often
    while time.monotonic() < end:
        if reap:
            reap()
        if not [p for p in pids if is_alive(p)] and not command_pids(pgid):
            return True
        time.sleep(min(wait, max(0.0, end - time.monotonic())))
        wait = min(wait * 2, 0.05)
    return False


def kill_group(pgid: int, grace: float, reap=None, leader_fd=None, first: float = 0.0) -> list:
    """SIGTERM the process group ``pgid``, SIGKILL what is left after ``grace``
    seconds; returns the pids that survived both (none, unless one escaped into
    another group). ``reap`` is called while waiting (to reap a child of ours);
    ``leader_fd``, a pidfd of the group's leader (the keeper), wakes the wait the
    moment it exits, instead of at the next look. ``first`` > 0: the keeper's command
    alone gets SIGTERM first and that long to end with its workers (a quiet stop)."""
    if first > 0:
        term_command_first(pgid, first, reap)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        except PermissionError:
            break
        end = time.monotonic() + (grace if sig == signal.SIGTERM else 10)
        wait = 0.002  # most processes are gone within milliseconds: look soon, then less often
        while True:
            leader_runs = leader_fd is not None and not select.select([leader_fd], [], [], 0)[0]
            if reap:
                reap()
            if not leader_runs and group_gone(pgid):  # (the keeper outlives its command)
                break
            left = end - time.monotonic()
            if left <= 0:
                break
            if leader_runs:
                select.select([leader_fd], [], [], min(left, 0.05))  # the keeper's exit wakes it
            else:
                time.sleep(min(wait, left))
                wait = min(wait * 2, 0.05)
        if group_gone(pgid):
            break
    if reap:
        reap()
    return [] if group_gone(pgid) else group_pids(pgid)


def read_exit(path: str):
    """The return code a keeper wrote, or None when it wrote none."""
    try:
        with open(path) as f:
            return int(json.load(f)["returncode"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Phase:
    """One phase command under its keeper: started by us, or re-adopted."""

    def __init__(self, pgid: int, ticks: int | None, exit_file: str, popen=None):
        self.pgid, self.ticks, self.exit_file, self.popen = pgid, ticks, exit_file, popen
        self.returncode = None
        self._done = False
        self._pidfd = None
        try:
            self._pidfd = os.pidfd_open(pgid) if hasattr(os, "pidfd_open") else None
        except OSError:
            self._pidfd = None

    @classmethod
    def start(cls, argv: list, *, env, cwd, log_path: str, exit_file: str) -> "Phase":
        """Start ``argv`` under a keeper, its output appended to ``log_path``."""
        for stale in (exit_file, exit_file + ".tmp"):
            if os.path.exists(stale):
                os.unlink(stale)
        with open(log_path, "ab") as log:
            popen = subprocess.Popen([sys.executable, "-E", "-s", "-c", KEEPER, exit_file, *argv],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, close_fds=True, env=env, cwd=cwd)
        return cls(popen.pid, start_ticks(popen.pid), exit_file, popen)

    @classmethod
    def adopt(cls, rec: dict) -> "Phase":
        return cls(int(rec["pgid"]), rec.get("ticks"), rec["exit_file"])

    def record(self) -> dict:
        return {"pgid": self.pgid, "ticks": self.ticks, "exit_file": self.exit_file}

    def running(self) -> bool:
        """Whether the phase still runs: its keeper, or anything left in its group."""
        if self._done:
            return False
        if self.pgid <= 0:  # a command that had ended before anybody wrote its pid down
            self._finish()
            return False
        if self.popen is not None:
            if self.popen.poll() is None:
                return True
        elif is_alive(self.pgid, self.ticks):
            return True
        elif self.ticks is not None and is_alive(self.pgid):
            self._finish()  # the pid was recycled by another process: ours is long gone
            return False
        if not group_gone(self.pgid):  # the keeper is gone but the command lives on
            return True
        self._finish()
        return False

    def _finish(self) -> None:
        self._done = True
        code = read_exit(self.exit_file)
        if code is None and self.popen is not None and self.popen.returncode not in (None, 0):
            code = self.popen.returncode  # the keeper itself was killed (SIGKILL to the group)
        self.returncode = code
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def wait_fd(self):
        """A file descriptor that becomes readable when the keeper exits (or None)."""
        return self._pidfd

    def kill(self, grace: float, first: float = 0.0) -> list:
        left = kill_group(self.pgid, grace, reap=self.popen.poll if self.popen else None,
                          leader_fd=self._pidfd, first=first)
        self.running()
        return left
