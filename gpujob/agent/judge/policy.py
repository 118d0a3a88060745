"""The rollback policy over throughput samples (stdlib only, Python >= 3.9, pure:
no I/O and no clock reads, callers pass ``now``). Modelled on Argo Rollouts'
analysis runs: an initial delay, a sliding window (median of the last N samples),
and a failure limit of consecutive breaching windows before acting."""

from __future__ import annotations

import sys
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, fields
from functools import cached_property
from operator import attrgetter
from typing import List, Optional, Sequence, Tuple, Union

from gpujob.agent.base.defaults import DEFAULTS
from gpujob.agent.judge import reasons
from gpujob.agent.judge.tail import EDGE, Tail
from gpujob.agent.base.protocol import Verdict
from gpujob.agent.judge.reasons import Decision
from gpujob.agent.judge.throughput import fmt_rate

__all__ = ["Decision", "PolicyConfig", "Sample", "decide", "known_good", "span", "threshold"]

@dataclass(frozen=True)
class Sample:
    t: float
    value: float
    step: Optional[int] = None


_TP = DEFAULTS["throughput"]


def span(value):
    """A window / failure_limit as the spec writes it into job.json: an int is a
    count (samples, windows), a string ``"30s"`` a duration. ``(count, seconds)``."""
    if isinstance(value, str):
        unit = {"s": 1.0, "m": 60.0, "h": 3600.0}[value[-1]]
        return None, float(value[:-1]) * unit
    return int(value), None


@dataclass(frozen=True)
class PolicyConfig:
    """Throughput policy.

    ``initial_delay_samples`` counts *samples*, not trainer steps: step
    counters restart or jump on resume from a checkpoint, while the warm-up
    (compilation, cache fill) happens on every start.  ``no_data_timeout``
    None disables stall detection.  ``window`` / ``failure_limit`` are a count
    (int) or a duration (``"30s"``, see :func:`span`); ``settle_samples`` 0
    turns the settle rule off.
    """

    # defaults: the spec's throughput section (gpujob/spec/model.py, via spec_defaults.json)
    min: Optional[float] = _TP["min"]  # absolute tok/s
    min_ratio: Optional[float] = _TP["min_ratio"]  # of baseline
    window: Union[int, str] = _TP["window"]  # median of the last N samples, or of the last "Ts"
    failure_limit: Union[int, str] = _TP["failure_limit"]  # breaching windows in a row, or "Ts" of breach
    initial_delay: float = _TP["initial_delay"]  # seconds after the first sample: samples ignored
    initial_delay_samples: int = _TP["initial_delay_samples"]  # then ignore the next K samples too
    no_data_timeout: Optional[float] = _TP["no_data_timeout"]  # no sample for that long = stall
    good_after: float = _TP["good_after"]  # held above threshold this long = known-good
    min_samples: int = _TP["min_samples"]  # a time window with fewer is inconclusive
    settle_samples: int = _TP["settle"]["samples"]  # N samples in a row ...
    settle_tolerance: float = _TP["settle"]["tolerance"]  # ... within this fraction of their median
    settle_timeout: float = _TP["settle"]["timeout"]  # or judged anyway after this long

    @classmethod
    def from_spec(cls, tp: dict) -> "PolicyConfig":
        """From the spec's throughput section (completed by defaults.section)."""
        names = {f.name for f in fields(cls)}
        kw = {k: tp[k] for k in names if k in tp}
        settle = tp.get("settle")
        if settle is None and "settle" in tp:
            kw["settle_samples"] = 0
        elif settle:
            full = {**_TP["settle"], **settle}
            kw.update(settle_samples=full["samples"], settle_tolerance=full["tolerance"],
                      settle_timeout=full["timeout"])
        return cls(**kw)

    # read on every decision: worked out once (cached_property fills a frozen instance's __dict__)
    window_n = cached_property(lambda self: span(self.window)[0])  # a count window, else None
    window_s = cached_property(lambda self: span(self.window)[1])  # a time window (seconds), else None
    limit_n = cached_property(lambda self: span(self.failure_limit)[0])
    limit_s = cached_property(lambda self: span(self.failure_limit)[1])

    @cached_property
    def thresholds(self) -> dict:
        """threshold()'s answers by baseline."""
        return {}

    def needed_span(self) -> Optional[float]:
        """Seconds (active time) a breach must last before a rollback, None when the
        limit is a count of count-windows (today's rule: K windows in a row)."""
        if self.limit_s is not None:
            return self.limit_s
        if self.window_s is not None:  # K back-to-back time windows
            return (self.limit_n - 1) * self.window_s
        return None

    def __post_init__(self) -> None:
        wn, ws = span(self.window)
        ln, ls = span(self.failure_limit)
        if (wn is not None and wn < 1) or (ln is not None and ln < 1) or \
                (ws is not None and ws <= 0) or (ls is not None and ls < 0):
            raise ValueError("window and failure_limit must be >= 1 (or a duration > 0)")
        if self.initial_delay < 0 or self.initial_delay_samples < 0 or self.good_after < 0:
            raise ValueError("initial_delay, initial_delay_samples and good_after must be >= 0")
        if self.min is not None and self.min < 0:
            raise ValueError("min must be >= 0")
        if self.min_ratio is not None and self.min_ratio <= 0:
            raise ValueError("min_ratio must be > 0")
        if self.no_data_timeout is not None and self.no_data_timeout <= 0:
            raise ValueError("no_data_timeout must be > 0 (or None to disable)")
        if self.min_samples < 1 or self.settle_samples < 0 or not 0 < self.settle_tolerance < 1 \
                or self.settle_timeout <= 0:
            raise ValueError("min_samples >= 1, settle.samples >= 0, 0 < settle.tolerance < 1, "
                             "settle.timeout > 0")


