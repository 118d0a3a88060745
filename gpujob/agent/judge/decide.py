"""What the supervisor does after a phase ends, and whether a rollback proved itself
(stdlib only, pure: no I/O, no clock reads; callers pass what they know).

``next_action`` is the rollback decision beside ``policy.decide``: a function of the
outcome, the ledger's view, the rollback and restart configuration, the job's
rollbacks and restarts so far and the *suspect* (the profile an automatic rollback
left, not yet judged). ``Supervisor.handle`` only carries out the ``Action``.

The rules (docs/rollback.md):
- an automatic rollback leaves a suspect, never a bad profile; the suspect is marked
  bad only once the profile rolled back to holds at or above the threshold for
  ``rollback.confirm`` (``confirmation``);
- the target failing the same way (no recovery), ``max_rollbacks`` reached, or a
  failure with nowhere to roll back to marks nothing bad: ``rollback.on_no_recovery``
  ends the job (``stop``) or goes on on the same profile with judging suspended
  until a new baseline holds (``continue``, for throughput breaches only: any other
  failure has no trainer left to go on with, and ends the job).
"""

from __future__ import annotations

import re

from dataclasses import dataclass, field
from typing import Dict, Optional

from gpujob.agent.base.defaults import DEFAULTS
from gpujob.agent.base.protocol import FailureSignal, OutcomeKind, StrEnum, Verdict

# a slowdown that may be the machine's rather than the wheels' (data, disk, another process)
SLOWNESS = (FailureSignal.LOW_THROUGHPUT,)


class Do(StrEnum):
    SUCCEED = "succeed"        # the trainer exited 0
    STOP = "stop"              # a stop was asked
    ALREADY_ON = "already_on"  # a rollback by hand onto the profile that runs
    ROLLBACK = "rollback"      # to ``target``; automatic ones leave ``suspect``
    RESTART = "restart"        # the same profile again, resumed (train.restarts)
    CONTINUE = "continue"      # the same profile again, judging suspended (on_no_recovery: continue)
    FAIL = "fail"              # the job ends as failed with ``reason``


@dataclass(frozen=True)
class Action:
    do: Do
    reason: str = ""
    target: Optional[str] = None
    signal: Optional[str] = None
    mark_bad: bool = False            # a rollback by hand with --mark-bad
    suspect: Optional[Dict] = None    # the suspect to keep in state.json (None: clear it)
    verdict: Optional[str] = None     # what became of the suspect: confirmed | no_recovery | abandoned
    events: tuple = ()                # (type, fields) the supervisor journals
    restart: Optional[Dict] = None    # the restart record (RESTART)
    fields: Dict = field(default_factory=dict)


def pick(ledger: dict, current: str, profiles, fallback, exclude=()) -> Optional[str]:
    """Where to roll back to from ``current``: the most recently proven good profile that
    this spec lists (a known-good profile it does not list, tried elsewhere or renamed, is
    passed over: ``unlisted_goods``), else the first ``fallback`` profile not known to be
    bad; None when there is nowhere to go."""
    entries = (ledger or {}).get("profiles") or {}
    goods = [(e.get("at", 0), p) for p, e in entries.items()
             if e.get("status") == "good" and p != current and p not in exclude and p in profiles]
    if goods:
        return max(goods)[1]
    for name in fallback or []:
        if name != current and name in profiles and name not in exclude and \
                (entries.get(name) or {}).get("status") != "bad":
            return name
    return None


#: a crash inside torch's compiler stack (dynamo, inductor, triton's compile): the wheels', not the job's
_COMPILER_CRASH = re.compile(r"BackendCompilerFailed|InductorError|torch\._dynamo\.exc\."
                             r"|torch\._inductor\.exc\.|CppCompileError|triton\.compiler\.errors\.")


def compiler_crash(failure: str, reason: str | None) -> bool:
    """A crash (or an error signature) whose last line names torch's compiler stack."""
    return failure in ("crash", FailureSignal.ERROR_SIGNATURE) and bool(_COMPILER_CRASH.search(reason or ""))


def unlisted_goods(ledger: dict, profiles) -> list:
    """The known-good profiles of a ledger that the spec does not list (never rolled back to)."""
    return sorted(p for p, e in ((ledger or {}).get("profiles") or {}).items()
                  if isinstance(e, dict) and e.get("status") == "good" and p not in profiles)


def restart_refusal(cfg: dict, restarts: list, failure: str, t: float) -> Optional[str]:
    """Why the restart policy will not restart the trainer after ``failure`` (None: it will).
    ``restarts`` are the earlier restarts of the job, newest last."""
    limit = int(cfg["max"])
    within = float(cfg["within"])
    recent = [r for r in restarts if t - r["at"] <= within]
    if failure == FailureSignal.OOM_KILLED and restarts and \
            restarts[-1].get("signal") == FailureSignal.OOM_KILLED:
        return "OOM-kill loop: killed by the OOM killer again right after a restart"
    if len(recent) >= limit:
        return f"crash loop: {len(recent)} restarts within {within:g}s (train.restarts.max {limit})"
    return None


