"""The rollback policy over throughput samples (stdlib only, Python >= 3.9, pure:
no I/O and no clock reads, callers pass ``now``). Modelled on Argo Rollouts'
analysis runs: an initial delay, a sliding window (median of the last N samples),
and a failure limit of consecutive breaching windows before acting."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from statistics import median
from typing import Dict, List, Optional, Sequence, Tuple

from gpujob.agent.defaults import DEFAULTS
from gpujob.agent.protocol import Verdict
from gpujob.agent.throughput import fmt_rate

# --------------------------------------------------------------------------
# Policy
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    t: float
    value: float
    step: Optional[int] = None


_TP = DEFAULTS["throughput"]


@dataclass(frozen=True)
class PolicyConfig:
    """Throughput policy.

    ``initial_delay_samples`` counts *samples*, not trainer steps: step
    counters restart or jump on resume from a checkpoint, while the warm-up
    (compilation, cache fill) happens on every start.  ``no_data_timeout``
    None disables stall detection.
    """

    # defaults: the spec's throughput section (gpujob/spec.py, via spec_defaults.json)
    min: Optional[float] = _TP["min"]  # absolute tok/s
    min_ratio: Optional[float] = _TP["min_ratio"]  # of baseline
    window: int = _TP["window"]  # median of the last N samples
    failure_limit: int = _TP["failure_limit"]  # consecutive breaching windows before acting
    initial_delay: float = _TP["initial_delay"]  # seconds after phase start: samples ignored
    initial_delay_samples: int = _TP["initial_delay_samples"]  # then ignore the first K samples too
    no_data_timeout: Optional[float] = _TP["no_data_timeout"]  # no sample for that long = stall
    good_after: float = _TP["good_after"]  # held above threshold this long = known-good

    @classmethod
    def from_spec(cls, tp: dict) -> "PolicyConfig":
        """From the spec's throughput section (completed by defaults.section)."""
        return cls(**{f.name: tp[f.name] for f in fields(cls)})

    def __post_init__(self) -> None:
        if self.window < 1 or self.failure_limit < 1:
            raise ValueError("window and failure_limit must be >= 1")
        if self.initial_delay < 0 or self.initial_delay_samples < 0 or self.good_after < 0:
            raise ValueError("initial_delay, initial_delay_samples and good_after must be >= 0")
        if self.min is not None and self.min < 0:
            raise ValueError("min must be >= 0")
        if self.min_ratio is not None and self.min_ratio <= 0:
            raise ValueError("min_ratio must be > 0")
        if self.no_data_timeout is not None and self.no_data_timeout <= 0:
            raise ValueError("no_data_timeout must be > 0 (or None to disable)")


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str  # one human line
    evidence: Dict = field(default_factory=dict)  # JSON-able



def threshold(cfg: PolicyConfig, baseline: Optional[float]) -> Tuple[Optional[float], str]:
    """``(threshold, source)``: the larger of ``min`` and ``min_ratio × baseline``.

    With only ``min_ratio`` and no baseline yet → ``(None, 'no baseline yet …')``;
    with nothing configured → ``(None, 'no threshold configured')``.
    """
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


def _first_at_or_after(samples: Sequence[Sample], t: float, lo: int = 0) -> int:
    """Index of the first sample with ``.t >= t`` (samples are in time order)."""
    hi = len(samples)
    while lo < hi:
        mid = (lo + hi) // 2
        if samples[mid].t < t:
            lo = mid + 1
        else:
            hi = mid
    return lo


