"""Lightning judged at its current rate (issue 38 item 2): its bar draws with ``smoothing=0``
(the it/s is the run's average), counts restored steps in ``n`` and draws each step twice.
The ``lightning`` recipe reads ``tqdm_steps``: the bar's own step counter over the lines'
times (agent/judge/steprate.StepRate). Tested on real Lightning output: the H200 runs in
tests/data/traces (Lightning 2.6.6, act 2: a slow profile, then the resumed known-good one)
and tests/data/lightning (recorded on the CPU, see its README)."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from gpujob.agent.base import trace
from gpujob.agent.judge import throughput
from gpujob.agent.judge.sources import line_source
from gpujob.agent.judge.steprate import StepRate

DATA = Path(__file__).parents[1] / "data"
TPS = 16384.0
_N = re.compile(r"\| *(\d+)/(?:\d+|\?) \[")


def _runs(path: Path) -> list:
    """[(profile, resume, [(t, line)])] of the train runs of a trace."""
    out: list = []
    for r in trace.read_records(str(path)):
        if "run" in r:
            run = r["run"] or {}
            out.append((run.get("profile"), bool(run.get("resume")), [], run.get("phase")))
        elif "out" in r and out:
            out[-1][2].append((r["t"], r["out"]))
    return [(p, res, lines) for p, res, lines, phase in out if phase == "train"]


def _samples(fmt: str, lines) -> list:
    src = line_source({"format": fmt, "tokens_per_step": TPS, "ranks": "first"})
    got = []
    for t, line in lines:
        s = src.from_line(line, t)
        if s is not None:
            got.append((t, s[0] / TPS))
    return got


def _counter_rate(lines) -> float:
    """What the bar's own counter says: steps per second from its second move to its last."""
    pts = [(t, int(m.group(1))) for t, line in lines for m in [_N.search(line)] if m]
    moves = [p for a, p in zip(pts, pts[1:]) if p[1] > a[1]]
    (t0, n0), (t1, n1) = moves[1], moves[-1]
    return (n1 - n0) / (t1 - t0)


def test_the_resumed_run_is_read_at_its_rate_not_its_restored_steps():
    [(slow, _, slow_lines), (good, resumed, lines)] = _runs(
        DATA / "traces" / "gpujob_h200_1204_lightning_act2.jsonl.gz")
    assert (slow, good, resumed) == ("broken", "compiled", True)
    truth = _counter_rate(lines)
    old = _samples("tqdm", lines)
    new = _samples("tqdm_steps", lines)
    # the it/s the bar prints starts at 92.8 (200 restored steps in its first 2 s) and falls slowly
    assert old[0][1] > 1.5 * truth
    assert abs(statistics.median(v for _, v in new[:5]) - truth) < 0.2 * truth, (new[:5], truth)
    assert abs(statistics.median(v for _, v in new) - truth) < 0.1 * truth
    # "recovered" as the counter says: the resumed run against the slow one
    ratio_new = statistics.median(v for _, v in new) / statistics.median(v for _, v in _samples("tqdm_steps",
                                                                                                slow_lines))
    ratio_truth = truth / _counter_rate(slow_lines)
    assert abs(ratio_new / ratio_truth - 1) < 0.05, (ratio_new, ratio_truth)


def test_each_step_counts_once_and_samples_follow_time_not_lines():
    [(_, _, lines)] = _runs(DATA / "traces" / "gpujob_h200_1204_lightning_act1.jsonl.gz")
    bar = [x for x in lines if _N.search(x[1])]
    new = _samples("tqdm_steps", lines)
    span = lines[-1][0] - lines[0][0]
    assert len(bar) > 2000 and len(new) <= span / StepRate.SPAN + 2  # ~2 a second, not 70
    assert len(_samples("tqdm", lines)) > 2000  # the it/s read per line: every step twice


def _bar(n: int, elapsed: float, initial: int = 0) -> str:
    """A line as Lightning's TQDMProgressBar draws it (smoothing=0: n / elapsed)."""
    rate = n / elapsed if elapsed else 0.0
    return f"Epoch 0:   0%|          | {n}/1000000 " \
           f"[{int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}<99:00:00, {rate:.2f}it/s, v_num=0, loss=3.210]"


def test_a_fall_after_an_hour_is_seen_at_once_not_twenty_minutes_later():
    lines, t, n = [], 1000.0, 0
    for _ in range(3600 * 65):  # an hour at 65 it/s
        n += 1
        t += 1 / 65
        if n % 65 == 0:
            lines.append((t, _bar(n, t - 1000.0)))
    fall = t
    for _ in range(13 * 60):  # then 13 it/s for a minute
        n += 1
        t += 1 / 13
        lines.append((t, _bar(n, t - 1000.0)))
    after = [v for ts, v in _samples("tqdm_steps", lines) if ts > fall + 2]
    assert after and all(abs(v - 13) < 2 for v in after)
    avg = [v for ts, v in _samples("tqdm", lines) if ts > fall + 2]
    assert min(avg) > 0.8 * 65  # the bar's own it/s: still above 0.8x a minute into the fall


def test_other_bars_and_lines_give_no_sample():
    p = throughput.make_parser("tqdm_steps", tokens_per_step=TPS)
    for line in ("Validation DataLoader 0: 100%|##########| 5/5 [00:00<00:00, 40.01it/s]",
                 "Training: |          | 0/? [00:00<?, ?it/s]", "step 12 | loss 3.2"):
        assert p(line, 1.0) is None
    assert p("Epoch 0:   0%|          | 5/625000 [00:01<66:54:44,  2.59it/s]") is None  # no time, no rate


def test_the_lightning_recipe_reads_the_step_counter():
    from gpujob.spec.recipes import lightning
    frag = lightning.derive({"train": {"command": "python train.py fit"},
                             "throughput": {"tokens_per_step": 1}})
    assert frag["throughput"] == {"format": "tqdm_steps"}


def test_real_lightning_on_the_cpu_resumed_from_600_steps():
    """tests/data/lightning: real Lightning 2.6.6 output through a pipe, a fit and a resume
    from step 600 (its bar's first it/s: 21,974)."""
    [(_, _, fit)] = _runs(DATA / "lightning" / "cpu_fit.jsonl.gz")
    [(_, resumed, lines)] = _runs(DATA / "lightning" / "cpu_resume.jsonl.gz")
    assert resumed
    truth_fit, truth = _counter_rate(fit), _counter_rate(lines)
    old, new = _samples("tqdm", lines), _samples("tqdm_steps", lines)
    assert old[0][1] > 10 * truth  # the restored steps in the bar's it/s
    assert (max(v for _, v in new) < 1.5 * truth
            and abs(statistics.median(v for _, v in new) - truth) < 0.1 * truth)
    assert abs(statistics.median(v for _, v in _samples("tqdm_steps", fit)) - truth_fit) < 0.1 * truth_fit
    # each step drawn twice, counted once: samples by time, not by line
    assert len([1 for _, x in lines if _N.search(x)]) > 1000 and len(new) < 40
