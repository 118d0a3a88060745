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
from typing import Callable

from gpujob.agent.base.fsio import (append_line, append_record, fsync_dir, now, pid_alive, read_json,
                                    read_records, write_json)
from gpujob.agent.base import staterec
from gpujob.agent.base.staterec import StateRecord
from gpujob.agent.base.protocol import (ENDED, FINAL_STATES, FORMAT, FORMAT_KEY,  # noqa: F401
                                       JobState, check_format)

_SORTED = json.JSONEncoder(sort_keys=True)  # json.dumps(…, sort_keys=True) without a new encoder each sample
_QUOTE = json.encoder.encode_basestring_ascii  # what json.dumps(a str) writes
_FLOAT = float.__repr__  # what json.dumps(a finite float) writes


def _number(v):
    """``json.dumps(v)`` of None, an int or a finite float; None for anything else."""
    if v is None:
        return "null"
    tv = type(v)
    if tv is float:
        return _FLOAT(v) if v - v == 0 else None  # (inf - inf and nan - nan are nan)
    return int.__repr__(v) if tv is int else None


def sample_line(rec: dict):
    """``_SORTED.encode(rec)`` for the supervisor's sample record (its six keys, each of
    its usual type), built as one string: the sorted encoder's dict walk and sort were
    half a sample's record (bench.supervisor_cpu); None for any other record."""
    if len(rec) != 6:
        return None
    try:
        t, value, step, verdict, median, profile = (rec["t"], rec["value"], rec["step"], rec["verdict"],
                                                    rec["median"], rec["profile"])
    except KeyError:
        return None
    if type(t) is not float or t - t != 0 or not isinstance(verdict, str) or \
            not (profile is None or isinstance(profile, str)):
        return None  # (t: always a finite float here)
    m, s, v = _number(median), _number(step), _number(value)
    if m is None or s is None or v is None:
        return None
    return (f'{{"median": {m}, "profile": {"null" if profile is None else _QUOTE(profile)}, '
            f'"step": {s}, "t": {_FLOAT(t)}, "type": "sample", "value": {v}, "verdict": {_QUOTE(verdict)}}}')


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
        self._events: int | None = None  # events.jsonl's descriptor, opened once (O_APPEND)
        # called with one line (the supervisor notifies)
        self.on_internal_error: Callable[[str], object] | None = None
        self._samples: int | None = None  # samples.jsonl's
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

    def record(self) -> StateRecord:
        """``state()`` as the typed record (what it cannot read as declared is in ``extra``)."""
        return StateRecord.from_dict(self.state())

    def set_state(self, durable: bool | None = True, **changes) -> dict:
        """Update state.json durably: the one function every write of it goes through; each
        change must be a key of ``staterec.StateRecord``, of its type (``staterec.check``).
        A writer whose lock generation is older than the one that last wrote the state is
        refused (``Fenced``). ``durable=False``
        replaces it atomically without the fsyncs: a process that dies keeps it (the
        rename is done), only a machine crash may lose it. It is for a step that a
        durable write follows before the next act (a spawn, a kill, a ledger mark, a
        message, a removed request): that write carries the whole state, so nothing
        acted on is ever only in the page cache (``sync`` makes it durable on demand).
        ``durable=None`` defers the changes (this writer's ``state()`` has them at once)
        to the next write: for steps that are redone from the last written state when
        the process dies before it (the rollback switch between its plan and its spawn)."""
        from gpujob.agent.home.lock import Fenced
        st = self.state()
        if self.generation is not None:
            if int(st.get("generation") or 0) > self.generation:
                raise Fenced(f"job {self.job_id}: state written by lock generation "
                             f"{st.get('generation')}, ours is {self.generation}")
            st["generation"] = self.generation
        bad = staterec.check(changes)  # every key declared, of its type (raises in strict mode)
        if bad is not None:  # production: written as asked, and said
            self.internal_error(bad)
        if "step" in changes and changes["step"] != st.get("step"):
            from gpujob.agent.base import stages
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
        # compact: read by programs only (json), rewritten every second while samples stream in;
        # an older agent's indented file reads the same
        write_json(self.path("state.json"), st, durable=durable, compact=True)
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

    def sample(self, offset: bool = True, **rec) -> int | None:
        """Append one full-rate throughput sample to samples.jsonl; returns the byte
        offset where its record starts (None without ``offset``: one system call less)."""
        if self._samples is None:
            self._samples = os.open(self.path("samples.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT
                                    | os.O_CLOEXEC, 0o644)
        text = sample_line(rec)
        if text is None:
            rec["type"] = "sample"  # (rec is this call's own dict)
            text = _SORTED.encode(rec)
        data = (text + "\n").encode()
        if offset:
            return append_record(self._samples, data)
        append_line(self._samples, data)
        return None

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
        from gpujob.agent.home.lock import Lock
        holder = Lock(self.home.root).holder()
        return bool(holder and holder.get("job_id") == self.job_id)

    # ---- requests: one ordered queue, kept until acted on ----------------
    def request(self, kind: str, **data) -> str:
        """Leave a request for the supervisor (stop, rollback); they are taken in
        the order they came, except that a pending stop always wins. Each carries the
        run it is aimed at (state.json's ``run``): a stop of an earlier run is dropped."""
        os.makedirs(self.path("control"), exist_ok=True)
        name = f"{time.time_ns():020d}-{os.getpid()}-{kind}.json"
        st = self.state()
        run, of = st.get("run"), st.get("supervisor_pid")
        write_json(os.path.join(self.path("control"), name),
                   dict(data, kind=kind, at=now(), run=run if isinstance(run, int) else 0,
                        of=of if isinstance(of, int) else None))
        return name

    def stale_stop(self, req: dict) -> bool:
        """A stop request asked of an earlier run of the job (its supervisor died before
        acting on it, and a newer command ran the job again): it must not end this run.
        A request without a run (an older agent's) is taken as this run's."""
        run, asked = self.state().get("run"), req.get("run")
        return (req.get("kind") == "stop" and isinstance(asked, int) and isinstance(run, int)
                and asked < run)

    @staticmethod
    def superseded_stop(req: dict, pending: list, born: float) -> bool:
        """A stop asked of an earlier supervisor of this run (it died before acting on it),
        with a ``rollback`` asked after it of another supervisor (the one a command such as
        ``logs -f`` or ``status`` revived), still queued: the rollback is the newer word.
        The run's number cannot tell it: only a rollback that revives the job itself starts
        a new run. A stop and a rollback both asked of one supervisor keep their order (the
        stop wins, whether or not that supervisor died since), and so does a stop asked of
        this supervisor (at or after ``born``)."""
        asked, of = req.get("at"), req.get("of")
        if req.get("kind") != "stop" or not isinstance(asked, (int, float)) or asked >= born \
                or not isinstance(of, int):
            return False
        return any(r.get("kind") == "rollback" and isinstance(r.get("at"), (int, float)) and r["at"] > asked
                   and isinstance(r.get("of"), int) and r["of"] != of for _n, r in pending)

    def drop_request(self, name: str, req: dict, why: str) -> dict:
        """Remove a request that will not be acted on, with a ``request_dropped`` event
        (what it was, when it was asked, why); returns what was dropped."""
        gone = {"kind": req.get("kind"), "asked_at": req.get("at"), "run": req.get("run"), "why": why}
        self.event("request_dropped", request=name, what=gone["kind"], asked_at=gone["asked_at"],
                   run=gone["run"], why=why)
        self.done(name)
        return gone

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