def decide(
    cfg: PolicyConfig,
    samples: Sequence[Sample],
    now: float,
    phase_start: float,
    baseline: Optional[float],
) -> Decision:
    """Evaluate the policy at ``now``.

    Counted samples are those with ``t >= phase_start + initial_delay``, minus
    the first ``initial_delay_samples`` of them.  In order:

    1. ``warming_up`` while ``now`` is inside the initial delay;
    2. ``stall`` when no sample arrived for more than ``no_data_timeout``
       (measured from the last sample, or from the end of the initial delay
       if later) — separate from low throughput, never counted as a breach;
    3. ``warming_up`` while the first ``initial_delay_samples`` are skipped;
    4. ``inconclusive`` with no threshold (no baseline yet) or fewer than
       ``window`` counted samples;
    5. otherwise the window ending at each of the last counted samples is
       checked newest first (median < threshold = breaching) until one does
       not breach or ``failure_limit`` is reached: 0 → ``ok``,
       1..limit-1 → ``breach``, limit → ``rollback``.

    Only the tail is read (a binary search finds the delay boundary), so a
    call costs O(log n + window × failure_limit); ``samples`` must be a list
    (or other indexable sequence) in time order.
    """
    delay_end = phase_start + cfg.initial_delay
    n = len(samples)
    last = samples[-1] if n else None
    thr, src = threshold(cfg, baseline)
    ev: Dict = {
        "threshold": thr,
        "threshold_source": src,
        "baseline": baseline,
        "window_size": cfg.window,
        "failure_limit": cfg.failure_limit,
        "last_sample_age": (now - last.t) if last is not None else None,
        "last_step": last.step if last is not None else None,
    }
    if now < delay_end:
        ev["samples_considered"] = 0
        return Decision(Verdict.WARMING_UP, f"initial delay: {delay_end - now:.0f}s of {cfg.initial_delay:g}s left", ev)

    first = _first_at_or_after(samples, delay_end)
    start = first + cfg.initial_delay_samples
    counted = max(0, n - start)
    ev["samples_considered"] = counted

    ref = max(last.t, delay_end) if last is not None else delay_end
    quiet = now - ref
    if cfg.no_data_timeout is not None and quiet > cfg.no_data_timeout:
        ev.update(no_data_for=quiet, no_data_timeout=cfg.no_data_timeout)
        since = "since the last sample" if last is not None and last.t >= delay_end else "since the initial delay ended"
        return Decision(Verdict.STALL, f"no throughput sample for {quiet:.0f}s {since} (no_data_timeout {cfg.no_data_timeout:g}s)", ev)

    if n - first < cfg.initial_delay_samples:
        return Decision(
            Verdict.WARMING_UP,
            f"ignoring the first {cfg.initial_delay_samples} samples after the initial delay ({n - first} so far)",
            ev,
        )
    if thr is None:
        return Decision(Verdict.INCONCLUSIVE, src, ev)
    if counted < cfg.window:
        return Decision(Verdict.INCONCLUSIVE, f"{counted} of {cfg.window} samples needed for a window", ev)

    lo = max(start, n - (cfg.window + cfg.failure_limit - 1))
    tail = [s.value for s in samples[lo:n]]
    medians: List[float] = []
    streak = 0
    for k in range(cfg.failure_limit):
        end = len(tail) - k
        if end < cfg.window:
            break
        m = median(tail[end - cfg.window : end])
        medians.append(m)
        if m >= thr:
            break
        streak += 1
    med = medians[0]
    ev.update(
        window=tail[-cfg.window :],
        median=med,
        window_medians=medians,  # newest first
        consecutive_breaches=streak,
    )
    head = f"median {fmt_rate(med)} tok/s of last {cfg.window} samples"
    limit_txt = f"{fmt_rate(thr)} tok/s ({src})"
    if streak == 0:
        return Decision(Verdict.OK, f"{head} >= {limit_txt}", ev)
    if streak < cfg.failure_limit:
        return Decision(Verdict.BREACH, f"{head} < {limit_txt}: {streak} of {cfg.failure_limit} consecutive windows", ev)
    return Decision(Verdict.ROLLBACK, f"{head} < {limit_txt} for {streak} consecutive windows", ev)


def known_good(
    cfg: PolicyConfig,
    samples: Sequence[Sample],
    now: float,
    phase_start: float,
    baseline: Optional[float],
) -> Optional[float]:
    """The new baseline once the profile has proven itself, else None.

    The proving span runs from the first counted sample (see :func:`decide`)
    for ``good_after`` seconds and must be closed by a sample at or after its
    end.  The profile is known-good when that span holds at least one full
    window, no full window inside it breaches the threshold, and no gap
    between its samples exceeds ``no_data_timeout``.  The result is the median
    of the span's samples — fixed once reached, so callers may stop asking.
    With no threshold at all (``min_ratio`` only, first run) any steady run
    qualifies: that is how the first baseline is set.  Cost is bounded by the
    span, not by the length of ``samples``.
    """
    thr, _ = threshold(cfg, baseline)
    start = _first_at_or_after(samples, phase_start + cfg.initial_delay) + cfg.initial_delay_samples
    if start >= len(samples):
        return None
    goal = samples[start].t + cfg.good_after
    if now < goal:
        return None
    end = _first_at_or_after(samples, goal, lo=start)
    if end >= len(samples):
        return None
    span = [samples[i] for i in range(start, end + 1)]
    if len(span) < cfg.window:
        return None
    if cfg.no_data_timeout is not None and any(b.t - a.t > cfg.no_data_timeout for a, b in zip(span, span[1:])):
        return None
    vals = [s.value for s in span]
    if thr is not None and any(median(vals[i - cfg.window : i]) < thr for i in range(cfg.window, len(vals) + 1)):
        return None
    return median(vals)
