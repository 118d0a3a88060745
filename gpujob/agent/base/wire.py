"""The laptop <-> agent API, declared once (stdlib only: it ships in the agent zip, and the
controller imports this same module). docs/wire.md describes it verb by verb.

- the names both sides check: a job name (``JOB_NAME``), a job id (``JOB_ID``), a ledger's
  name (a job name, or a multi-node job's ``NAME@xN-hhhhhh``: ``LEDGER_NAME``), a profile's
  (``PROFILE_NAME``);
- ``Refused``: the agent will not do what was asked, with a ``Code`` that says why (busy,
  unknown job, bad request, a newer format, ...); its answer is ``ErrorAnswer`` and the agent
  exits ``protocol.REFUSED``; the laptop maps each code to its own exit code (ops/target.py);
- each verb's request and answer as a record (``SubmitRequest``, ``StatusAnswer``, ...) that
  the side which sends builds and the side which receives reads with ``from_dict``: a field
  missing or of another type is ``BadShape`` (one line: the record, the field, what was
  expected); keys a record does not declare are kept in ``extra`` and written back as they were.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, ClassVar, Dict, List, Optional, Type, TypeVar

#: a job's name, as a spec's ``name`` holds it
JOB_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
JOB_NAME_RULE = "lowercase letters, digits and '-' (at most 40)"
#: a job's id (a job name and 4 letters by default, or submit --job-id): it names the job's folder
JOB_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
JOB_ID_RULE = "lowercase letters, digits and '-' (at most 63)"
#: a ledger's name: the job's, or a multi-node job's per fleet shape (planshare.ledger_name)
LEDGER_NAME = re.compile(JOB_NAME.pattern + r"(@x[0-9]{1,2}-[0-9a-f]{6})?")
#: a profile's name, as a spec names them
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
PROFILE_NAME_RULE = "letters, digits, '_', '.' and '-'"


class Code(str, Enum):
    """Why the agent refused (the ``code`` of its error answer)."""
    BUSY = "busy"                  # the container (or the ledger, a cache, GPUs) is held by another job
    UNKNOWN_JOB = "unknown_job"    # no job of that id in this container
    EXISTS = "exists"              # a job of that id is there already
    NOT_FOUND = "not_found"        # a profile, snapshot, verdict or checkpoint named is not there
    CONFLICT = "conflict"          # the job's state forbids it (already on that profile, not node 0, ...)
    BAD_REQUEST = "bad_request"    # the request itself is wrong (a name, an argument, its shape)
    NEWER_FORMAT = "newer_format"  # a file a newer gpujob wrote: this agent must not touch it
    DAMAGED = "damaged"            # a ledger that cannot be read (ledger recover)

    def __str__(self) -> str:
        return str(self.value)

    def __hash__(self) -> int:  # equal to its value, so hashed as it: a table keyed by codes takes "busy"
        return hash(self.value)


class Refused(Exception):
    """The agent will not do what was asked: ``code`` says why, the message in one line what
    to do. Subclasses (protocol.NewerFormat, ledgerfile.LedgerError) carry their own code."""

    code: Optional[Code] = None

    def __init__(self, message: str, code: Optional[Code] = None):
        super().__init__(message)
        resolved = code or type(self).code
        if resolved is None:
            raise TypeError("Refused needs a code")
        self.code = resolved


class BadShape(ValueError):
    """A request or answer whose shape is not the declared one."""


_T = TypeVar("_T", bound="Record")
_TYPES: Dict[str, Any] = {"str": str, "int": int, "float": (int, float), "bool": bool, "dict": dict,
                          "list": list, "Dict": dict, "List": list}


def _check(owner: str, name: str, kind: str, value) -> None:
    optional = kind.startswith("Optional[")
    base = kind[len("Optional["):-1] if optional else kind
    if value is None and optional:
        return
    want = _TYPES.get(base.split("[")[0])
    if want is None:  # Any
        return
    if isinstance(value, bool) and want in (int, (int, float)) or not isinstance(value, want):
        raise BadShape(f"{owner}: {name}: expected {base}{' or null' if optional else ''}, "
                       f"got {type(value).__name__}")


@dataclass
class Record:
    """One declared JSON object: its fields, then ``extra`` (keys it does not declare)."""

    #: JSON keys that are Python words (``from``): field name -> key
    KEYS: ClassVar[Dict[str, str]] = {}

    def to_dict(self) -> dict:
        """The JSON object: every field but one whose default None it holds, then ``extra``."""
        out: dict = {}
        for f in fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            out[self.KEYS.get(f.name, f.name)] = value
        out.update(getattr(self, "extra", {}))
        return out

    @classmethod
    def from_dict(cls: Type[_T], data) -> _T:
        """The record of ``data`` (as read from JSON), BadShape when it is not one."""
        if not isinstance(data, dict):
            raise BadShape(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        rest = dict(data)
        kw: dict = {}
        for f in fields(cls):
            if f.name == "extra":
                continue
            key = cls.KEYS.get(f.name, f.name)
            if key in rest:
                _check(cls.__name__, key, str(f.type), rest[key])
                kw[f.name] = rest.pop(key)
            elif f.default is f.default_factory:  # both MISSING: a required field
                raise BadShape(f"{cls.__name__}: {key}: missing")
        if any(f.name == "extra" for f in fields(cls)):
            kw["extra"] = rest
        return cls(**kw)


# ---- errors ------------------------------------------------------------------------
@dataclass
class ErrorAnswer(Record):
    """Every verb's failure: one line on stdout; ``refused`` and ``code`` when it was refused
    (exit protocol.REFUSED), neither for a failure (exit 1) or bad usage (exit 2)."""
    error: str
    refused: Optional[bool] = None
    code: Optional[str] = None

    @classmethod
    def of(cls, e: BaseException) -> "ErrorAnswer":
        if isinstance(e, Refused):
            return cls(str(e), True, str(e.code))
        return cls(f"{type(e).__name__}: {e}")


# ---- submit ------------------------------------------------------------------------
@dataclass
class SyncStream(Record):
    """One tar stream after submit's first line: ``size`` bytes unpacked under ``dest``."""
    dest: str
    size: int


