"""next_action (agent/judge/decide.py) as a table: one row per way a phase can end and what
the job knows then (profile, ledger, rollback section, earlier rollbacks and restarts, a
suspect), and the one action it must give. Each branch of the decision has a row; the
prose cases with their full suspects and events are in test_decide.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpujob.agent.base.defaults import DEFAULTS
from gpujob.agent.judge import decide
from gpujob.agent.judge.decide import Do

PROFILES = {"fast": {}, "slow": {}}
RB = dict(DEFAULTS["rollback"], fallback=["slow"], max_rollbacks=1)
GOOD_FAST = {"profiles": {"fast": {"status": "good", "baseline": 12000.0, "at": 5}}, "last_good": "fast"}
NO_GOOD: dict = {"profiles": {}}
NOW = 10_000.0
RESTARTED = [{"at": NOW - 10, "signal": "crash"}] * 3       # three within the hour: the default max
OOM_AGAIN = [{"at": NOW - 10, "signal": "oom_killed"}]      # an OOM kill right after one
SUSPECT = {"profile": "slow", "target": "fast", "signal": "low_throughput", "reason": "slow",
           "evidence": {}, "since": 1.0, "ok_since": None, "status_before": "untried"}
WARMUP = {"when": "first"}


def outcome(kind="signal", signal=None, reason="it failed", to=None, mark_bad=True, cold=False):
    return SimpleNamespace(kind=kind, signal_name=signal, reason=reason, to=to, request=None,
                           mark_bad=mark_bad,
                           exit_code=1, at=100.0, evidence={"cold_cache": True} if cold else {})


# id, the outcome, on profile, ledger, rollback overrides, restart section, rollbacks, restarts, suspect,
# warmup -> do, target, signal, a piece of the reason
ROWS = [
    ("exit-0", outcome("done"), "slow", GOOD_FAST, {}, {}, [], [], None, None,
     Do.SUCCEED, None, None, "train exited 0"),
    ("stop-asked", outcome("stop"), "slow", GOOD_FAST, {}, {}, [], [], None, None,
     Do.STOP, None, None, "stopped on request"),
    ("by-hand-onto-itself", outcome("rollback", to="slow"), "slow", GOOD_FAST, {}, {}, [], [], None, None,
     Do.ALREADY_ON, None, None, "already runs on it"),
    ("by-hand", outcome("rollback", to="fast", reason="asked"), "slow", GOOD_FAST, {}, {}, [], [], SUSPECT,
     None, Do.ROLLBACK, "fast", "manual", "asked"),
    ("slow-to-known-good", outcome(signal="low_throughput"), "slow", GOOD_FAST, {}, {}, [], [], None, None,
     Do.ROLLBACK, "fast", "low_throughput", "it failed"),
    ("slow-to-fallback", outcome(signal="low_throughput"), "fast", NO_GOOD, {}, {}, [], [], None, None,
     Do.ROLLBACK, "slow", "low_throughput", "it failed"),
    ("slow-nowhere-continues", outcome(signal="low_throughput"), "fast", GOOD_FAST, {"fallback": []}, {}, [],
     [],
     None, None, Do.CONTINUE, "fast", "low_throughput", "no known-good profile to roll back to from fast"),
    ("slow-nowhere-stops", outcome(signal="low_throughput"), "fast", GOOD_FAST,
     {"fallback": [], "on_no_recovery": "stop"}, {}, [], [], None, None,
     Do.FAIL, None, "low_throughput", "(rollback.on_no_recovery: stop)"),
    ("max-rollbacks", outcome(signal="low_throughput"), "slow", GOOD_FAST, {}, {}, [{"signal": "stall"}], [],
     None, None, Do.CONTINUE, "slow", "low_throughput", "max_rollbacks (1) reached"),
    ("by-hand-rollbacks-do-not-count", outcome(signal="stall"), "slow", GOOD_FAST, {}, {},
     [{"signal": "manual"}], [], None, None, Do.ROLLBACK, "fast", "stall", "it failed"),
    ("stop-on", outcome(signal="stall"), "slow", GOOD_FAST, {"stop_on": ["stall"]}, {}, [], [], None, None,
     Do.FAIL, None, "stall", "(stall is in rollback.stop_on)"),
    ("rollback-off", outcome(signal="low_throughput"), "slow", GOOD_FAST, {"enabled": False}, {}, [], [],
     None, None, Do.FAIL, None, "low_throughput", "it failed"),
    ("crash-nowhere-fails", outcome(signal="error_signature"), "fast", GOOD_FAST, {"fallback": []}, {}, [],
     [], None, None, Do.FAIL, None, "error_signature", "no known-good profile to roll back to"),
    ("compiler-crash-to-known-good",
     outcome(signal="crash", reason="torch._dynamo.exc.BackendCompilerFailed"),
     "slow", GOOD_FAST, {}, {}, [], [], None, None, Do.ROLLBACK, "fast", "crash", "BackendCompilerFailed"),
    ("race-to-known-good", outcome(signal="compile_race"), "slow", GOOD_FAST, {}, {}, [], [], None, None,
     Do.ROLLBACK, "fast", "compile_race", "it failed"),
    ("race-restarts-warm", outcome(signal="compile_race"), "slow", NO_GOOD, {"fallback": []}, {}, [], [],
     None, WARMUP, Do.RESTART, "slow", "compile_race", "it failed"),
    ("race-cold-no-warmup", outcome(signal="compile_race", cold=True), "slow", NO_GOOD, {"fallback": []}, {},
     [], [], None, None, Do.FAIL, None, "compile_race", "hung on a cold compile cache"),
    ("container-restart", outcome(signal="container_restart"), "slow", GOOD_FAST, {}, {}, [], [], None, None,
     Do.RESTART, "slow", "container_restart", "it failed"),
    ("crash-restarts", outcome(signal="crash"), "slow", GOOD_FAST, {}, DEFAULTS["restarts"], [], [], None,
     None, Do.RESTART, "slow", "crash", "it failed"),
    ("crash-loop", outcome(signal="crash"), "slow", GOOD_FAST, {}, DEFAULTS["restarts"], [], RESTARTED,
     None, None, Do.FAIL, None, "crash", "crash loop: 3 restarts"),
    ("oom-kill-loop", outcome(signal="oom_killed"), "slow", GOOD_FAST, {}, {"on": ["oom_killed"], "max": 9,
     "within": 3600.0}, [], OOM_AGAIN, None, None, Do.FAIL, None, "oom_killed", "OOM-kill loop"),
    ("not-handled-fails", outcome(signal="driver_mismatch"), "slow", GOOD_FAST, {}, {}, [], [], None, None,
     Do.FAIL, None, "driver_mismatch", "it failed"),
    ("target-slow-too", outcome(signal="low_throughput"), "fast", GOOD_FAST, {}, {}, [{"signal": "x"}], [],
     SUSPECT, None, Do.CONTINUE, "fast", "low_throughput", "no recovery on fast: not the profile"),
]


@pytest.mark.parametrize("o, profile, ledger, rb, restart_cfg, rollbacks, restarts, suspect, warmup, "
                         "do, target, signal, reason", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_next_action(o, profile, ledger, rb, restart_cfg, rollbacks, restarts, suspect, warmup,
                     do, target, signal, reason):
    a = decide.next_action(o, profile, ledger, PROFILES, dict(RB, **rb), restart_cfg, rollbacks, restarts,
                           suspect, NOW, DEFAULTS["restarts"], warmup=warmup)
    assert (a.do, a.target, a.signal) == (do, target, signal), a
    assert reason in a.reason, a.reason
    if do == Do.ROLLBACK and signal != "manual":  # automatic: a suspect, never a profile marked bad
        assert a.suspect["profile"] == profile and a.suspect["target"] == target and not a.mark_bad


def test_the_table_reaches_every_action():
    assert {r[10] for r in ROWS} == set(Do)
