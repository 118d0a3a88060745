"""The pure core of `gpujob bisect` / `tune` (gpujob/agent/judge/bisect.py): the difference of
two profiles, the search over it (one culprit, a pair slow only together, subsets that do
not resolve), and one trial's verdict with the judge's own statistics."""

from __future__ import annotations

import itertools
import math

import pytest

from gpujob.agent.judge.policy import PolicyConfig
from gpujob.agent.judge import bisect as bc
from gpujob.agent.judge.bisect import OK, SLOW, UNRESOLVED


def run(n: int, oracle) -> tuple:
    """Drive the search with ``oracle(subset) -> verdict``; (answer, subsets asked)."""
    gen = bc.search(n)
    asked = []
    try:
        s = next(gen)
        while True:
            asked.append(s)
            s = gen.send(oracle(s))
    except StopIteration as stop:
        return stop.value, asked


def slow_if(*culprits):
    """Slow when every index of one of the culprit sets is applied."""
    return lambda s: SLOW if any(set(c) <= s for c in culprits) else OK


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 13, 16, 20])
def test_one_culprit_is_found_within_log2_n_plus_2_trials(n):
    for culprit in range(n):
        answer, asked = run(n, slow_if([culprit]))
        assert answer.culprit == (culprit,)
        assert len(set(asked)) == len(asked)  # no set tried twice
        assert len(asked) + 1 <= bc.single_bound(n), (n, culprit, asked)  # +1: the good profile


@pytest.mark.parametrize("n", [2, 3, 5, 8, 10])
def test_a_pair_slow_only_together_is_found(n):
    worst = 0
    for pair in itertools.combinations(range(n), 2):
        answer, asked = run(n, slow_if(pair))
        assert answer.culprit == pair, (n, pair, asked)
        assert len(set(asked)) == len(asked)
        worst = max(worst, len(asked) + 1)
    assert worst <= 2 * math.ceil(math.log2(n)) + 4, worst  # two prefix searches and their checks


def test_either_of_two_culprits_names_one_and_a_bad_set_that_is_not_slow_names_none():
    answer, _ = run(6, slow_if([1], [4]))
    assert answer.culprit in ((1,), (4,))
    answer, asked = run(6, lambda s: OK)
    assert answer.culprit == () and frozenset(range(6)) in asked


def test_a_subset_that_does_not_resolve_is_merged_with_its_neighbour():
    # change 2 needs change 3 (torch needs its triton): any set with 2 but not 3 fails to resolve
    def oracle(s):
        if 2 in s and 3 not in s:
            return UNRESOLVED
        return SLOW if 2 in s else OK
    answer, asked = run(5, oracle)
    assert answer.culprit == (2, 3) and answer.merged == ((2, 3),)
    assert len(set(asked)) == len(asked)
    unresolved = [s for s in asked if 2 in s and 3 not in s]
    # once in the search, then the two move together; once more when the answer is shrunk ({2} alone)
    assert unresolved == [frozenset({0, 1, 2}), frozenset({2})]
    groups = [(bc.Change("package", n, "1", "2"),) for n in "abcde"]
    assert bc.describe(bc.culprit_groups(groups, answer)) == "c 1 -> 2 (moves with d 1 -> 2)"


def test_a_merge_that_took_in_a_harmless_neighbour_is_shrunk():
    # 1 needs 3 (1 without 3 does not resolve), 1 is slow: the blind merge takes 2 in on its way to 3
    def oracle(s):
        if 1 in s and 3 not in s:
            return UNRESOLVED
        return SLOW if 1 in s else OK
    answer, asked = run(5, oracle)
    assert answer.culprit == (1, 3) and answer.merged == ((1, 3),), asked
    assert len(set(asked)) == len(asked)


def test_one_group_that_never_resolves_ends_with_no_answer():
    answer, asked = run(1, lambda s: UNRESOLVED)
    assert answer.culprit == () and asked == [frozenset({0})]


GOOD = {"packages": ["torch==2.10.0", "triton==3.5.1", "numpy==2.1.0", "old-thing==1.0"],
        "env": {"A": "1"}}
BAD = {"packages": ["torch==2.11.0", "Triton==3.6.0", "numpy==2.1.0", "new-thing==0.3"],
       "env": {"A": "1", "TORCHDYNAMO_DISABLE": "1"}}


def test_difference_changed_added_removed_env_and_groups():
    g, b = bc.resolved(GOOD), bc.resolved(BAD)
    groups = bc.difference(g, b)
    assert [bc.describe([x]) for x in groups] == [
        "new-thing (none) -> 0.3", "old-thing 1.0 -> (none)", "torch 2.10.0 -> 2.11.0",
        "triton 3.5.1 -> 3.6.0", "env TORCHDYNAMO_DISABLE (none) -> 1"]
    tied = bc.difference(g, b, together=[{"triton", "torch"}])
    assert len(tied) == 4
    assert bc.describe([tied[2]]) == "torch 2.10.0 -> 2.11.0 (moves with triton 3.5.1 -> 3.6.0)"
    whole = bc.apply(g, groups)
    assert whole == b
    assert bc.pins(bc.apply(g, [groups[3]])) == ["numpy==2.1.0", "old-thing==1.0", "torch==2.10.0",
                                                   "triton==3.6.0"]
    assert bc.difference(g, g) == []