def _nowhere(why: str, out, profile: str, rb: dict, suspect, verdict=None, events=(), last=None) -> Action:
    """No rollback: on_no_recovery decides; nothing is marked bad."""
    failure = out.signal_name
    if rb.get("on_no_recovery", "continue") == "continue" and failure in SLOWNESS:
        return Action(Do.CONTINUE, f"{why}; staying on {profile}, judging suspended until it holds "
                      f"against its baseline again (rollback.on_no_recovery: continue)", target=profile,
                      signal=failure, suspect=None, verdict=verdict, events=events)
    tail = " (rollback.on_no_recovery: stop)" if failure in SLOWNESS else ""
    return Action(Do.FAIL, f"{why}{tail}; last: {last or out.reason}", signal=failure, suspect=None,
                  verdict=verdict, events=events)


def race_refusal(out, warmup: Optional[dict], restart_cfg: dict, default_restarts: dict,
                 restarts: list, now: float) -> tuple:
    """A compile race: ``(None, warmup_again)`` when it is restarted on the same profile (the
    cache warmer each time), else ``(why not, False)``. A hang on a cache that was empty at
    the start warms only through a warmup (one thread compiles): it runs again first;
    without one a restart is not tried, since on a cache that stays empty the race hangs
    again (6 of 6 restarts on the H200, tests/data/traces/race_restart_*)."""
    cold_hang = bool((out.evidence or {}).get("cold_cache"))
    if cold_hang and (not warmup or warmup.get("when") == "never"):
        return ("it hung on a cold compile cache and the job has no warmup to fill it (a restart on a cache "
                "that stays empty hangs again)"), False
    on = (restart_cfg or {}).get("on") or []
    cfg = restart_cfg if FailureSignal.COMPILE_RACE in on else default_restarts
    refusal = restart_refusal(cfg, restarts, FailureSignal.COMPILE_RACE, now)
    return (None, cold_hang) if refusal is None else (f"not cured by restarts ({refusal})", False)


