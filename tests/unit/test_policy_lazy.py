"""``policy.decide`` builds a decision's reason and evidence when they are first read
(agent/judge/reasons.py). Over every recorded real trace (tests/data/traces/), the
decisions read late — after the whole trace was judged, the samples list grown, the
memo and the pauses moved on — are the same verdicts, reasons and evidence as the ones
built at once (``reasons.EAGER``), and the replay's output is the same either way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpujob.agent.base import trace
from gpujob.agent.judge import policy, reasons, replay
from gpujob.agent.judge.reasons import Decision

TRACES = Path(__file__).parents[1] / "data" / "traces"
FORMATS = {  # as tests/unit/test_real_traces.py replays the recordings without a spec of their own
    "hf_trainer": {"format": "tqdm", "tokens_per_step": 16384},
    "nanogpt": {"format": "regex", "tokens_per_step": 16384,
                "pattern": r"^iter (?P<step>\d+): loss [0-9.]+, time (?P<ms>[0-9.]+)ms"},
    "dflash_mini": {"format": "ktok"},
}
POLICY = {"window": "10s", "failure_limit": "20s", "min_ratio": 0.5, "good_after": 20.0, "pause_tail": 1.0}
# act 1's known-good baselines, as tests/unit/test_real_traces.py replays the supervisors' traces
GPU_ACT2 = {
    "gpujob_hf_act2": 313262.08, "gpujob_nanogpt_act2": 1299286.28, "gpujob_nanogpt_act2_kept": 1234664.66,
    "gpujob_lightning_act2": 719421.44, "gpujob_specforge_act2": 8166.84, "gpujob_torchtitan_act2": 217443.0,
    "gpujob_dflash_mini_act2": 910000.0,
}


def _cases() -> list:
    out = []
    for path in sorted(TRACES.glob("*.jsonl.gz")):
        name = path.name[:-len(".jsonl.gz")]
        spec_file = TRACES / f"{name}.spec.json"
        if spec_file.exists():
            out.append((name, json.loads(spec_file.read_text()), GPU_ACT2.get(name)))
            continue
        for prefix, fmt in FORMATS.items():
            if name.startswith(prefix):
                out.append((name, {"throughput": dict(fmt, **POLICY)}, 1000.0))  # a baseline: windows judged
                out.append((name + "+count",
                            {"throughput": {**fmt, **POLICY, "window": 3, "failure_limit": 2}}, None))
    return out


CASES = _cases()


def _judged(monkeypatch, name: str, spec: dict, baseline, eager: bool) -> tuple:
    """(every Decision decide returned, the replay's output) over one trace."""
    monkeypatch.setattr(reasons, "EAGER", eager)
    made: list = []
    real = policy.decide

    def spy(*a, **kw):
        d = real(*a, **kw)
        made.append(d)
        return d

    monkeypatch.setattr(policy, "decide", spy)
    records = trace.read_records(str(TRACES / f"{name.split('+')[0]}.jsonl.gz"))
    out = replay.replay_records(records, spec, baseline=baseline)
    monkeypatch.setattr(policy, "decide", real)
    return made, out


def test_the_cases_cover_the_recordings():
    assert len({c[0].split("+")[0] for c in CASES}) >= 20
    assert {c[0] for c in CASES if c[0].startswith("gpujob_")} >= {"gpujob_hf_act2", "gpujob_nanogpt_act2"}


@pytest.mark.parametrize("name, spec, baseline", CASES, ids=[c[0] for c in CASES])
def test_lazy_reasons_equal_eager_ones(monkeypatch, name, spec, baseline):
    lazy, out_lazy = _judged(monkeypatch, name, spec, baseline, eager=False)
    eager, out_eager = _judged(monkeypatch, name, spec, baseline, eager=True)
    assert out_lazy == out_eager
    assert len(lazy) == len(eager) > 0
    medians = [d.median for d in lazy]  # asked before anything is built
    unread = [d for d in lazy if d._reason is None]
    assert len(unread) > len(lazy) // 2  # most were never read during the replay: built only now
    assert all(d.built for d in eager)
    assert medians == [d.evidence.get("median") for d in eager]
    assert any(m is not None for m in medians) or baseline is None
    for a, b in zip(lazy, eager):  # read late: after every later sample was judged
        assert (a.verdict, a.reason, a.evidence) == (b.verdict, b.reason, b.evidence)
        assert json.dumps(a.evidence, sort_keys=True) == json.dumps(b.evidence, sort_keys=True)
    seen = {str(d.verdict) for d in eager}
    assert "ok" in seen or baseline is None, seen
    assert "rollback" in seen or name not in GPU_ACT2, seen  # each act 2 rolled back


def test_a_decision_reads_as_the_frozen_dataclass_did():
    d = Decision("ok", "x", {"median": 1.0})
    assert (d.verdict, d.reason, d.evidence) == ("ok", "x", {"median": 1.0})
    assert d == Decision("ok", "x", {"median": 1.0}) and d != Decision("ok", "y", {"median": 1.0})
    assert repr(d) == "Decision(verdict='ok', reason='x', evidence={'median': 1.0})"
    assert Decision("ok").evidence == {} and Decision("ok").reason == ""
    calls = []
    lazy = Decision("breach", make=(lambda a: calls.append(("r", a)) or f"r{a}",
                                    lambda a: calls.append(("e", a)) or {"a": a}, 7))
    assert calls == [] and not lazy.built
    assert lazy.reason == "r7" and calls == [("r", 7)]  # each on its own first read
    assert lazy.evidence == {"a": 7} and lazy.reason == "r7" and calls == [("r", 7), ("e", 7)]  # then kept
    assert lazy.evidence is lazy.evidence and lazy.built
    with pytest.raises(AttributeError):
        lazy.verdict = "ok"
