"""The supervisor's durable step (stdlib only, pure): ``Stage``, the value of
state.json's ``step``, and the transitions allowed between stages, written once.

``Stage`` is where the supervisor's own loop (``Supervisor.lifecycle``) goes on
after a death; the ``phase`` (``start``, ``env``, ``warmup``, ``train``, ``done``)
is what runs now, and ``JobState`` (``preparing`` … ``succeeded``) is what users
see in ``status``. docs/architecture.md has the table and how the three relate.

Every change of ``step`` goes through :func:`check` (``journal.Journal.set_state``
calls it). An illegal one raises ``IllegalTransition`` when strict mode is on
(``GPUJOB_STRICT_STAGES=1``: the test suite sets it); in production the journal
keeps the last legal step, writes an ``internal_error`` event and notifies: a
37-day job is never ended by its own bookkeeping.
"""

from __future__ import annotations

import os

from gpujob.agent.base.protocol import StrEnum


class Stage(StrEnum):
    ENV = "env"              # build or reuse the profile's venv
    RESTORE = "restore"      # a known-good profile's cache snapshot into an empty cache
    WARMUP = "warmup"        # the warmup command, per GPU
    TRAIN = "train"          # the trainer (re-adopted after a death)
    ROLLBACK = "rollback"    # a rollback written down (pending_rollback), not yet carried out
    SUCCEEDED = "succeeded"  # the trainer exited 0: a new supervisor finishes the job, never reruns it


_ANY = frozenset(Stage)

# from -> the stages it may go to (staying on the same stage is always allowed).
# ROLLBACK is reachable from everywhere: a request by hand is taken at any step, and
# `gpujob rollback` restarts an ended job from whatever step it ended at.
TRANSITIONS = {
    # submit; rollback of a job never started
    None: frozenset({Stage.ENV, Stage.ROLLBACK}),
    Stage.ENV: frozenset({Stage.RESTORE, Stage.ROLLBACK}),
    Stage.RESTORE: frozenset({Stage.WARMUP, Stage.ROLLBACK}),
    Stage.WARMUP: frozenset({Stage.TRAIN, Stage.RESTORE, Stage.ROLLBACK}),  # done / restart; cold retry
    Stage.TRAIN: frozenset({Stage.RESTORE, Stage.WARMUP, Stage.ROLLBACK, Stage.SUCCEEDED}),  # cold retry;
                                                                    # a compile race on a cold cache; exit 0
    Stage.ROLLBACK: frozenset({Stage.RESTORE}),                           # the switch carried out
    Stage.SUCCEEDED: frozenset({Stage.ROLLBACK}),                         # restarted by hand
}
assert set(TRANSITIONS) == _ANY | {None}


class IllegalTransition(Exception):
    """A step change the table does not allow (strict mode only)."""


def strict() -> bool:
    return os.environ.get("GPUJOB_STRICT_STAGES") == "1"


def allowed(frm, to) -> bool:
    """Whether ``step`` may go from ``frm`` to ``to`` (raw strings or Stage; None: no step yet).
    A step this version does not know (a newer agent's) is never a legal target."""
    to_s = Stage.of(to)
    if to_s is None:
        return False
    frm_s = Stage.of(frm) if frm is not None else None
    if frm is not None and frm_s is None:  # an unknown old step: anything known is a way out
        return True
    return frm_s == to_s or to_s in TRANSITIONS[frm_s]


def check(frm, to) -> str | None:
    """None when legal; else the one line saying what was refused (raised in strict mode)."""
    if allowed(frm, to):
        return None
    line = f"illegal stage transition {frm!r} -> {to!r} (allowed from {frm!r}: " \
           f"{', '.join(sorted(map(str, TRANSITIONS.get(Stage.of(frm) if frm else None, ())))) or 'none'})"
    if strict():
        raise IllegalTransition(line)
    return line