@dataclass
class SubmitRequest(Record):
    """``submit``'s first stdin line (ops/plan.py job_request builds it); the rest of stdin is
    ``sync_streams``' tar bytes in order. Saved as job.json without ``secrets`` and streams."""
    job_id: str
    spec: Dict[str, Any]
    profile: str
    env_keys: Dict[str, str]
    spec_hash: str
    clear_caches: bool = False
    secret_names: List[str] = field(default_factory=list)
    env_passthrough: List[str] = field(default_factory=list)
    secrets: Optional[dict] = None           # secrets.json (mode 600), never job.json
    fleet: Optional[dict] = None             # one node of a multi-node job
    by: Optional[str] = None                 # user@laptop, shown to whoever finds the container busy
    uv: Optional[str] = None                 # the uv to build venvs with (None: pip)
    resume_from_ask: Optional[str] = None    # submit --resume-from (a path or a job id)
    resume_from_copy: Optional[bool] = None  # a bisect trial: a copy in its own workdir
    accept_baseline: Optional[bool] = None
    boot_hook: Optional[bool] = None
    #: how the trainer loads a checkpoint by itself at a fresh start (spec/selfload.py), or None:
    #: the supervisor's note on the checkpoints earlier jobs left says it
    self_loads: Optional[str] = None
    sync_streams: List[dict] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict)

    def streams(self) -> List[SyncStream]:
        return [SyncStream.from_dict(s) for s in self.sync_streams]

    def job_record(self) -> dict:
        """What job.json keeps of it."""
        out = self.to_dict()
        out.pop("secrets", None)
        out.pop("sync_streams", None)
        return out


@dataclass
class SubmitAnswer(Record):
    job_id: str
    supervisor_pid: int
    synced: Dict[str, int] = field(default_factory=dict)  # dest -> members unpacked
    stale_lock: Optional[dict] = None     # the job the container was taken over from
    checkpoints: Optional[dict] = None    # what earlier jobs left (ckregister.at_submit)
    extra: Dict[str, Any] = field(default_factory=dict)


# ---- status ------------------------------------------------------------------------
@dataclass
class StatusAnswer(Record):
    """``status [JOB...]``: each job's summary (state.json's StateRecord keys and what
    lifecycle.summary adds: name, ledger, policy, metrics, now, uptime_s, revived), and
    who holds the container's lock."""
    jobs: List[dict]
    lock: Optional[dict]                  # lock.json's holder (None: nobody holds it)
    extra: Dict[str, Any] = field(default_factory=dict)

    def by_id(self) -> Dict[str, dict]:
        return {str(j["job_id"]): j for j in self.jobs}


# ---- stop, rollback ----------------------------------------------------------------
@dataclass
class StopAnswer(Record):
    job_id: str
    state: Optional[str]
    already: Optional[bool] = None        # it had ended before: nothing was done
    left: List[int] = field(default_factory=list)  # pids still alive after the stop
    save_waited: Optional[dict] = None    # a checkpoint save the stop waited for
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class RollbackAnswer(Record):
    KEYS: ClassVar[Dict[str, str]] = {"from_": "from"}
    job_id: str
    from_: str
    to: str
    requested: Optional[bool] = None      # asked of the running supervisor
    already: Optional[bool] = None        # the same switch was pending
    restarted: Optional[bool] = None      # an ended job runs again
    supervisor_pid: Optional[int] = None
    was: Optional[str] = None             # the state it had ended in
    # stops queued for an earlier run whose supervisor died before acting on them: dropped,
    # this rollback supersedes them (each: kind, asked_at, run, why)
    dropped_stops: Optional[List[dict]] = None
    extra: Dict[str, Any] = field(default_factory=dict)


