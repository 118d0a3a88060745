"""The rollback policy over throughput samples (stdlib only, Python >= 3.9, pure:
no I/O and no clock reads, callers pass ``now``). Modelled on Argo Rollouts'
analysis runs: an initial delay, a sliding window (median of the last N samples),
and a failure limit of consecutive breaching windows before acting."""

from __future__ import annotations

import sys
from bisect import bisect_left
from dataclasses import dataclass, fields
from functools import cached_property
from operator import attrgetter
from statistics import median
from typing import List, Optional, Sequence, Tuple, Union

from gpujob.agent.base.defaults import DEFAULTS
from gpujob.agent.judge import reasons
from gpujob.agent.judge.pauses import Clock
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
    thresholds = cached_property(lambda self: {})  # threshold()'s answers by baseline

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
        cands.append((cfg.min_ratio * baseline, f"min_ratio {cfg.min_ratio:g} × baseline {fmt_rate(baseline)}"))
    if cands:
        return max(cands, key=lambda c: c[0])
    if cfg.min_ratio is not None:
        return None, f"no baseline yet for min_ratio {cfg.min_ratio:g}"
    return None, "no threshold configured"


_T = attrgetter("t")
_NO_PAUSES = Clock(())  # never changed


def _first_at_or_after(samples: Sequence[Sample], t: float, lo: int = 0) -> int:
    """Index of the first sample with ``.t >= t`` (samples are in time order)."""
    if lo < len(samples) and samples[lo].t >= t:  # the run's first sample, usually: no search
        return lo
    if sys.version_info < (3, 10):  # no key= before 3.10: a list of the times
        return bisect_left([s.t for s in samples], t, lo)
    return bisect_left(samples, t, lo, key=_T)  # (C, each decision searches twice)