def test_what_the_venv_holds_wins_over_the_pins():
    res = bc.resolved({"packages": ["torch==2.10.0"]}, holds={"torch": "2.10.0+cu130", "nvidia-nccl": "2.27"})
    assert res["packages"] == {"torch": "2.10.0+cu130", "nvidia-nccl": "2.27"}


CFG = PolicyConfig(min=1.0, initial_delay=2.0, settle_samples=3, settle_tolerance=0.1, min_samples=3)


def samples(rates, dt=1.0):
    return [(i * dt, r) for i, r in enumerate(rates)]


@pytest.mark.parametrize("rates, want", [
    ([], None),                                   # nothing yet
    ([100, 100], None),                           # still in the initial delay
    ([10, 50, 100, 100, 101, 99, 100], 100),      # the ramp left out by delay and settle
    ([10, 50, 100, 30, 100, 101, 99, 100, 98], 100),
])
def test_steady_leaves_out_warmup_and_settle(rates, want):
    st = bc.steady(samples(rates), CFG)
    assert (st.median if st else None) == want


@pytest.mark.parametrize("good, trial, want", [
    ([100] * 3 + [100, 101, 99, 100, 100], [10] + [63, 64, 62, 63, 63, 63], SLOW),
    ([100] * 3 + [100, 101, 99, 100, 100], [10] + [97, 98, 96, 97, 98, 97], OK),     # 3% off: not slow
    ([100, 100, 100, 60, 140, 60, 140, 100], [10] + [85, 86, 85, 84, 85, 85], "unclear"),  # within spread
])
def test_verdict_against_the_good_rate(good, trial, want):
    cfg = PolicyConfig(min=1.0, initial_delay=0.0, settle_samples=0, min_samples=3)
    g, t = bc.steady(samples(good), cfg), bc.steady(samples(trial), cfg)
    got, ratio = bc.verdict(t, g, slower=0.9)
    assert got == want
    assert ratio == pytest.approx(t.median / g.median)


def test_enough_once_the_median_is_known_well_within_the_gap():
    cfg = PolicyConfig(min=1.0, initial_delay=0.0, settle_samples=0, min_samples=3)
    assert not bc.enough(bc.steady(samples([100, 100, 100]), cfg), 0.9)  # too few
    assert bc.enough(bc.steady(samples([100, 101, 99, 100, 100, 101]), cfg), 0.9)
    noisy = [100, 50, 150, 60, 140, 100]
    assert not bc.enough(bc.steady(samples(noisy), cfg), 0.9)


def test_rank_fastest_first_with_margin_and_the_unmeasured_last():
    s = lambda m: bc.Steady(m, 1.0, 10, 0.0, 10.0)  # noqa: E731
    order = bc.rank({"a": s(80.0), "b": s(100.0), "c": None, "d": s(50.0)})
    assert [n for n, _, _ in order] == ["b", "a", "d", "c"]
    assert order[0][2] == pytest.approx(1.25) and order[3][2] is None


# ---- the trial's spec (gpujob/ops/bisect.py): nothing of the job's is reused but its venvs ----

def test_a_trials_spec_has_its_own_name_workdir_and_no_rollback_and_reuses_the_jobs_venv(tmp_path):
    import yaml
    from gpujob.ops import bisect as ops
    from gpujob.spec.model import load_spec
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        "name": "a-rather-long-job-name-of-forty-chars-x", "target": "box", "workdir": "/data/run",
        "profiles": [{"name": "old", "index_url": "https://i/simple", "packages": ["torch==2.10.0"]},
                     {"name": "new", "index_url": "https://j/simple", "packages": ["torch==2.11.0"],
                      "env": {"X": "1"}}],
        "train": {"command": "python t.py", "resume_args": ["--resume"], "standby": {"preload": ["torch"]}},
        "throughput": {"format": "ktok", "min": "1K", "good_after": "1m"},
        "rollback": {"fallback": ["old"]}, "resume_after_reboot": True,
        "notify": [{"url": "https://hooks.example/x"}]}))
    spec = load_spec(path)
    good, bad = spec.profile_by_name("old"), spec.profile_by_name("new")
    t = ops.trial_spec(spec, good, 60.0)
    assert t.name == "a-rather-long-job-name-of-forty-c-bisect" and len(t.name) <= 40
    assert t.workdir is None and t.profile == "old" and [p.name for p in t.profiles] == ["old"]
    assert not t.rollback.enabled and t.rollback.fallback == [] and not t.resume_after_reboot
    assert t.notify == [] and t.metrics is None and t.train.standby is None
    assert t.train.timeout == 75.0 and t.throughput.good_after == ops.YEAR
    assert t.env_key("old") == spec.env_key("old")  # the job's own venv: no install
    assert spec.name == "a-rather-long-job-name-of-forty-chars-x" and spec.rollback.enabled  # not changed
    res = bc.apply(bc.resolved(good.model_dump()), bc.difference(bc.resolved(good.model_dump()),
                                                                 bc.resolved(bad.model_dump())))
    mid = ops.trial_profile(good, bad, res, ops.set_name(res))
    assert mid.packages == ["torch==2.11.0"] and mid.env == {"X": "1"}
    assert mid.index_url == "https://j/simple" and mid.extra_index_urls == ["https://i/simple"]
    assert ops.set_name(res) == ops.set_name(dict(res))  # named by content: the same set, the same venv
    assert ops.trial_spec(spec, mid).env_key(mid.name) == ops.trial_spec(spec, mid).env_key(mid.name)