# ---- ledger ------------------------------------------------------------------------
@dataclass
class LedgerAnswer(Record):
    """``ledger show|set|history|undo|recover NAME``: the ledger after the act, and the act's
    own fields (set: profile, before, status, reason; undo: undone; history: history)."""
    name: str
    ledger: Optional[dict] = None
    history: Optional[list] = None
    id: Optional[int] = None
    profile: Optional[str] = None
    before: Optional[str] = None
    status: Optional[str] = None
    reason: Optional[str] = None
    undone: Optional[dict] = None
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class ProfilesAnswer(Record):
    """``profiles``: the venvs installed (env_key, installed, profile, packages, torch, size,
    disk, built_at, last_used), every ledger by name (a damaged one: ``{"error": LINE}``)."""
    envs: List[dict]
    ledgers: Dict[str, dict]
    disk_total: dict
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class GcAnswer(Record):
    """``gc``: each venv, job directory and checkpoint looked at, with why it went or stayed
    (``why``: ``remove`` or ``kept: …``), and the arguments it ran with."""
    envs: List[dict]
    jobs: List[dict]
    checkpoints: List[dict]
    finished: List[Any]
    dry_run: bool
    days: Optional[float]
    older_than: Optional[float]
    keep_checkpoints: Optional[int]
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class CacheAnswer(Record):
    """``cache ls`` (caches, uv_cache), ``clear`` (cleared, snapshots_kept, snapshots_removed,
    warnings), ``restore`` (restored), ``prove-cold`` (ok, reason, gpus, seconds, log, name,
    profile, ledger_proof, ...: the cold proof the ledger records, kept in ``extra``)."""
    caches: Optional[List[dict]] = None
    uv_cache: Optional[int] = None
    cleared: Optional[List[str]] = None
    snapshots_kept: Optional[dict] = None
    snapshots_removed: Optional[dict] = None
    warnings: Optional[List[str]] = None
    restored: Optional[List[dict]] = None
    ok: Optional[bool] = None
    extra: Dict[str, Any] = field(default_factory=dict)


# ---- fleet -------------------------------------------------------------------------
@dataclass
class FleetAnswer(Record):
    """``fleet ports`` (node 0: ports, address, hostname), ``fleet go|release JOB``
    (job_id, requested; or state and already when the job had ended)."""
    ports: Optional[List[int]] = None
    address: Optional[str] = None
    hostname: Optional[str] = None
    job_id: Optional[str] = None
    requested: Optional[str] = None
    state: Optional[str] = None
    already: Optional[bool] = None
    extra: Dict[str, Any] = field(default_factory=dict)


# ---- files -------------------------------------------------------------------------
@dataclass
class ManifestRequest(Record):
    """``manifest``'s stdin: ``{dest: [relative path, ...]}``, the files the laptop has."""
    files: Dict[str, List[str]]

    def to_dict(self) -> dict:
        return dict(self.files)

    @classmethod
    def from_dict(cls, data) -> "ManifestRequest":
        if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
            raise BadShape("ManifestRequest: expected a JSON object of {dest: [path, ...]}")
        return cls({str(k): list(v) for k, v in data.items()})


@dataclass
class ManifestAnswer(Record):
    """``{dest: {relative path: [size, mtime seconds]}}`` of the files asked that are there."""
    found: Dict[str, Dict[str, list]]

    def to_dict(self) -> dict:
        return dict(self.found)

    @classmethod
    def from_dict(cls, data) -> "ManifestAnswer":
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            raise BadShape("ManifestAnswer: expected a JSON object of {dest: {path: [size, mtime]}}")
        return cls(dict(data))


@dataclass
class ProbeAnswer(Record):
    """``probe``: what the container has."""
    python: str
    machine: str
    system: str
    home: str
    pid: int
    venv: bool
    disk_free: int
    disk_path: str
    uvm: bool
    uv: Optional[str]                     # the container's uv, or ours shipped to its home
    proc_driver: Optional[str]            # /proc/driver/nvidia/version
    nvidia_smi: Optional[dict]            # {ok, gpus: [[index, name, driver, util]], error}
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class PutAnswer(Record):
    written: str
    size: int


@dataclass
class TailHead(Record):
    """``tail``'s first line; the log's raw bytes follow it."""
    offset: int
    skipped: int = 0


#: each declared verb's answer (docs/wire.md lists every verb of agent/main.py's COMMANDS)
ANSWERS: Dict[str, Type[Record]] = {
    "submit": SubmitAnswer, "status": StatusAnswer, "stop": StopAnswer, "rollback": RollbackAnswer,
    "ledger": LedgerAnswer, "manifest": ManifestAnswer, "probe": ProbeAnswer, "put": PutAnswer,
    "tail": TailHead, "profiles": ProfilesAnswer, "fleet": FleetAnswer, "gc": GcAnswer,
    "cache": CacheAnswer}
