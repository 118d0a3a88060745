"""The model and protocol both sides share (stdlib only: it ships in the agent zip,
and the controller imports this same module).

- job states (``JobState``, with ``is_terminal``), the policy's verdicts
  (``Verdict``), how a phase ended (``OutcomeKind``) and the failure signals a run
  can end with (``FailureSignal``, what rollback.on names): str-valued, so the JSON
  in state.json, events.jsonl and the agent's answers is what it always was;
- the agent's exit codes: 0 ok, 1 failed, 2 bad usage, ``REFUSED``, and
  ``AGENT_MISSING`` (the launcher found no agent file: ship it and ask again);
- the agent's result shapes are declared in wire.py (each verb's request and answer, the
  error answer with its refusal code); ``tail`` first sends one ``{"offset": N, "skipped": M}``
  line (``wire.TailHead``), then the log's raw bytes;
- the format version of state.json and job.json: a file without one is format 1;
  an agent reads every format up to its own and refuses a newer one in one line.
"""

from __future__ import annotations

import json
from enum import Enum

from gpujob.agent.base.wire import Code, Refused, TailHead


class _StrEnum(str, Enum):
    """A str that is also an enum member: equal to, hashed and printed as its value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __hash__(self) -> int:
        return hash(self.value)

    @classmethod
    def of(cls, value):
        """The member for ``value``, or None (a state this version does not know)."""
        try:
            return cls(value)
        except ValueError:
            return None


StrEnum = _StrEnum  # for the controller's own str enums (doctor's CheckStatus)


class JobState(_StrEnum):
    PREPARING = "preparing"
    WARMUP = "warmup"
    TRAINING = "training"
    ROLLING_BACK = "rolling_back"
    STOPPING = "stopping"
    STOPPED = "stopped"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"            # not final: its supervisor is gone (status or boot revives it)
    NOT_FOUND = "not_found"  # status --missing-ok: no such job in that container
    UNKNOWN = "unknown"      # the controller's row when a submit's answer never came

    def is_terminal(self) -> bool:
        """Final: nothing will run for this job any more."""
        return self in FINAL_STATES

    def has_ended(self) -> bool:
        """Nothing runs now (final, or lost until revived)."""
        return self in ENDED


FINAL_STATES = (JobState.STOPPED, JobState.SUCCEEDED, JobState.FAILED)
ENDED = FINAL_STATES + (JobState.LOST,)


class Verdict(_StrEnum):
    """What the throughput policy says of its window."""
    WARMING_UP = "warming_up"
    INCONCLUSIVE = "inconclusive"
    OK = "ok"
    BREACH = "breach"
    ROLLBACK = "rollback"
    STALL = "stall"
    SETTLING = "settling"  # judging waits until the rate has settled (a running average climbs)
    PAUSED = "paused"      # a checkpoint save or a pause_pattern line (eval): samples left out


class FailureSignal(_StrEnum):
    """Why a run failed: the names rollback.on / stop_on and train.restarts.on list
    (spec.py's Signal takes its values from here, in this order)."""
    LOW_THROUGHPUT = "low_throughput"
    STALL = "stall"
    ERROR_SIGNATURE = "error_signature"
    CUDA_OOM = "cuda_oom"
    OOM_KILLED = "oom_killed"
    CRASH = "crash"
    GPU_IDLE = "gpu_idle"
    NCCL_TIMEOUT = "nccl_timeout"
    HW_ERROR = "hw_error"
    DRIVER_MISMATCH = "driver_mismatch"
    START_HANG = "start_hang"      # no throughput sample within throughput.start_timeout of the start
    COMPILE_RACE = "compile_race"  # the seeds' multi-thread compile race: FX-tracing error, or a
                                   # start hang on a cold compile cache (restarted as the cache warms)


#: a restart on the same wheels cannot help: the host changed
UNFIXABLE = (FailureSignal.DRIVER_MISMATCH,)


class OutcomeKind(_StrEnum):
    """How a phase run ended."""
    DONE = "done"          # exited 0
    SIGNAL = "signal"      # a failure signal (crash, low_throughput, stall, ...) with its reason
    STOP = "stop"          # stopped on request
    ROLLBACK = "rollback"  # a rollback asked for by the user
    FLEET_END = "fleet_end"  # a multi-node job's leader ended the job (signal_name: the state)
    FLEET_GO = "fleet_go"    # the leader's go at the barrier: every node is ready


# ---- exit codes ---------------------------------------------------------------
OK = 0
FAILED = 1
USAGE = 2
REFUSED = 5        # busy, unknown job, a newer format: the error line says why, its code (wire.Code) what
AGENT_MISSING = 6  # the launcher found no agent at the path: ship it first

#: ``python3 -c LAUNCHER AGENT.pyz --home H CMD ...``: runs the agent zipapp as
#: ``python3 AGENT.pyz ...`` would, but exits AGENT_MISSING when it is not there
#: (instead of python's exit 2 and an English message on stderr).
#: Its first line drops ``-c``'s current directory from sys.path: no module lying in
#: the directory it runs in shadows one of the agent's.
LAUNCHER = ("import sys\ndel sys.path[0]\nimport os,runpy\n"
            "if not os.path.isfile(sys.argv[1]):sys.exit(%d)\n"
            "del sys.argv[0]\nsys.path.insert(0,sys.argv[0])\n"
            "runpy.run_path(sys.argv[0],run_name='__main__')\n" % AGENT_MISSING)


# ---- result shapes ------------------------------------------------------------
def offset_record(offset: int, skipped: int) -> bytes:
    """``tail``'s first line: where its bytes start, and how many were trimmed before."""
    return (json.dumps(TailHead(offset, skipped).to_dict(), sort_keys=True) + "\n").encode()


class OffsetSplitter:
    """The controller's side of ``tail``: takes the first line as the offset record
    (``on_offset(dict)``) and hands every byte after it to ``sink``. A first line
    that is no offset record (the agent's ``{"error"}`` answer) is kept in ``error``, and
    the answer itself (``wire.ErrorAnswer``'s object, a refusal's code in it) in ``answer``."""

    MAX_HEAD = 64 << 10  # the first line: an offset record or an error, never more

    def __init__(self, sink, on_offset):
        self.sink, self.on_offset = sink, on_offset
        self._head = b""
        self.located = False
        self.error = None
        self.answer: dict | None = None

    def __call__(self, chunk: bytes) -> None:
        if self.located:
            self.sink(chunk)
            return
        self._head += chunk
        line, nl, rest = self._head.partition(b"\n")
        if not nl:
            if len(self._head) > self.MAX_HEAD:  # no offset record is this long: not held
                self._head, nl, line = b"", b"\n", self._head[:200] + b"..."
            else:
                return
        self._head = b""
        self.located = True
        from gpujob.agent.base.jsonl import loads
        try:
            rec = loads(line)
        except ValueError:
            rec = None
        if not isinstance(rec, dict) or not isinstance(rec.get("offset"), int):
            self.error = (rec.get("error") if isinstance(rec, dict) and isinstance(rec.get("error"), str)
                          else line[:2000].decode("utf-8", "replace"))
            self.answer = rec if isinstance(rec, dict) else None
            self.on_offset = self.sink = lambda _x: None  # nothing after an error is log
            return
        self.on_offset(rec)
        if rest:
            self.sink(rest)


# ---- format versions of state.json and job.json -----------------------------------
FORMAT = 1
FORMAT_KEY = "format"


class NewerFormat(Refused):
    """A file written by a newer agent: this one must not touch it."""

    code = Code.NEWER_FORMAT


def check_format(data: dict, what: str) -> dict:
    """``data`` as read from ``what``; NewerFormat when a newer agent wrote it."""
    version = data.get(FORMAT_KEY, 1) if isinstance(data, dict) else 1
    if not isinstance(version, int) or version > FORMAT:
        raise NewerFormat(f"{what} has format {version!r}, newer than this agent's {FORMAT}: "
                          "a newer gpujob wrote it; upgrade gpujob on this machine")
    return data
