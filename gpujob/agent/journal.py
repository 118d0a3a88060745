"""The job journal in the container (stdlib only): the source of truth of every job.

``H/jobs/<job-id>/``: ``job.json`` (what was submitted), ``state.json`` (written
atomically), ``events.jsonl`` (appended), ``job.log`` (everything the job printed,
with gpujob's own banner lines), ``prepare.log``, ``warmup.log``, ``train.log``
(raw output of each phase) and ``control/`` (requests from the controller).
``H/lock`` is the per-container lock; ``H/ledger/<job name>.json`` the
known-good ledger of wheel profiles.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
import time

from gpujob.agent.protocol import ENDED, FINAL_STATES, FORMAT, FORMAT_KEY, JobState, check_format  # noqa: F401


def now() -> float:
    return time.time()


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: str, data, mode: int = 0o644, durable: bool = True) -> None:
    """Atomic: readers see the old file or the new one, never half of one, and a
    failed write (disk full) leaves the old file as it was. Durable (the default):
    after a crash of the machine the rename has reached the disk with the data
    (fsync of the file, rename, fsync of the directory). ``durable=False`` is for
    small files rewritten many times a second that only guard against process deaths."""
    write_bytes(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode(), mode, durable)


def temp_beside(path: str, mode: int) -> tuple:
    """(fd, name) of a new temp file in ``path``'s directory, for an atomic replace of
    ``path``: a fresh name from ``mkstemp`` (O_CREAT|O_EXCL, O_NOFOLLOW), so a file
    or symlink another user planted there is never opened, let alone written
    through; ``mode`` set on the open file (not through its name)."""
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path)[:64] + ".tmp",
                               dir=os.path.dirname(os.path.abspath(path)))
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp


def write_bytes(path: str, payload: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """``write_json``'s atomic replace, for any content (a metrics textfile, which may
    sit in a directory other users write: see temp_beside). The rename replaces a
    symlink at ``path`` itself; it never writes where the link points."""
    fd, tmp = temp_beside(path, mode)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
        os.close(fd)
        fd = None
        os.replace(tmp, path)
    except BaseException:
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def read_json(path: str, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def append_record(fd: int, line: bytes) -> int:
    """Append one whole line to an O_APPEND file in one write; a short write (disk
    full) is cut off again, so the file never ends in half a record. Returns the
    file's size before the append (where the record starts: its one writer)."""
    size = os.fstat(fd).st_size
    try:
        written = os.write(fd, line)
    except OSError:
        _truncate(fd, size)
        raise
    if written != len(line):
        _truncate(fd, size)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return size


def _truncate(fd: int, size: int) -> None:
    try:
        if os.fstat(fd).st_size > size:
            os.ftruncate(fd, size)
    except OSError:
        pass


def read_records(path: str) -> tuple:
    """(records, skipped): the whole JSON lines of a .jsonl file, and how many lines
    could not be read (a torn tail left by a crash, or damage)."""
    records, skipped = [], 0
    try:
        f = open(path, "rb")
    except OSError:
        return records, skipped
    with f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                records.append(json.loads(raw))
            except ValueError:
                skipped += 1
    return records, skipped


