"""The rollback policy over sample counts (agent/judge/policy.py), pure; time windows: test_policy_time.py."""

import json

import pytest

from gpujob.agent.judge.policy import Decision, PolicyConfig, Sample, decide, known_good, threshold




# ---------------------------------------------------------------- policy


def mk(values, t0=0.0, dt=10.0):
    return [Sample(t0 + i * dt, float(v), step=i) for i, v in enumerate(values)]


def at_end(samples, dt=1.0):
    return samples[-1].t + dt


def Cfg(**kw):
    """The rules below predate the settle rule (tests/unit/test_policy_time.py tests it): off here."""
    return PolicyConfig(**{"settle_samples": 0, **kw})


def test_threshold():
    assert threshold(Cfg(min=10_000), None) == (10_000, "min")
    v, src = threshold(Cfg(min_ratio=0.8), 12_800)
    assert v == pytest.approx(10_240) and src == "min_ratio 0.8 × baseline 12.8K"
    assert threshold(Cfg(min=11_000, min_ratio=0.8), 12_800) == (11_000, "min")
    assert threshold(Cfg(min=5_000, min_ratio=0.8), 12_800)[0] == pytest.approx(10_240)
    assert threshold(Cfg(min=5_000, min_ratio=0.8), None) == (5_000, "min")
    v, src = threshold(Cfg(min_ratio=0.8), None)
    assert v is None and "no baseline" in src
    assert threshold(Cfg(), 12_800)[0] is None


def test_warming_up_by_time_and_samples_ignored():
    cfg = Cfg(min=10_000, window=3, failure_limit=1, initial_delay=60)
    s = mk([100, 100, 100, 100, 100, 100, 12_800, 12_800, 12_800])  # t = 0..80, first 6 inside delay
    assert decide(cfg, s[:3], now=25, phase_start=0, baseline=None).verdict == "warming_up"
    d = decide(cfg, s, now=81, phase_start=0, baseline=None)
    assert d.verdict == "ok" and d.evidence["samples_considered"] == 3
    assert decide(cfg, s[:8], now=71, phase_start=0, baseline=None).verdict == "inconclusive"


def test_warming_up_by_sample_count():
    cfg = Cfg(min=10_000, window=3, failure_limit=1, initial_delay_samples=2)
    s = mk([1, 1, 12_800, 12_800, 12_800])
    assert decide(cfg, s[:1], now=1, phase_start=0, baseline=None).verdict == "warming_up"
    assert decide(cfg, s[:4], now=31, phase_start=0, baseline=None).verdict == "inconclusive"
    d = decide(cfg, s, now=41, phase_start=0, baseline=None)
    assert d.verdict == "ok" and d.evidence["window"] == [12_800] * 3


def test_samples_before_phase_start_ignored():
    cfg = Cfg(min=10_000, window=3, failure_limit=1)
    s = mk([1, 1, 1]) + mk([12_800] * 3, t0=100)
    assert decide(cfg, s, now=125, phase_start=100, baseline=None).verdict == "ok"


def test_single_bad_window_is_breach_not_rollback():
    cfg = Cfg(min=10_000, window=3, failure_limit=3)
    s = mk([12_800] * 5 + [4_300, 4_300])
    d = decide(cfg, s, now=at_end(s), phase_start=0, baseline=None)
    assert d.verdict == "breach"
    assert d.evidence["consecutive_breaches"] == 1
    assert "1 of 3 consecutive windows" in d.reason


