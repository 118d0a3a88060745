"""The job journal in the container (stdlib only): the source of truth of every job.

``H/jobs/<job-id>/``: ``job.json`` (what was submitted), ``state.json`` (written
atomically), ``events.jsonl`` (appended), ``job.log`` (everything the job printed,
with gpujob's own banner lines), ``prepare.log``, ``warmup.log``, ``train.log``
(raw output of each phase) and ``control/`` (requests from the controller).
``H/lock`` is the per-container lock; ``H/ledger/<job name>.json`` the
known-good ledger of wheel profiles.
"""

from __future__ import annotations

import json
import os
import time

FINAL_STATES = ("stopped", "succeeded", "failed")
ENDED = FINAL_STATES + ("lost",)  # nothing runs any more (lost: its supervisor is gone)
STATES = ("preparing", "warmup", "training", "rolling_back", "stopping") + FINAL_STATES + ("lost",)


def now() -> float:
    return time.time()


def write_json(path: str, data, mode: int = 0o644) -> None:
    """Atomic: readers see the old file or the new one, never half of one."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path: str, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def pid_alive(pid, needle: str | None = None) -> bool:
    """Is ``pid`` running (and, when ``needle`` is given, does its cmdline hold it)?

    The needle guards against a recycled pid: a supervisor's cmdline holds its job id.
    """
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if needle is None:
        return True
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            return needle.encode() in f.read()
    except OSError:
        return False


def group_pids(pgid: int) -> list:
    """Pids whose process group is ``pgid`` (read from /proc; zombies excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


class Home:
    """Paths under the gpujob home in the container."""

    def __init__(self, home: str):
        self.root = os.path.abspath(os.path.expanduser(home))

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def job_dir(self, job_id: str) -> str:
        return self.path("jobs", job_id)

    def job_ids(self) -> list:
        try:
            names = os.listdir(self.path("jobs"))
        except OSError:
            return []
        dirs = [n for n in names if os.path.exists(self.path("jobs", n, "job.json"))]
        return sorted(dirs, key=lambda n: os.path.getmtime(self.path("jobs", n, "job.json")))

    def ledger_path(self, name: str) -> str:
        return self.path("ledger", f"{name}.json")

    def workdir(self, spec: dict) -> str:
        wd = spec.get("workdir") or os.path.join("work", spec["name"])
        wd = os.path.expanduser(wd)
        return wd if os.path.isabs(wd) else self.path(wd)


class Journal:
    """One job's directory."""

    def __init__(self, home: Home, job_id: str):
        self.home = home
        self.job_id = job_id
        self.dir = home.job_dir(job_id)
        self._events = None  # events.jsonl, opened once: a supervisor appends ~100 events/s

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def job(self) -> dict:
        return read_json(self.path("job.json"), {})

    def state(self) -> dict:
        return read_json(self.path("state.json"), {})

    def set_state(self, **changes) -> dict:
        st = self.state()
        st.update(changes)
        st["updated_at"] = now()
        write_json(self.path("state.json"), st)
        return st

    def event(self, kind: str, **data) -> None:
        rec = {"t": round(now(), 3), "type": kind}
        rec.update(data)
        if self._events is None:
            self._events = open(self.path("events.jsonl"), "a")
        self._events.write(json.dumps(rec, sort_keys=True) + "\n")
        self._events.flush()  # O_APPEND: one write per event, whole lines for every reader

    def effective_state(self) -> dict:
        """state.json, with ``lost`` when its supervisor is gone without a final state."""
        st = self.state()
        if st and st.get("state") not in FINAL_STATES and \
                not pid_alive(st.get("supervisor_pid"), self.job_id):
            st = dict(st, state="lost", reason=st.get("reason") or
                      "the supervisor is gone without reaching a final state")
        return st

    def request(self, kind: str, **data) -> str:
        """Leave a control request for the supervisor (stop, rollback)."""
        os.makedirs(self.path("control"), exist_ok=True)
        name = f"{time.time_ns()}-{kind}.json"
        write_json(os.path.join(self.path("control"), name), dict(data, kind=kind))
        return name

    def take_requests(self, kind: str | None = None) -> list:
        """Consume the pending requests (of ``kind`` only, when given), oldest first."""
        ctl = self.path("control")
        suffix = f"-{kind}.json" if kind else ".json"
        try:
            names = sorted(n for n in os.listdir(ctl) if n.endswith(suffix))
        except OSError:
            return []
        out = []
        for n in names:
            req = read_json(os.path.join(ctl, n))
            try:
                os.unlink(os.path.join(ctl, n))
            except OSError:
                pass
            if req:
                out.append(req)
        return out


class Lock:
    """The per-container lock: one job at a time. Held by job id; the pid of the
    supervisor (or of the submitting agent while it prepares) proves it alive."""

    def __init__(self, home: Home):
        self.path = home.path("lock")

    def holder(self) -> dict | None:
        return read_json(self.path)

    def holder_alive(self, holder: dict) -> bool:
        return pid_alive(holder.get("pid"), holder.get("job_id"))

    def acquire(self, job_id: str, pid: int) -> tuple:
        """(True, None) or (True, stale holder) when a dead holder was replaced, or
        (False, live holder)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        stale = None
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self.holder()
                if holder is None:  # being written right now, or empty: look again
                    time.sleep(0.05)
                    holder = self.holder() or {}
                if holder.get("job_id") == job_id:
                    self.update(job_id, pid)
                    return True, stale
                if self.holder_alive(holder):
                    return False, holder
                stale = holder
                try:
                    os.replace(self.path, f"{self.path}.stale")
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                json.dump({"job_id": job_id, "pid": pid, "since": now()}, f)
            return True, stale
        return False, self.holder() or {}

    def update(self, job_id: str, pid: int) -> None:
        h = self.holder() or {}
        if h.get("job_id") == job_id:
            write_json(self.path, {"job_id": job_id, "pid": pid, "since": h.get("since", now())})

    def release(self, job_id: str) -> None:
        h = self.holder()
        if h and h.get("job_id") == job_id:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


class Ledger:
    """Known-good / bad wheel profiles for one job name in this container."""

    def __init__(self, home: Home, name: str):
        self.path = home.ledger_path(name)

    def read(self) -> dict:
        return read_json(self.path, {"profiles": {}})

    def mark(self, profile: str, status: str, **data) -> dict:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        led = self.read()
        entry = dict(led["profiles"].get(profile, {}))
        entry.update(data, status=status, at=now())
        led["profiles"][profile] = entry
        if status == "good":
            led["last_good"] = profile
        elif led.get("last_good") == profile:
            led.pop("last_good")
        write_json(self.path, led)
        return led

    def status(self, profile: str) -> str:
        return self.read()["profiles"].get(profile, {}).get("status", "untried")

    def baseline(self, profile: str):
        e = self.read()["profiles"].get(profile, {})
        return e.get("baseline") if e.get("status") == "good" else None

    def pick(self, current: str, profiles, fallback) -> str | None:
        """Where to roll back to from ``current``: the last known-good profile, else the
        first of ``fallback`` not known to be bad; None when there is nowhere to go."""
        good = self.last_good(exclude=current)
        if good in profiles:
            return good
        for name in fallback or []:
            if name != current and name in profiles and self.status(name) != "bad":
                return name
        return None

    def last_good(self, exclude: str | None = None):
        """The most recently proven good profile other than ``exclude``."""
        led = self.read()
        goods = [(e.get("at", 0), p) for p, e in led["profiles"].items()
                 if e.get("status") == "good" and p != exclude]
        return max(goods)[1] if goods else None
