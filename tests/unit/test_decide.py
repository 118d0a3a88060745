"""next_action (agent/judge/decide.py): the rollback decision as a pure function, one test per case."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpujob.agent.judge import decide
from gpujob.agent.judge.decide import Do
from gpujob.agent.base.defaults import DEFAULTS

RB = dict(DEFAULTS["rollback"], fallback=["slow"], on=["low_throughput", "stall", "error_signature"])
PROFILES = {"fast": {}, "slow": {}}
GOOD_FAST = {"profiles": {"fast": {"status": "good", "baseline": 12000.0, "at": 5}}, "last_good": "fast"}


def out(kind="signal", signal="low_throughput", reason="median 4K < 10K", **kw):
    return SimpleNamespace(kind=kind, signal_name=signal, reason=reason, evidence={"median": 4000.0},
                           to=kw.get("to"), request=kw.get("request"), mark_bad=kw.get("mark_bad", True),
                           exit_code=kw.get("exit_code"), at=100.0)


def act(o, profile="slow", ledger=GOOD_FAST, rb=RB, rollbacks=(), suspect=None, restarts=(),
        restart_cfg=None):
    return decide.next_action(o, profile, ledger, PROFILES, rb, restart_cfg or {"on": []}, list(rollbacks),
                              list(restarts), suspect, 1000.0, DEFAULTS["restarts"])


def test_exit_0_succeeds():
    assert act(out(kind="done")).do == Do.SUCCEED


def test_a_breach_rolls_back_and_leaves_a_suspect_never_a_bad_profile():
    a = act(out())
    assert a.do == Do.ROLLBACK and a.target == "fast" and not a.mark_bad
    assert a.suspect == {"profile": "slow", "target": "fast", "signal": "low_throughput",
                         "reason": "median 4K < 10K",
                         "evidence": {"median": 4000.0}, "since": 100.0, "ok_since": None,
                         "status_before": "untried"}


def test_a_breach_of_the_known_good_with_nowhere_to_go_continues_and_marks_nothing():
    a = act(out(), profile="fast", rb=dict(RB, fallback=[]))
    assert a.do == Do.CONTINUE and a.target == "fast" and "nothing marked bad" in a.reason
    assert "judging suspended" in a.reason


@pytest.mark.parametrize("limit_reason", ["max_rollbacks (1) reached, nothing marked bad"])
def test_max_rollbacks_continues_or_stops_by_on_no_recovery(limit_reason):
    rbs = [{"signal": "low_throughput"}]
    assert act(out(), rb=dict(RB, max_rollbacks=1), rollbacks=rbs).do == Do.CONTINUE
    a = act(out(), rb=dict(RB, max_rollbacks=1, on_no_recovery="stop"), rollbacks=rbs)
    assert a.do == Do.FAIL and a.reason.startswith(limit_reason) and "on_no_recovery: stop" in a.reason
    # rollbacks by hand do not count
    assert act(out(), rb=dict(RB, max_rollbacks=1), rollbacks=[{"signal": "manual"}]).do == Do.ROLLBACK


def test_a_crash_with_nowhere_to_go_fails_and_marks_nothing():
    a = act(out(signal="error_signature", reason="is_fx_symbolic_tracing"), profile="fast",
            rb=dict(RB, fallback=[]))
    assert a.do == Do.FAIL and "no known-good profile to roll back to" in a.reason and not a.mark_bad


SUSPECT = {"profile": "slow", "target": "fast", "signal": "low_throughput", "reason": "r", "evidence": {},
           "since": 50.0, "ok_since": None, "status_before": "good"}


def test_the_target_as_slow_is_no_recovery_not_the_profile():
    a = act(out(), profile="fast", suspect=SUSPECT)
    assert a.do == Do.CONTINUE and a.verdict == "no_recovery" and a.suspect is None
    assert a.reason.startswith("no recovery on fast: not the profile (slow stays good)")
    assert a.events[0][0] == "no_recovery"
    stop = act(out(), profile="fast", suspect=SUSPECT, rb=dict(RB, on_no_recovery="stop"))
    assert stop.do == Do.FAIL and stop.verdict == "no_recovery"


def test_the_target_failing_itself_abandons_the_confirmation_and_is_judged_as_usual():
    a = act(out(signal="error_signature", reason="boom"), profile="fast", suspect=SUSPECT,
            ledger={"profiles": {"fast": {"status": "good", "at": 5}, "slow": {"status": "good", "at": 1}}})
    assert a.events[0][0] == "confirmation_abandoned"
    assert a.do == Do.ROLLBACK and a.target == "slow" and a.suspect["profile"] == "fast"


def test_a_rollback_by_hand_abandons_a_suspect_and_keeps_mark_bad():
    a = act(out(kind="rollback", to="slow", mark_bad=False), profile="fast", suspect=SUSPECT)
    assert a.do == Do.ROLLBACK and a.signal == "manual" and a.suspect is None and not a.mark_bad
    assert act(out(kind="rollback", to="fast"), profile="fast").do == Do.ALREADY_ON


def test_stop_on_and_the_restart_policy():
    assert act(out(signal="crash"), rb=dict(RB, stop_on=["crash"])).do == Do.FAIL
    cfg = {"on": ["crash"], "max": 1, "within": 600}
    a = act(out(signal="crash"), restart_cfg=cfg)
    assert a.do == Do.RESTART and a.restart["signal"] == "crash"
    again = act(out(signal="crash"), restart_cfg=cfg, restarts=[{"at": 990, "signal": "crash"}])
    assert again.do == Do.FAIL and "crash loop" in again.reason


def test_confirmation_needs_the_target_to_hold_ok_for_confirm_seconds():
    s = dict(SUSPECT)
    st, s = decide.confirmation(s, "warming_up", 10, 120)
    assert st == "pending" and s["ok_since"] is None
    st, s = decide.confirmation(s, "ok", 20, 120)
    assert st == "pending" and s["ok_since"] == 20
    st, s = decide.confirmation(s, "breach", 30, 120)  # a breaching window restarts the clock
    assert s["ok_since"] is None
    st, s = decide.confirmation(s, "ok", 40, 120)
    st, s = decide.confirmation(s, "inconclusive", 100, 120)
    assert st == "pending" and s["ok_since"] == 40
    st, s = decide.confirmation(s, "ok", 160, 120)
    assert st == "confirmed" and s["held_for"] == 120


def test_promotion_needs_a_floor_or_a_baseline_once_the_ledger_had_a_known_good():
    assert decide.promotion(False, None, None, False, ever_good=False) is None  # the very first baseline
    why = decide.promotion(False, None, None, False, ever_good=True)
    assert why and "--accept-baseline" in why and "throughput.baseline" in why
    assert decide.promotion(True, None, None, False, True) is None
    assert decide.promotion(False, 9000.0, None, False, True) is None
    assert decide.promotion(False, None, 9000.0, False, True) is None
    assert decide.promotion(False, None, None, True, True) is None


def test_pick_prefers_the_newest_known_good_then_fallback_not_bad():
    led = {"profiles": {"a": {"status": "good", "at": 1}, "b": {"status": "good", "at": 2},
                        "c": {"status": "bad"}}}
    assert decide.pick(led, "x", {"a", "b", "c"}, []) == "b"
    assert decide.pick(led, "b", {"a", "b", "c"}, []) == "a"
    assert decide.pick({"profiles": {"c": {"status": "bad"}}}, "x", {"c", "d"}, ["c", "d"]) == "d"
    assert decide.pick({}, "x", {"x"}, ["x"]) is None


def test_a_compile_race_or_compiler_crash_with_a_known_good_rolls_back_there_else_restarts_as_before():
    """Issue 33 item 8: with a known-good profile on the ledger a compile race (or a crash in
    torch's compiler stack) goes on there, the raced profile a suspect (bad after confirm);
    without one it is restarted on the same wheels and then fails, as before."""
    race = out(signal="compile_race",
               reason="compile race (exited with code 1): Detected that you are using FX")
    a = act(race)
    assert a.do == Do.ROLLBACK and a.target == "fast" and a.suspect["profile"] == "slow"
    assert a.suspect["signal"] == "compile_race" and not a.mark_bad
    crash = out(signal="crash",
                reason="exited with code 1: torch._dynamo.exc.BackendCompilerFailed: backend='inductor'")
    assert act(crash).do == Do.ROLLBACK and act(crash).target == "fast"
    plain = out(signal="crash", reason="exited with code 1: ValueError: bad batch")
    assert act(plain).do != Do.ROLLBACK  # any other crash: as before (crash is not in rollback.on here)
    # no known-good profile: restarted on the same wheels (then failed), as before
    assert act(race, ledger={"profiles": {}}).do == Do.RESTART
    # the known-good itself races: nowhere else known-good
    assert act(race, profile="fast").do == Do.RESTART
    # max_rollbacks reached: as before
    assert act(race, rollbacks=[{"signal": "compile_race"}] * 5).do == Do.RESTART