def test_failure_limit_consecutive_is_rollback_with_evidence():
    cfg = Cfg(min=10_000, window=5, failure_limit=3)
    s = mk([12_800] * 10 + [4_300] * 7)
    d = decide(cfg, s, now=at_end(s), phase_start=0, baseline=None)
    assert d.verdict == "rollback"
    assert d.reason == "median 4.3K tok/s of last 5 samples < 10K tok/s (min) for 3 consecutive windows"
    ev = d.evidence
    assert ev["window"] == [4_300.0] * 5 and ev["median"] == 4_300
    assert ev["threshold"] == 10_000 and ev["threshold_source"] == "min"
    assert ev["consecutive_breaches"] == 3 and ev["failure_limit"] == 3
    assert ev["window_medians"] == [4_300] * 3
    assert ev["samples_considered"] == 17 and ev["last_sample_age"] == 1.0 and ev["last_step"] == 16
    json.dumps(ev)
    # a median breaches once 3 of 5 are low: with 4 low samples, 2 windows breach
    d2 = decide(cfg, s[:14], now=at_end(s[:14]), phase_start=0, baseline=None)
    assert d2.verdict == "breach" and d2.evidence["consecutive_breaches"] == 2


def test_recovery_resets_count():
    cfg = Cfg(min=10_000, window=3, failure_limit=3)
    s = mk([4_300] * 6)
    assert decide(cfg, s, now=at_end(s), phase_start=0, baseline=None).verdict == "rollback"
    s += mk([12_800] * 2, t0=s[-1].t + 10)
    d = decide(cfg, s, now=at_end(s), phase_start=0, baseline=None)
    assert d.verdict == "ok" and d.evidence["consecutive_breaches"] == 0
    s += mk([4_300] * 2, t0=s[-1].t + 10)
    assert decide(cfg, s, now=at_end(s), phase_start=0, baseline=None).verdict == "breach"


def test_median_ignores_single_spike():
    cfg = Cfg(min=10_000, window=5, failure_limit=1)
    s = mk([12_800, 12_800, 100, 12_800, 12_800])
    assert decide(cfg, s, now=at_end(s), phase_start=0, baseline=None).verdict == "ok"


def test_stall_is_not_low_throughput():
    cfg = Cfg(min=10_000, window=3, failure_limit=1, no_data_timeout=60, initial_delay=30)
    s = mk([12_800] * 7, t0=30)  # the delay counts from the first sample (t=30): 4 samples count
    d = decide(cfg, s, now=s[-1].t + 61, phase_start=0, baseline=None)
    assert d.verdict == "stall" and "consecutive_breaches" not in d.evidence
    assert d.evidence["no_data_for"] == 61
    assert decide(cfg, s, now=s[-1].t + 59, phase_start=0, baseline=None).verdict == "ok"
    # no samples at all: the clock starts when the initial delay ends
    assert decide(cfg, [], now=80, phase_start=0, baseline=None).verdict == "inconclusive"
    d = decide(cfg, [], now=91, phase_start=0, baseline=None)
    assert d.verdict == "stall" and "initial delay" in d.reason
    # stall wins over low values too
    low = mk([1] * 5, t0=30)
    assert decide(cfg, low, now=low[-1].t + 61, phase_start=0, baseline=None).verdict == "stall"
    # disabled
    off = Cfg(min=10_000, window=3, failure_limit=1, no_data_timeout=None)
    assert decide(off, s, now=1e9, phase_start=0, baseline=None).verdict == "ok"


def test_ratio_absolute_and_both():
    s = mk([9_000] * 5)
    now = at_end(s)
    ratio = Cfg(min_ratio=0.8, window=5, failure_limit=1)
    assert decide(ratio, s, now, 0, baseline=12_800).verdict == "rollback"  # 9K < 10.24K
    assert decide(ratio, s, now, 0, baseline=10_000).verdict == "ok"  # 9K >= 8K
    absolute = Cfg(min=8_000, window=5, failure_limit=1)
    assert decide(absolute, s, now, 0, baseline=12_800).verdict == "ok"
    both = Cfg(min=8_000, min_ratio=0.8, window=5, failure_limit=1)
    d = decide(both, s, now, 0, baseline=12_800)
    assert d.verdict == "rollback" and "min_ratio 0.8 × baseline 12.8K" in d.reason
    assert decide(both, s, now, 0, baseline=None).verdict == "ok"  # only min applies