def threshold(cfg: PolicyConfig, baseline: Optional[float]) -> Tuple[Optional[float], str]:
    """``(threshold, source)``: the larger of ``min`` and ``min_ratio × baseline``.

    With only ``min_ratio`` and no baseline yet → ``(None, 'no baseline yet …')``;
    with nothing configured → ``(None, 'no threshold configured')``.
    """
    known = cfg.thresholds.get(baseline)  # asked on every decision: a pure function of both
    if known is None and len(cfg.thresholds) < 64:
        known = cfg.thresholds[baseline] = _threshold(cfg, baseline)
    return known or _threshold(cfg, baseline)


def _threshold(cfg: PolicyConfig, baseline: Optional[float]) -> Tuple[Optional[float], str]:
    cands: List[Tuple[float, str]] = []
    if cfg.min is not None:
        cands.append((float(cfg.min), "min"))
    if cfg.min_ratio is not None and baseline is not None and baseline > 0:
        cands.append((cfg.min_ratio * baseline,
                      f"min_ratio {cfg.min_ratio:g} × baseline {fmt_rate(baseline)}"))
    if cands:
        return max(cands, key=lambda c: c[0])
    if cfg.min_ratio is not None:
        return None, f"no baseline yet for min_ratio {cfg.min_ratio:g}"
    return None, "no threshold configured"


_T = attrgetter("t")


def _first_at_or_after(samples: Sequence[Sample], t: float, lo: int = 0) -> int:
    """Index of the first sample with ``.t >= t`` (samples are in time order)."""
    if lo < len(samples) and samples[lo].t >= t:  # the run's first sample, usually: no search
        return lo
    if sys.version_info < (3, 10):  # no key= before 3.10: a list of the times
        return bisect_left([s.t for s in samples], t, lo)
    return bisect_left(samples, t, lo, key=_T)  # (C, each decision searches twice)


def _tail(cfg: PolicyConfig, samples: Sequence[Sample], phase_start: float, pauses, memo, thr) -> Tail:
    """The run's incremental judging state (agent/judge/tail.py), brought up to the samples:
    kept in ``memo`` across calls (each sample taken once), built afresh without one."""
    tail = memo.get("tail") if memo is not None else None
    if tail is None or tail.cfg is not cfg or tail.phase_start != phase_start:
        tail = Tail(cfg, phase_start)
        if memo is not None:
            memo["tail"] = tail
    tail.sync(samples, pauses, thr)
    return tail