def next_action(out, profile: str, ledger: dict, profiles, rb: dict, restart_cfg: dict,
                rollbacks: list, restarts: list, suspect: Optional[dict], now: float,
                default_restarts: Optional[dict] = None, warmup: Optional[dict] = None) -> Action:
    """The one decision after a phase ended with ``out`` (an Outcome: kind, signal_name,
    reason, to, request, mark_bad) on ``profile``; ``warmup`` is the spec's warmup section
    (None without one); ``default_restarts`` (None: the spec's) judges a restart that the job's
    own restart policy does not name."""
    if default_restarts is None:
        default_restarts = DEFAULTS["restarts"]
    if out.kind == OutcomeKind.DONE:
        return Action(Do.SUCCEED, "train exited 0", suspect=suspect)
    if out.kind == OutcomeKind.STOP:
        return Action(Do.STOP, "stopped on request", suspect=suspect)
    if out.kind == OutcomeKind.ROLLBACK:  # by hand: the user named the target
        if out.to == profile:
            return Action(Do.ALREADY_ON, f"rollback to {out.to} asked, but the job already runs on it",
                          suspect=suspect)
        gone = (("confirmation_abandoned", {"suspect": suspect["profile"], "target": suspect.get("target"),
                                            "why": f"rolled back by hand to {out.to}"}),) if suspect else ()
        return Action(Do.ROLLBACK, out.reason, target=out.to, signal="manual", mark_bad=bool(out.mark_bad),
                      suspect=None, events=gone)
    failure, reason = out.signal_name, out.reason
    events: tuple = ()
    if suspect and suspect.get("target") == profile:  # the confirmation ends here, with no recovery
        if failure in SLOWNESS or failure == FailureSignal.STALL:
            why = f"no recovery on {profile}: not the profile ({suspect['profile']} stays " \
                  f"{suspect.get('status_before') or 'as it was'})"
            return _nowhere(why, out, profile, rb, suspect,
                            verdict="no_recovery",
                            events=(("no_recovery", {"suspect": suspect["profile"], "target": profile,
                                                     "signal": failure, "reason": reason}),))
        events = (("confirmation_abandoned", {"suspect": suspect["profile"], "target": profile,
                                              "why": f"{profile} failed itself: {reason}"}),)
        suspect = None
    if failure in (rb.get("stop_on") or []):
        return Action(Do.FAIL, f"{reason} ({failure} is in rollback.stop_on)", signal=failure,
                      suspect=suspect, events=events)
    room = len([r for r in rollbacks if r.get("signal") != "manual"]) < int(rb.get("max_rollbacks", 1))
    good = pick(ledger, profile, profiles, None) if rb.get("enabled", True) and room else None
    if good is not None and (failure == FailureSignal.COMPILE_RACE or compiler_crash(failure, reason)):
        # a compile race or a compiler crash with a known-good profile on the ledger: go on there,
        # from this job's newest finished checkpoint; the raced profile is a suspect (bad after confirm)
        status = ((ledger or {}).get("profiles", {}).get(profile) or {}).get("status", "untried")
        new = {"profile": profile, "target": good, "signal": failure, "reason": reason,
               "evidence": dict(out.evidence or {}), "since": out.at, "ok_since": None,
               "status_before": status}
        return Action(Do.ROLLBACK, reason, target=good, signal=failure, suspect=new, events=events)
    if failure == FailureSignal.COMPILE_RACE:  # the same wheels on a warmer cache first
        refusal, warmup_again = race_refusal(out, warmup, restart_cfg, default_restarts, restarts, now)
        if refusal is None:
            rec = {"at": now, "signal": failure, "reason": reason, "profile": profile,
                   "exit_code": out.exit_code}
            return Action(Do.RESTART, reason, target=profile, signal=failure, restart=rec, suspect=suspect,
                          events=events, fields={"warmup_again": warmup_again})
        reason = f"{reason}; {refusal}"  # then a failure of this profile, as any other
    if rb.get("enabled", True) and failure in (rb.get("on") or []):
        limit = int(rb["max_rollbacks"])
        auto = [r for r in rollbacks if r.get("signal") != "manual"]
        if len(auto) >= limit:
            return _nowhere(f"max_rollbacks ({limit}) reached, nothing marked bad", out, profile, rb, suspect,
                            events=events, last=reason)
        target = pick(ledger, profile, profiles, rb.get("fallback"))
        if target is None:
            return _nowhere(f"no known-good profile to roll back to from {profile}, nothing marked bad",
                            out, profile, rb, suspect, events=events, last=reason)
        status = ((ledger or {}).get("profiles", {}).get(profile) or {}).get("status", "untried")
        new = {"profile": profile, "target": target, "signal": failure, "reason": reason,
               "evidence": dict(out.evidence or {}), "since": out.at, "ok_since": None,
               "status_before": status}
        return Action(Do.ROLLBACK, reason, target=target, signal=failure, suspect=new, events=events)
    restart_on = (restart_cfg or {}).get("on") or []
    if failure == "container_restart" or failure in restart_on:
        cfg = restart_cfg if failure in restart_on else default_restarts
        refusal = restart_refusal(cfg, restarts, failure, now)
        if refusal is None:
            rec = {"at": now, "signal": failure, "reason": reason, "profile": profile,
                   "exit_code": out.exit_code}
            return Action(Do.RESTART, reason, target=profile, signal=failure, restart=rec, suspect=suspect,
                          events=events)
        return Action(Do.FAIL, f"{refusal}; last: {reason}", signal=failure, suspect=suspect, events=events)
    return Action(Do.FAIL, reason, signal=failure, suspect=suspect, events=events)


def confirmation(suspect: dict, verdict: str, t: float, confirm: float) -> tuple:
    """(status, suspect) after one verdict on the rollback target's samples: ``confirmed``
    once the target held ok (no breaching window) for ``confirm`` seconds since its first
    ok, ``pending`` otherwise (a breach restarts the clock; warming up, inconclusive,
    settling or paused leave it as it is). The suspect returned carries the clock
    (``ok_since``), kept in state.json so a new supervisor goes on with it."""
    ok_since = suspect.get("ok_since")
    if verdict == Verdict.OK:
        ok_since = t if ok_since is None else ok_since
        if t - ok_since >= confirm:
            return "confirmed", dict(suspect, ok_since=ok_since, confirmed_at=t,
                                     held_for=round(t - ok_since, 3))
    elif verdict in (Verdict.BREACH, Verdict.ROLLBACK):
        ok_since = None
    return "pending", dict(suspect, ok_since=ok_since)


def promotion(has_min: bool, baseline, spec_baseline, accept_baseline: bool,
              ever_good: bool) -> Optional[str]:
    """Why a profile that held steady may not become known-good (None: it may). A profile
    becomes known-good against the ``min`` floor or a baseline; with neither (a
    ``min_ratio``-only spec) it sets the first baseline, unless the ledger once had a
    known-good for this job: then only ``submit --accept-baseline`` or a spec
    ``throughput.baseline`` lets a new profile set it (the known-good may have been lost
    to a false verdict, and the slow profile would take its place)."""
    if has_min or baseline is not None or spec_baseline is not None or accept_baseline:
        return None
    if ever_good:
        return ("not promoted: no min and no baseline to judge it against, and this job's ledger had a "
                "known-good profile before (gpujob ledger history); submit --accept-baseline or set "
                "throughput.baseline to let it set the baseline")
    return None