def judging_start(cfg: PolicyConfig, samples: Sequence[Sample], now: float, clock: Clock,
                  memo: Optional[dict] = None, lo: int = 0) -> Tuple[str, object]:
    """Where judging starts: ``("judge", t0)`` (samples at or after t0 count), or
    ``(verdict, reason)`` while it does not yet. Every delay counts from the run's
    first sample (``samples[lo]``); then the settle rule. ``memo`` caches the
    (final) answer; the scan stops where judging starts."""
    first = samples[lo]
    if memo is not None and "start" in memo:  # one memo per run: its start stands once found
        return "judge", memo["start"]
    delay_end = first.t + cfg.initial_delay
    if now < delay_end:
        return Verdict.WARMING_UP, f"initial delay: {delay_end - now:.0f}s of {cfg.initial_delay:g}s left " \
                                   "(counted from the first sample)"
    skip, n = cfg.initial_delay_samples, cfg.settle_samples
    recent: List[Sample] = []
    seen = 0
    t0 = None
    tau_first = None
    for i in range(_first_at_or_after(samples, delay_end, lo), len(samples)):
        s = samples[i]
        if clock.paused(s.t) is not None:
            continue
        seen += 1
        if seen <= skip:
            continue
        if n == 0:
            t0 = s.t
            break
        tau = clock.tau(s.t)
        tau_first = tau if tau_first is None else tau_first
        if tau - tau_first >= cfg.settle_timeout:  # judged anyway from here on
            t0 = s.t
            break
        recent.append(s)
        if len(recent) > n:
            del recent[0]
        if len(recent) == n:
            m = median(v.value for v in recent)
            if m > 0 and all(abs(v.value - m) <= cfg.settle_tolerance * m for v in recent):
                t0 = recent[0].t
                break
    if t0 is None:
        if seen < skip:
            return Verdict.WARMING_UP, (f"ignoring the first {skip} samples after the initial delay "
                                        f"({seen} so far)")
        if n == 0 or seen == skip:
            return Verdict.WARMING_UP, "waiting for samples after the initial delay"
        return Verdict.SETTLING, (f"rate not settled yet: waiting for {n} samples within "
                                  f"{cfg.settle_tolerance:.0%} of their median (at most {cfg.settle_timeout:g}s)")
    if memo is not None:
        memo.clear()
        memo.update(first=first.t, start=t0)
    return "judge", t0


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
    6. ``inconclusive`` with no threshold, fewer than one full window, or a time
       window holding fewer than ``min_samples`` samples;
    7. otherwise windows ending at the latest samples are checked newest first
       (median < threshold = breaching) until one does not breach: ``rollback``
       once the breach reached ``failure_limit`` (K windows in a row, or K
       back-to-back time windows, or a duration of active time), else ``breach``
       (1+ windows), else ``ok``.

    Only the tail is read: a call costs O(log n + the windows inside the limit).
    """
    i0 = _first_at_or_after(samples, phase_start)
    n = len(samples)
    last = samples[-1] if n > i0 else None
    thr, src = threshold(cfg, baseline)
    clock = Clock(pauses) if pauses else _NO_PAUSES
    ctx = (cfg, thr, src, baseline, now, last)  # the evidence's, built when read (agent/judge/reasons.py)
    last_pause_end = max((b for a, b in clock.pauses if b <= now), default=None) if clock.pauses else None
    if last is None:
        ref = max(phase_start + cfg.initial_delay, last_pause_end or 0)
        quiet = now - ref
        if cfg.no_data_timeout is not None and quiet > cfg.no_data_timeout:
            return Decision(Verdict.STALL, make=(*reasons.STALL, ctx, quiet, "the initial delay ended"))
        if now < phase_start + cfg.initial_delay:
            return Decision(Verdict.WARMING_UP, make=(*reasons.PLAIN, ctx, "waiting for the first sample (initial delay)"))
        return Decision(Verdict.INCONCLUSIVE, make=(*reasons.PLAIN, ctx, "no throughput sample yet"))
    p = clock.paused(now) if clock.pauses else None
    if p is not None:
        return Decision(Verdict.PAUSED, make=(*reasons.PAUSED, ctx, p))
    what, t0 = judging_start(cfg, samples, now, clock, memo, i0)
    ref = max(last.t, samples[i0].t + cfg.initial_delay, last_pause_end or 0)
    quiet = now - ref
    if what != Verdict.WARMING_UP and cfg.no_data_timeout is not None and quiet > cfg.no_data_timeout:
        return Decision(Verdict.STALL, make=(*reasons.STALL, ctx, quiet, "the last sample"))
    if what != "judge":
        return Decision(what, make=(*reasons.PLAIN, ctx, t0))
    return _windows(cfg, samples, t0, clock, thr, ctx)


def _windows(cfg, samples, t0, clock, thr, ctx) -> Decision:
    start = _first_at_or_after(samples, t0)
    span_needed = cfg.needed_span()
    ws = cfg.window_s
    # the tail that can matter: τ >= τ(newest) - span - window  (τ <= t, so t >= that too)
    t_last = clock.tau(samples[-1].t)
    if ws is None and span_needed is None:
        lo = max(start, len(samples) - (cfg.window_n + cfg.limit_n) - (4 * (cfg.window_n + cfg.limit_n) + 64 if clock.pauses else 0))
    else:
        reach = (span_needed or 0) + (ws or 0)
        lo = max(start, _first_at_or_after(samples, t_last - reach - 1e-9))
    if clock.pauses:
        act = [(clock.tau(s.t), s.value) for s in samples[lo:] if clock.paused(s.t) is None]
    else:  # no pause: active time is wall time
        act = [(s.t, s.value) for s in samples[lo:]]
    n_all = len(samples) - start - (len(samples) - lo - len(act))  # paused ones in the tail left out
    if thr is None:
        return Decision(Verdict.INCONCLUSIVE, make=(*reasons.PLAIN, ctx, ctx[2], n_all))
    if not act:
        return Decision(Verdict.INCONCLUSIVE, make=(*reasons.PLAIN, ctx, "no sample since judging started", n_all))
    tau_start = clock.tau(samples[start].t)
    taus = [a for a, _ in act]
    vals = [v for _, v in act]

    def window(j):  # (values, why-not) of the window ending at act[j]
        if ws is None:
            if n_all - (len(act) - 1 - j) < cfg.window_n or j + 1 < cfg.window_n:
                return None, f"{n_all} of {cfg.window_n} samples needed for a window"
            return vals[j + 1 - cfg.window_n:j + 1], None
        if taus[j] - tau_start < ws:
            return None, f"{taus[j] - tau_start:.0f}s of a {ws:g}s window so far"
        k = j
        while k > 0 and taus[k - 1] > taus[j] - ws:
            k -= 1
        got = vals[k:j + 1]
        if len(got) < cfg.min_samples:
            return None, f"{len(got)} samples in the last {ws:g}s, fewer than min_samples {cfg.min_samples}"
        return got, None

    medians: List[float] = []
    j = len(act) - 1
    first_vals, why = window(j)
    if first_vals is None:
        return Decision(Verdict.INCONCLUSIVE, make=(*reasons.PLAIN, ctx, why, n_all))
    newest = taus[j]
    step_s = ws / 4 if ws is not None else None
    step_n = 1 if cfg.limit_s is None else max(1, cfg.window_n // 4) if ws is None else None
    streak, oldest = 0, newest
    while j >= 0:
        got, _ = window(j)
        if got is None:
            break
        m = median(got)
        medians.append(m)
        if m >= thr:
            break
        streak += 1
        oldest = taus[j]
        if span_needed is None and streak >= cfg.limit_n:
            break
        if span_needed is not None and newest - oldest >= span_needed:
            break
        if step_n is not None:
            j -= step_n
        else:
            goal = taus[j] - step_s
            while j >= 0 and taus[j] > goal:
                j -= 1
    breach_for = newest - oldest if streak else 0.0
    if streak == 0:
        verdict = Verdict.OK
    elif span_needed is None:
        verdict = Verdict.BREACH if streak < cfg.limit_n else Verdict.ROLLBACK
    else:
        verdict = Verdict.BREACH if breach_for < span_needed else Verdict.ROLLBACK
    return Decision(verdict, make=(reasons.windows_reason, reasons.windows_evidence, ctx, n_all, first_vals, medians[0], medians, streak, breach_for,
                                   span_needed))


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
    i0 = _first_at_or_after(samples, phase_start)
    if i0 >= len(samples):
        return None
    clock = Clock(pauses)
    what, t0 = judging_start(cfg, samples, now, clock, memo, i0)
    if what != "judge":
        return None
    start = _first_at_or_after(samples, t0)
    if start >= len(samples):
        return None
    goal = clock.tau(samples[start].t) + cfg.good_after
    if clock.tau(now) < goal:
        return None
    span_ = []
    for k in range(start, len(samples)):
        s = samples[k]
        if clock.paused(s.t) is not None:
            continue
        span_.append((clock.tau(s.t), s.value))
        if span_[-1][0] >= goal:
            break
    else:
        return None
    if cfg.no_data_timeout is not None and any(b[0] - a[0] > cfg.no_data_timeout for a, b in zip(span_, span_[1:])):
        return None
    vals = [v for _, v in span_]
    taus = [a for a, _ in span_]
    if cfg.window_s is None:
        if len(vals) < cfg.window_n:
            return None
        wins = [vals[i - cfg.window_n:i] for i in range(cfg.window_n, len(vals) + 1)]
    else:
        wins, k = [], 0
        for j in range(len(vals)):
            if taus[j] - taus[0] < cfg.window_s:
                continue
            while taus[k] <= taus[j] - cfg.window_s:
                k += 1
            if j - k + 1 >= cfg.min_samples:
                wins.append(vals[k:j + 1])
        if not wins:
            return None
    if thr is not None and any(median(w) < thr for w in wins):
        return None
    return median(vals)