def _before_judging(cfg: PolicyConfig, tail: Tail, now: float) -> Tuple[str, object]:
    """(verdict, reason) while judging has not started (the delays, the settle rule)."""
    delay_end = (tail.first_t or now) + cfg.initial_delay
    if now < delay_end:
        return Verdict.WARMING_UP, f"initial delay: {delay_end - now:.0f}s of {cfg.initial_delay:g}s left " \
                                   "(counted from the first sample)"
    skip, n = cfg.initial_delay_samples, cfg.settle_samples
    if tail.seen < skip:
        return Verdict.WARMING_UP, (f"ignoring the first {skip} samples after the initial delay "
                                    f"({tail.seen} so far)")
    if n == 0 or tail.seen == skip:
        return Verdict.WARMING_UP, "waiting for samples after the initial delay"
    return Verdict.SETTLING, (f"rate not settled yet: waiting for {n} samples within "
                              f"{cfg.settle_tolerance:.0%} of their median (at most {cfg.settle_timeout:g}s)")


def decide(
    cfg: PolicyConfig,
    samples: Sequence[Sample],
    now: float,
    phase_start: float,
    baseline: Optional[float],
    pauses: Sequence[Tuple[float, float]] = (),
    memo: Optional[dict] = None,
) -> Decision:
    """Evaluate the policy at ``now``.

    Samples before ``phase_start`` are not this run's. Samples inside ``pauses``
    (checkpoint saves, evals, their recovery tail) are left out, and pause time
    is not counted in any duration (windows, failure_limit, settle timeout).
    In order:

    1. ``warming_up`` before the first sample (``stall`` once ``no_data_timeout``
       passed after ``phase_start + initial_delay``);
    2. ``paused`` while ``now`` is inside a pause;
    3. ``warming_up`` while ``now`` is inside the initial delay, counted from the
       run's FIRST sample, then while the next ``initial_delay_samples`` are skipped;
    4. ``stall`` when no sample arrived for more than ``no_data_timeout`` (from the
       last sample or the end of the last pause);
    5. ``settling`` until ``settle_samples`` samples in a row lie within
       ``settle_tolerance`` of their median (or ``settle_timeout`` passed): judging
       starts at the first of them, so a running average's climb is never judged;
    6. ``inconclusive`` with no threshold, no window yet (a time window is judged once
       it spans a quarter of its length), or fewer than ``min_samples`` in it;
    7. otherwise the window ending at each sample is judged once (median <
       threshold = breaching): ``rollback`` once the breach in a row reached
       ``failure_limit`` (K windows in a row for a count; for a duration, its
       evidence: agent/judge/tail.py, a deep breach sooner), else ``breach``, else ``ok``.

    With ``memo`` kept across calls each sample is taken once (amortised O(log w)).
    """
    n = len(samples)
    last = samples[-1] if n and samples[-1].t >= phase_start else None
    thr, src = threshold(cfg, baseline)
    ctx = (cfg, thr, src, baseline, now, last)  # the evidence's, built when read (agent/judge/reasons.py)
    tail = _tail(cfg, samples, phase_start, pauses, memo, thr) if last is not None else None
    spans = tail.paused.spans if tail is not None else list(pauses)
    i = bisect_right(spans, (now, float("inf")))
    last_pause_end = max((b for a, b in spans[max(0, i - 2):i] if b <= now), default=None)
    if last is None:
        ref = max(phase_start + cfg.initial_delay, last_pause_end or 0)
        quiet = now - ref
        if cfg.no_data_timeout is not None and quiet > cfg.no_data_timeout:
            return Decision(Verdict.STALL, make=(*reasons.STALL, ctx, quiet, "the initial delay ended"))
        if now < phase_start + cfg.initial_delay:
            return Decision(Verdict.WARMING_UP,
                            make=(*reasons.PLAIN, ctx, "waiting for the first sample (initial delay)"))
        return Decision(Verdict.INCONCLUSIVE, make=(*reasons.PLAIN, ctx, "no throughput sample yet"))
    assert tail is not None
    if i > 0 and now < spans[i - 1][1]:
        return Decision(Verdict.PAUSED, make=(*reasons.PAUSED, ctx, spans[i - 1]))
    ref = max(last.t, (tail.first_t or last.t) + cfg.initial_delay, last_pause_end or 0)
    quiet = now - ref
    started = tail.t0 is not None
    what, why = ("judge", None) if started else _before_judging(cfg, tail, now)
    if what != Verdict.WARMING_UP and cfg.no_data_timeout is not None and quiet > cfg.no_data_timeout:
        return Decision(Verdict.STALL, make=(*reasons.STALL, ctx, quiet, "the last sample"))
    if not started:
        return Decision(what, make=(*reasons.PLAIN, ctx, why))
    return _windows(cfg, tail, thr, ctx)


