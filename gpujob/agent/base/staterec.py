"""state.json's keys, declared once (stdlib only, pure): ``StateRecord``, one typed record
with every key the agent writes, its type and what it means, and ``check``, which
``journal.Journal.set_state`` (the one function every write of state.json goes through)
runs on each write's changes.

- A write with a key not declared here, or a value of another type (or, for ``state``,
  ``phase`` and ``step``, a value outside its declared set) is refused: it raises
  ``BadStateKey`` in strict mode (``GPUJOB_STRICT_STAGES=1``, the test suite), and in
  production the write lands as asked with an ``internal_error`` event and a
  notification — as for an illegal stage (``stages.py``), a 37-day job is never ended
  by its own bookkeeping, and nothing it wrote is lost.
- Reading never refuses: ``StateRecord.from_dict`` takes any dict (a state.json written
  by an older or newer agent, a damaged one), puts what it cannot read as declared
  (an unknown key, a known key with a value of another type) in ``extra``, as it came,
  and reads the rest; a ``state`` or ``step`` this version does not know stays its string
  (``job_state`` and ``stage`` are then None). The laptop reads the agent's ``status``
  answer through it too (the answer's own keys, such as ``ledger``, are in ``extra``).
- The file keeps ``format: 1``: every key here was already in the files of the agent
  before this record (tests/data/state has three it wrote in a real run), so an old file
  is a valid record.

``step`` is a ``Stage`` (its transitions: stages.TRANSITIONS); ``state`` a ``JobState``
(what users see); ``phase`` what runs now. docs/architecture.md says how they relate.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional

from gpujob.agent.base.protocol import JobState
from gpujob.agent.base.stages import Stage

_S, _I, _N, _B, _D, _L = (str,), (int,), (int, float), (bool,), (dict,), (list,)

PHASES = ("start", "hold", "env", "warmup", "train", "done")  # what runs now
OWN_STATES = tuple(s.value for s in JobState if s not in (JobState.NOT_FOUND, JobState.UNKNOWN))


def _key(types: tuple, meaning: str, choices: tuple | None = None) -> Any:
    return field(default=None, metadata={"types": types, "meaning": meaning, "choices": choices})


@dataclass
class StateRecord:
    """One job's state.json. Every field is optional (None: not written yet, or cleared)."""

    # ---- the file and its writer
    format: Optional[int] = _key(_I, "the file's format version (protocol.FORMAT); none means 1")
    generation: Optional[int] = _key(_I, "lock generation of the last writer; an older one is refused "
                                         "(fencing)")
    updated_at: Optional[float] = _key(_N, "when the file was last written (time.time())")
    # ---- the job
    job_id: Optional[str] = _key(_S, "the job's id (its directory's name)")
    name: Optional[str] = _key(_S, "the spec's job name (the ledger's name)")
    state: Optional[str] = _key(_S, "what users see (JobState): preparing … succeeded, lost", OWN_STATES)
    phase: Optional[str] = _key(_S, "what runs now", PHASES)
    step: Optional[str] = _key(_S, "the supervisor's durable Stage: where its loop goes on after a death",
                               tuple(s.value for s in Stage))
    reason: Optional[str] = _key(_S, "why the job is in its state (a final state's cause, a rollback's, a "
                                     "wait's)")
    started_at: Optional[float] = _key(_N, "when the job's first supervisor started")
    finished_at: Optional[float] = _key(_N, "when the job reached a final state (None: not ended)")
    exit_code: Optional[int] = _key(_I, "the trainer's exit status at the end")
    signal: Optional[str] = _key(_S, "the failure signal the job ended on (rollback.on's names, disk_full)")
    left: Optional[list] = _key(_L, "pids still alive after the last kill at the end")
    lost_reason: Optional[str] = _key(_S, "why a lost job is not revived again (shown as its reason)")
    # ---- its supervisor
    supervisor_pid: Optional[int] = _key(_I, "pid of the supervisor that owns the job")
    supervisor_ticks: Optional[int] = _key(_I, "that pid's start time (guards against a recycled pid)")
    supervisors: Optional[int] = _key(_I, "how many supervisors have owned the job (1 + takeovers)")
    revivals: Optional[list] = _key(_L, "when dead supervisors were revived (3 within 10 minutes: no more)")
    run: Optional[int] = _key(_I, "which run of the job this is (none: 0): one more when `rollback` runs "
                                  "it again after its supervisor died; a queued stop of an earlier run is "
                                  "dropped")
    # ---- the profile and its environment
    profile: Optional[str] = _key(_S, "the wheel profile the job runs on now")
    env_key: Optional[str] = _key(_S, "that profile's venv key (H/envs/<env_key>)")
    resume: Optional[bool] = _key(_B, "the next trainer start resumes from a checkpoint")
    resumed: Optional[str] = _key(_S, "the last resume's note: which checkpoint it took, or why none")
    waiting: Optional[dict] = _key(_D, "what the supervisor waits for before it acts: {what, for "
                                       "(a checkpoint, a save), since, limit (s)}; None when it waits "
                                       "for nothing")
    warmup_done: Optional[list] = _key(_L, "the GPUs whose warmup finished in this profile's warmup step")
    warmup_again: Optional[bool] = _key(_B, "the warmup reruns after a compile race (then train resumes)")
    cache_cold: Optional[bool] = _key(_B, "this start clears the profile's compile caches first")
    cache_start: Optional[dict] = _key(_D, "how the profile's cache started: {profile, kind: "
                                           "warm|cold|restored}")
    cold_retry: Optional[dict] = _key(_D, "the one retry of a failed cold start on a snapshot (profile, "
                                          "reason, at, …)")
    snapshot_due: Optional[str] = _key(_S, "a profile whose cache snapshot is owed (taken again after a "
                                           "death)")
    standby: Optional[dict] = _key(_D, "the warm standby interpreter (its process record, profile, fifo, …)")
    # ---- the phase's child process
    child: Optional[dict] = _key(_D, "the running phase command's record (phase, pgid, ticks, log, "
                                     "exit_file, …)")
    child_pid: Optional[int] = _key(_I, "its pid (its process group's id)")
    child_pgid: Optional[int] = _key(_I, "its process group (what stop and takeover kill)")
    child_starting: Optional[dict] = _key(_D, "a child being spawned: written before the spawn, so a death "
                                              "mid-spawn finds what it started")
    phase_started_at: Optional[float] = _key(_N, "when the watched phase started (a figure, never acted on)")
    ending: Optional[dict] = _key(_D, "a hung child's end decided (pgid, signal, reason, stacks_saved)")
    # ---- throughput and the verdict (status shows them; rewritten once a second)
    tps: Optional[float] = _key(_N, "the latest throughput sample (tok/s)")
    tps_recent: Optional[list] = _key(_L, "the last 120 samples")
    window: Optional[dict] = _key(_D, "the policy's evidence: median, threshold, breaches, …")
    verdict: Optional[str] = _key(_S, "the policy's latest verdict (Verdict), or a follower's note")
    verdict_reason: Optional[str] = _key(_S, "the reason the policy gave for that verdict")
    baseline: Optional[float] = _key(_N, "the run's known-good throughput (None until one holds)")
    run_baseline: Optional[float] = _key(_N, "the baseline a run took after judging was suspended")
    pauses: Optional[list] = _key(_L, "[start, end] of the latest pauses left out of judging (saves, evals)")
    source_offset: Optional[int] = _key(_I, "how far a file source was read (a new supervisor goes on there)")
    judging_suspended: Optional[dict] = _key(_D, "judging held until a new baseline (since, profile, reason)")
    # ---- rollbacks and restarts
    rollbacks: Optional[list] = _key(_L, "every rollback: from, to, signal, reason, took, timings")
    pending_rollback: Optional[dict] = _key(_D, "a rollback written down and not yet carried out")
    suspect: Optional[dict] = _key(_D, "the profile left on a breach, marked bad once the target held")
    restarts: Optional[list] = _key(_L, "restarts in place (rollback.restart_on)")
    restarts_count: Optional[int] = _key(_I, "how many, when the trainer last started")
    # ---- a multi-node job
    fleet_go: Optional[bool] = _key(_B, "the controller said go (every node's lock is taken)")
    fleet_round: Optional[int] = _key(_I, "the fleet's relaunch round")
    fleet_relaunch: Optional[dict] = _key(_D, "node 0's last relaunch message (sent again to a node that "
                                              "missed it)")

    # keys this version cannot read as declared (another agent's, a damaged value), as they came
    extra: Dict[str, Any] = field(default_factory=dict, metadata={"types": None})

    @classmethod
    def from_dict(cls, data) -> "StateRecord":
        """Any dict (a non-dict reads as empty): never raises."""
        rec, extra = cls(), {}
        for k, v in (data.items() if isinstance(data, dict) else ()):
            key = KEYS.get(k) if isinstance(k, str) else None
            if key is None or key.problem(v, writing=False) is not None:
                extra[k] = v
                continue
            if k == "step":
                v = Stage.of(v) or v  # a step this version does not know stays its string
            elif k == "state":
                v = JobState.of(v) or v
            setattr(rec, k, v)
        rec.extra = extra
        return rec

    def to_dict(self) -> dict:
        """The keys written (not None), with ``extra`` as it came."""
        out = {k: getattr(self, k) for k in KEYS if getattr(self, k) is not None}
        return {**self.extra, **out}

    @property
    def stage(self) -> Optional[Stage]:
        return Stage.of(self.step) if self.step is not None else None

    @property
    def job_state(self) -> Optional[JobState]:
        return JobState.of(self.state) if self.state is not None else None

    @property
    def rollback_list(self) -> List[dict]:
        return [r for r in self.rollbacks or () if isinstance(r, dict)]