def test_min_ratio_without_baseline_is_inconclusive():
    cfg = Cfg(min_ratio=0.8, window=3)
    s = mk([1] * 10)
    d = decide(cfg, s, now=at_end(s), phase_start=0, baseline=None)
    assert d.verdict == "inconclusive" and "no baseline" in d.reason


def test_decide_reads_only_the_tail():
    class Spy(list):
        reads = 0

        def __getitem__(self, i):
            if isinstance(i, slice):
                lo, hi, _ = i.indices(len(self))
                self.reads += hi - lo
            else:
                self.reads += 1
            return list.__getitem__(self, i)

    vals = mk([12_800] * 2_000)
    s = Spy(vals[:1000])
    cfg = Cfg(min=10_000, window=5, failure_limit=3, initial_delay=5)
    memo: dict = {}
    assert decide(cfg, s, now=at_end(s), phase_start=0, baseline=None, memo=memo).verdict == "ok"
    reads = []
    for smp in vals[1000:]:  # as the supervisor asks: one more sample, the same memo
        list.append(s, smp)
        s.reads = 0
        assert decide(cfg, s, now=smp.t, phase_start=0, baseline=None, memo=memo).verdict == "ok"
        reads.append(s.reads)
    assert max(reads) <= 6  # each sample is taken once: a call reads the new one, not the window nor the run


def test_known_good():
    cfg = Cfg(min_ratio=0.8, window=3, good_after=100, initial_delay=20)
    s = mk([100] * 2 + [12_800] * 15)  # t 0..160; first counted at t=20
    assert known_good(cfg, s, now=100, phase_start=0, baseline=None) is None  # too early
    # no sample reaches t=120 yet
    assert known_good(cfg, s[:12], now=200, phase_start=0, baseline=None) is None
    assert known_good(cfg, s, now=200, phase_start=0, baseline=None) == 12_800  # first baseline
    assert known_good(cfg, s, now=200, phase_start=0, baseline=12_800) == 12_800
    # a breaching window inside the span spoils it, even with a good tail
    bad = mk([12_800] * 5 + [4_000] * 3 + [12_800] * 10)
    assert known_good(Cfg(min=10_000, window=3, good_after=100), bad, 300, 0, None) is None
    # ... but one outside the span (after it) does not
    late = mk([12_800] * 12 + [4_000] * 3)
    assert known_good(Cfg(min=10_000, window=3, good_after=100), late, 300, 0, None) == 12_800
    # a gap longer than no_data_timeout inside the span
    gap = mk([12_800] * 3) + mk([12_800] * 10, t0=100)
    cfg2 = Cfg(min=10_000, window=3, good_after=100, no_data_timeout=60)
    assert known_good(cfg2, gap, 300, 0, None) is None


def test_config_validation():
    with pytest.raises(ValueError):
        Cfg(window=0)
    with pytest.raises(ValueError):
        Cfg(min_ratio=0)
    with pytest.raises(ValueError):
        Cfg(initial_delay=-1)


def test_decision_is_frozen():
    d = Decision("ok", "x", {})
    with pytest.raises(Exception):
        d.verdict = "rollback"


def test_a_long_run_keeps_what_its_window_holds_not_its_history():
    """Issue 38 row 9: a judge whose cost and memory follow the window, not the run's age."""
    cfg = Cfg(min=10_000, window="10s", failure_limit="20s", good_after=15)
    memo: dict = {}
    s: list = []
    for i in range(200_000):  # 200,000 samples at 10 Hz: 5.5 hours
        s.append(Sample(i / 10, 12_800.0, i))
        d = decide(cfg, s, s[-1].t, 0.0, None, (), memo)
        if i == 200:
            assert known_good(cfg, s, s[-1].t, 0.0, None, (), memo) == 12_800.0
        if len(s) > 50_000:
            del s[:25_000]  # as the supervisor trims its list
    assert d.verdict == "ok"
    assert len(memo["tail"].at_t) <= 70_000
