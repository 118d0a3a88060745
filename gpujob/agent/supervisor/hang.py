"""A trainer that hangs: named, its stacks saved, its end written down first (stdlib only).

- ``start_hang``: no throughput sample within ``throughput.start_timeout`` of the
  trainer's start. On a compile cache that was empty when the run started it is the
  seeds' multi-thread compile race (``compile_race``: restarted on the same profile
  as the cache warms); otherwise a ``start_hang``.
- ``end_hung``: before gpujob ends a hung trainer (a start hang, a stall, a process
  still running after an error signature) it writes the decision to state.json
  (``ending``), then saves the Python stacks (agent/supervisor/stacks.py) as a ``stacks`` event.
  A SIGABRT changes how the trainer exits, so a supervisor that dies in between is
  followed by one that reads ``ending`` instead of judging a "killed by SIGABRT" crash.
"""

from __future__ import annotations

from gpujob.agent.supervisor import stacks
from gpujob.agent.base.protocol import FailureSignal, OutcomeKind


def start_hang(phase: str, waited: float, timeout: float, cold_cache: bool) -> tuple:
    """``(failure, reason, evidence)`` of a run with no sample ``waited`` s after its
    start (pure)."""
    reason = (f"no throughput sample {waited:.0f}s after {phase} started (throughput.start_timeout "
              f"{timeout:g}s)")
    if cold_cache:
        return (FailureSignal.COMPILE_RACE,
                f"{reason} on a cold compile cache: the multi-thread compile race hangs so",
                {"start_timeout": timeout, "waited": round(waited, 1), "cold_cache": True, "hung": True})
    return FailureSignal.START_HANG, reason, {"start_timeout": timeout, "waited": round(waited, 1),
                                              "cold_cache": False, "hung": True}


def ending_of(state: dict, pgid: int):
    """The end a previous supervisor decided for the group ``pgid`` (or None)."""
    ending = state.get("ending") or {}
    return ending if ending.get("pgid") == pgid else None


def end_hung(journal, child_env, say, proc, run, outcome) -> None:
    """Write the decision down, then save the hung trainer's stacks (once per decision);
    ``child_env``: parts.ChildEnv (is the faulthandler on?), ``say``: Report.say."""
    st = journal.state()
    prior = ending_of(st, proc.pgid)
    if prior is None:
        prior = {"pgid": proc.pgid, "kind": outcome.kind, "signal": outcome.signal_name,
                 "reason": outcome.reason, "evidence": outcome.evidence, "stacks_saved": False}
        journal.set_state(ending=prior)
    if prior.get("stacks_saved"):
        return
    env = child_env.child_env(run.profile)
    faulthandler = env.get("PYTHONFAULTHANDLER", "") not in ("", "0")
    try:
        rec = stacks.capture(proc.pgid, journal.path(f"{run.phase}.log"), journal.path("venv"), faulthandler)
    except Exception as e:  # never let the bookkeeping of a hang crash the supervisor
        rec = {"method": "none", "stacks": [], "note": f"could not read the stacks: {type(e).__name__}: {e}"}
    journal.event("stacks", phase=run.phase, signal=outcome.signal_name, reason=outcome.reason, **rec)
    journal.set_state(ending=dict(prior, stacks_saved=True))
    n = len(rec["stacks"])
    if n:
        say(f"saved the Python stacks of {run.phase} ({rec['method']}, {n} process"
                f"{'es' if n > 1 else ''}): gpujob logs --stacks")
    else:
        say(f"no Python stacks of {run.phase}: {rec.get('note')}")


def predecessor_outcome(journal, proc, make_outcome):
    """The outcome a dead supervisor had decided for this re-adopted run, or None."""
    prior = ending_of(journal.state(), proc.pgid)
    if prior is None:
        return None
    journal.event("ending_resumed", signal=prior.get("signal"), pgid=proc.pgid)
    return make_outcome(prior.get("kind") or OutcomeKind.SIGNAL, prior.get("signal") or "",
                        f"{prior.get('reason')} (decided before a supervisor restart)",
                        prior.get("evidence") or {})