@dataclass(frozen=True)
class Key:
    name: str
    types: tuple
    meaning: str
    choices: Optional[tuple]

    def problem(self, value, writing: bool = True) -> Optional[str]:
        """None when ``value`` may be written under this key (None always may: it clears);
        a reader (``writing=False``) takes any value of the key's type (a newer agent's state)."""
        if value is None:
            return None
        if not isinstance(value, self.types) or (isinstance(value, bool) and bool not in self.types):
            want = " or ".join(t.__name__ for t in self.types)
            return f"state key {self.name!r}: expected {want}, got {type(value).__name__} {value!r:.60}"
        if writing and self.choices is not None and value not in self.choices:
            return f"state key {self.name!r}: {value!r:.60} is none of {', '.join(self.choices)}"
        return None


KEYS: Dict[str, Key] = {f.name: Key(f.name, f.metadata["types"], f.metadata["meaning"], f.metadata["choices"])
                        for f in fields(StateRecord) if f.metadata.get("types") is not None}


class BadStateKey(Exception):
    """A write of state.json with a key or value the record does not declare (strict mode only)."""


def problems(changes: dict) -> List[str]:
    """One line for each change the record does not allow (empty: all declared)."""
    out = []
    for k, v in changes.items():
        key = KEYS.get(k)
        if key is None:
            out.append(f"state key {k!r} is not declared in staterec.StateRecord")
        else:
            p = key.problem(v)
            if p is not None:
                out.append(p)
    return out


def check(changes: dict) -> Optional[str]:
    """None when every change is declared; else one line (raised in strict mode)."""
    from gpujob.agent.base.stages import strict
    found = problems(changes)
    if not found:
        return None
    line = "; ".join(found)
    if strict():
        raise BadStateKey(line)
    return line