def pid_alive(pid, needle: str | None = None, ticks=None) -> bool:
    """Is ``pid`` running (not a zombie)? ``ticks`` (its start time) or ``needle``
    (a string its command line holds) guard against a recycled pid."""
    from gpujob.agent.proc import is_alive
    if not is_alive(pid, ticks):
        return False
    if needle is None or ticks is not None:
        return True
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            return needle.encode() in f.read()
    except OSError:
        return False


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
    """One job's directory. ``generation`` is the lock generation its writer holds
    (None for readers and for writes that need no lock)."""

    def __init__(self, home: Home, job_id: str, generation: int | None = None):
        self.home = home
        self.job_id = job_id
        self.dir = home.job_dir(job_id)
        self.generation = generation
        self._events = None  # events.jsonl's descriptor, opened once (O_APPEND)
        self.on_internal_error = None  # called with one line (the supervisor notifies)
        self._samples = None  # samples.jsonl's
        self.unsynced = False  # state.json was replaced without fsync since its last durable write
        self._deferred: dict = {}  # set_state(durable=None)'s changes: written with the next write

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def job(self) -> dict:
        """job.json (NewerFormat when a newer agent wrote it)."""
        return check_format(read_json(self.path("job.json"), {}), f"job {self.job_id}'s job.json")

    def state(self) -> dict:
        """state.json (NewerFormat when a newer agent wrote it: this one never touches it),
        with this writer's deferred changes over it."""
        st = check_format(read_json(self.path("state.json"), {}), f"job {self.job_id}'s state.json")
        deferred = self._deferred  # replaced, never changed in place: safe from another thread
        return dict(st, **deferred) if deferred else st

    def set_state(self, durable: bool = True, **changes) -> dict:
        """Update state.json durably. A writer whose lock generation is older than
        the one that last wrote the state is refused (``Fenced``). ``durable=False``
        replaces it atomically without the fsyncs: a process that dies keeps it (the
        rename is done), only a machine crash may lose it. It is for a step that a
        durable write follows before the next act (a spawn, a kill, a ledger mark, a
        message, a removed request): that write carries the whole state, so nothing
        acted on is ever only in the page cache (``sync`` makes it durable on demand).
        ``durable=None`` defers the changes (this writer's ``state()`` has them at once)
        to the next write: for steps that are redone from the last written state when
        the process dies before it (the rollback switch between its plan and its spawn)."""
        from gpujob.agent.lock import Fenced
        st = self.state()
        if self.generation is not None:
            if int(st.get("generation") or 0) > self.generation:
                raise Fenced(f"job {self.job_id}: state written by lock generation "
                             f"{st.get('generation')}, ours is {self.generation}")
            st["generation"] = self.generation
        if "step" in changes and changes["step"] != st.get("step"):
            from gpujob.agent import stages
            refused = stages.check(st.get("step"), changes["step"])  # raises in strict mode
            if refused is not None:  # production: the last legal step stays, the rest is written
                changes = {k: v for k, v in changes.items() if k != "step"}
                self.internal_error(refused)
        st.update(changes)
        if durable is None:
            self._deferred = {**self._deferred, **changes}
            return st
        st["updated_at"] = now()
        st[FORMAT_KEY] = FORMAT  # an older format is re-adopted: what it had, it keeps
        write_json(self.path("state.json"), st, durable=durable)
        self._deferred = {}
        self.unsynced = not durable
        return st

    def sync(self) -> None:
        """Make the last non-durable or deferred ``set_state`` durable (before an act); a no-op
        after a durable one."""
        if self._deferred:
            self.set_state()
            return
        if not self.unsynced:
            return
        fd = os.open(self.path("state.json"), os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.dir)
        self.unsynced = False

    def internal_error(self, line: str) -> None:
        """gpujob's own bookkeeping went wrong: an event and a notification, never the job's end."""
        try:
            self.event("internal_error", error=line)
            if self.on_internal_error is not None:
                self.on_internal_error(line)
        except Exception:
            pass

    def event(self, kind: str, **data) -> None:
        rec = {"t": round(now(), 3), "type": kind}
        rec.update(data)
        if self._events is None:
            self._events = os.open(self.path("events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT
                                   | os.O_CLOEXEC, 0o644)
        append_record(self._events, (json.dumps(rec, sort_keys=True) + "\n").encode())

    def sample(self, **rec) -> int:
        """Append one full-rate throughput sample to samples.jsonl; returns the byte
        offset where its record starts."""
        if self._samples is None:
            self._samples = os.open(self.path("samples.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT
                                    | os.O_CLOEXEC, 0o644)
        rec = dict(rec, type="sample")
        return append_record(self._samples, (json.dumps(rec, sort_keys=True) + "\n").encode())

    def events(self) -> tuple:
        """(records, skipped lines) of events.jsonl."""
        return read_records(self.path("events.jsonl"))

    def effective_state(self) -> dict:
        """state.json, with ``lost`` when its supervisor is gone without a final state."""
        st = self.state()
        if st and st.get("state") not in ENDED and not self.supervisor_alive(st):
            st = dict(st, state=JobState.LOST, reason=st.get("lost_reason") or
                      "the supervisor is gone without reaching a final state")
        return st

    def supervisor_alive(self, st: dict | None = None, starting: bool = True) -> bool:
        """The job's supervisor runs: the one in its state, or (``starting``) one
        being started right now (the lock's holder, which the starting agent names)."""
        st = self.state() if st is None else st
        if pid_alive(st.get("supervisor_pid"), self.job_id, st.get("supervisor_ticks")):
            return True
        if not starting:
            return False
        from gpujob.agent.lock import Lock
        holder = Lock(self.home.root).holder()
        return bool(holder and holder.get("job_id") == self.job_id)

    # ---- requests: one ordered queue, kept until acted on ----------------
    def request(self, kind: str, **data) -> str:
        """Leave a request for the supervisor (stop, rollback); they are taken in
        the order they came, except that a pending stop always wins."""
        os.makedirs(self.path("control"), exist_ok=True)
        name = f"{time.time_ns():020d}-{os.getpid()}-{kind}.json"
        write_json(os.path.join(self.path("control"), name), dict(data, kind=kind, at=now()))
        return name

    def pending(self) -> list:
        """[(name, request)] oldest first; unreadable ones are skipped."""
        ctl = self.path("control")
        try:
            names = sorted(n for n in os.listdir(ctl) if n.endswith(".json"))
        except OSError:
            return []
        out = []
        for n in names:
            req = read_json(os.path.join(ctl, n))
            if isinstance(req, dict) and req.get("kind"):
                out.append((n, req))
        return out

    def done(self, name: str) -> None:
        """A request has been acted on: it leaves the queue."""
        try:
            os.unlink(os.path.join(self.path("control"), name))
        except OSError:
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
        before = led["profiles"].get(profile)
        entry = dict(before or {})
        entry.update(data, status=status, at=now())
        led["profiles"][profile] = entry
        _relink(led)
        _record(led, profile, status, before, entry)
        write_json(self.path, led)
        return led

    def forget(self, profile: str, **data) -> dict:
        """Remove a profile's entry (it is untried again)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        led = self.read()
        before = led["profiles"].pop(profile, None)
        _relink(led)
        _record(led, profile, "untried", before, dict(data, at=now()))
        write_json(self.path, led)
        return led

    def history(self) -> list:
        """Every verdict, oldest first, each with an id and its evidence; the entries of a
        ledger written before the history existed come first, as ``legacy``."""
        led = self.read()
        hist = list(led.get("history") or [])
        seen = {h["profile"] for h in hist}
        legacy = [dict(e, id=f"legacy-{p}", profile=p, legacy=True, time=e.get("at"))
                  for p, e in sorted((led.get("profiles") or {}).items()) if p not in seen and "status" in e]
        return legacy + hist

    def undo(self, verdict_id: str, **data) -> dict:
        """Revert one verdict: the profile's entry as it was before it (baseline included);
        the undo is itself a verdict in the history. Returns the record undone."""
        led = self.read()
        rec = next((h for h in self.history() if str(h["id"]) == str(verdict_id)), None)
        if rec is None:
            raise KeyError(verdict_id)
        profile = rec["profile"]
        current = led["profiles"].get(profile)
        before = None if rec.get("legacy") else rec.get("before")
        if before is None:
            led["profiles"].pop(profile, None)
        else:
            led["profiles"][profile] = dict(before)
        _relink(led)
        _record(led, profile, (before or {}).get("status", "untried"), current,
                dict(data, undoes=rec["id"], reason=f"undo of verdict {rec['id']}", at=now()))
        write_json(self.path, led)
        return rec

    def note(self, profile: str, **data) -> dict:
        """Add facts to a profile's entry (a snapshot, a cold proof) without changing
        its status or its time."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        led = self.read()
        led["profiles"].setdefault(profile, {"status": "untried"}).update(data)
        write_json(self.path, led)
        return led

    @staticmethod
    def ever_good(led: dict) -> bool:
        """Whether this ledger ever had a known-good profile (its history, or today's entries)."""
        return any(h.get("status") == "good" for h in led.get("history") or []) or \
            any(e.get("status") == "good" for e in (led.get("profiles") or {}).values())

    def status(self, profile: str) -> str:
        return self.read()["profiles"].get(profile, {}).get("status", "untried")

    def baseline(self, profile: str):
        e = self.read()["profiles"].get(profile, {})
        return e.get("baseline") if e.get("status") == "good" else None

    def pick(self, current: str, profiles, fallback) -> str | None:
        """Where to roll back to from ``current`` (decide.pick over this ledger)."""
        from gpujob.agent.decide import pick
        return pick(self.read(), current, profiles, fallback)

    def last_good(self, exclude: str | None = None):
        """The most recently proven good profile other than ``exclude``."""
        led = self.read()
        goods = [(e.get("at", 0), p) for p, e in led["profiles"].items()
                 if e.get("status") == "good" and p != exclude]
        return max(goods)[1] if goods else None


def _relink(led: dict) -> None:
    """last_good: the newest good entry (none when no profile is good)."""
    goods = [(e.get("at", 0), p) for p, e in led["profiles"].items() if e.get("status") == "good"]
    if goods:
        led["last_good"] = max(goods)[1]
    else:
        led.pop("last_good", None)


_EVIDENCE = ("reason", "evidence", "baseline", "job", "by_hand", "undoes")


def _record(led: dict, profile: str, status: str, before, entry: dict) -> None:
    """Append one verdict to the ledger's history (ids count up, never reused)."""
    hist = led.setdefault("history", [])
    n = int(led.get("next_id") or len(hist) + 1)
    ev = entry.get("evidence") or {}
    hist.append(dict({k: entry[k] for k in _EVIDENCE if k in entry}, id=n, profile=profile, status=status,
                     time=entry.get("at"), before=before,
                     window_medians=ev.get("window_medians"), threshold=ev.get("threshold")))
    led["next_id"] = n + 1