def _windows(cfg, tail: Tail, thr, ctx) -> Decision:
    n_win = len(tail.at_v) - tail.wlo
    if thr is None:
        return Decision(Verdict.INCONCLUSIVE, make=(*reasons.PLAIN, ctx, ctx[2], n_win))
    if not tail.at_v:
        return Decision(Verdict.INCONCLUSIVE,
                        make=(*reasons.PLAIN, ctx, "no sample since judging started", n_win))
    m = tail.med[-1]
    if m is None:
        ws = cfg.window_s
        if ws is None:
            why = f"{n_win} of {cfg.window_n} samples needed for a window"
        elif n_win < cfg.min_samples:
            why = f"{n_win} samples in the last {ws:g}s, fewer than min_samples {cfg.min_samples}"
        else:
            why = f"{tail.at_tau[-1] - tail.at_tau[0]:.0f}s of a {ws:g}s window so far"
        return Decision(Verdict.INCONCLUSIVE, make=(*reasons.PLAIN, ctx, why, n_win))
    streak, since, ev = tail.state[-1]
    span_needed = cfg.needed_span()
    breach_for = tail.at_tau[-1] - since if since is not None else 0.0  # (a breach since, while streak > 0)
    if streak == 0:
        verdict = Verdict.OK
    elif span_needed is None:
        verdict = Verdict.BREACH if streak < cfg.limit_n else Verdict.ROLLBACK
        streak = min(streak, cfg.limit_n)  # "for K consecutive windows": the limit reached
    else:
        verdict = Verdict.ROLLBACK if ev >= span_needed * EDGE - 1e-9 else Verdict.BREACH
    meds = tail.med[-1:-min(max(streak, 1), 20) - 1:-1]  # the streak's window medians, newest first
    return Decision(verdict, make=(reasons.windows_reason, reasons.windows_evidence, ctx, len(tail.at_v),
                                   tail.window_values(), m, meds, streak, breach_for, span_needed,
                                   ev / EDGE if span_needed is not None and streak else None))


def known_good(
    cfg: PolicyConfig,
    samples: Sequence[Sample],
    now: float,
    phase_start: float,
    baseline: Optional[float],
    pauses: Sequence[Tuple[float, float]] = (),
    memo: Optional[dict] = None,
) -> Optional[float]:
    """The new baseline once the profile has proven itself, else None.

    The proving span runs from where judging starts (see :func:`decide`: after
    the delays and the settle rule) for ``good_after`` seconds of active time
    (pauses do not count) and must be closed by a sample at or after its end.
    The profile is known-good when that span holds at least one full window, no
    full window inside it breaches the threshold, and no gap between its samples
    exceeds ``no_data_timeout``.  The result is the median of the span's samples
    — fixed once reached, so callers may stop asking.  With no threshold at all
    (``min_ratio`` only, first run) any steady run qualifies: that is how the
    first baseline is set.
    """
    thr, _ = threshold(cfg, baseline)
    if not samples or samples[-1].t < phase_start:
        return None
    tail = _tail(cfg, samples, phase_start, pauses, memo, thr)
    if tail.t0 is None:
        return None
    _, now_tau = tail.paused.at(now)
    return tail.known_good(now_tau)[1]
