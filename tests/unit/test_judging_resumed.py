"""Issue 38 row 10: judging suspended (no recovery, or nowhere to roll back to) came back
against whatever rate then held, so a run that slowed in steps ratcheted its own baseline
down (1.311M -> 1.297M -> 1.206M in 140 s on the H200). It comes back against the baseline it
was judged with; only a run with none sets one."""

from __future__ import annotations

from types import SimpleNamespace

from gpujob.agent.base.protocol import Verdict
from gpujob.agent.judge import policy
from gpujob.agent.judge.reasons import Decision
from gpujob.agent.supervisor.verdicts import Verdicts


class Journal:
    def __init__(self):
        self.events, self.state = [], {}

    def event(self, kind, **kw):
        self.events.append((kind, kw))

    def set_state(self, **kw):
        self.state.update(kw)


def _verdicts(cfg):
    report = SimpleNamespace(say=lambda *a, **k: None, notifier=None)
    holder = SimpleNamespace(now=cfg, base=cfg)
    return Verdicts(SimpleNamespace(spec={}), Journal(), None, report, None, None, holder, None, None)


def _run(baseline, since):
    return SimpleNamespace(phase="train", profile="compiled", start=0.0, samples=[], baseline=baseline,
                           suspect=None, pauses=None,
                           suspended={"since": since, "profile": "compiled", "reason": "nowhere to go",
                                      "baseline": baseline})


def test_a_run_that_slowed_comes_back_against_its_baseline_not_its_new_rate():
    cfg = policy.PolicyConfig(min_ratio=0.9, window="10s", failure_limit="20s", good_after=20.0)
    v = _verdicts(cfg)
    run = _run(1_311_000.0, since=100.0)
    d = Decision(Verdict.BREACH, "median 1.2M < 1.18M")
    got = None
    for k in range(100 * 10, 200 * 10):  # 100 s at 10 Hz, steady at 1.206M (0.92 of 1.311M)
        t = k / 10
        run.samples.append(policy.Sample(t, 1_206_000.0 if k % 2 else 1_180_000.0))
        got = v.review(run, d, t)
        if run.suspended is None:
            break
    # it held the threshold (0.9 x 1.311M = 1.18M) for good_after: judging resumed, the baseline kept
    assert run.suspended is None and run.baseline == 1_311_000.0
    kind, ev = [e for e in v.journal.events if e[0] == "judging_resumed"][0]
    assert ev["baseline"] == 1_311_000.0 and ev["held_median"] < 1_311_000.0
    assert v.journal.state.get("run_baseline") is None and got is d


def test_a_run_slower_than_its_threshold_stays_suspended_and_says_why():
    cfg = policy.PolicyConfig(min_ratio=0.9, window="10s", failure_limit="20s", good_after=20.0)
    v = _verdicts(cfg)
    run = _run(1_311_000.0, since=100.0)
    d = Decision(Verdict.BREACH, "median 1.1M < 1.18M")
    for k in range(100 * 10, 200 * 10):  # 1.1M: under the threshold of its baseline
        run.samples.append(policy.Sample(k / 10, 1_100_000.0))
        got = v.review(run, d, k / 10)
    assert run.suspended is not None and run.baseline == 1_311_000.0
    assert (got.verdict == Verdict.INCONCLUSIVE and "baseline 1.3M" in got.reason
            and "judging suspended until" in got.reason)
