"""A policy decision's reason and evidence, built when first read (stdlib only, pure).

``policy.decide`` runs after every throughput sample, and most of its answers are read
only for their verdict; the reason (one human line) and the evidence (a JSON-able dict)
are read when the verdict changes, when a breach or rollback is journalled, and once a
second for state.json. So ``decide`` hands a :class:`Decision` the builder and its
arguments, and the text and the dict are made on the first read of either, then kept:
the same strings and dicts, byte for byte, as when they were built at once
(tests/test_policy_lazy.py holds the two ways to each other over the recorded traces).
A builder's arguments are values that nothing changes after the call (numbers, the last
sample, lists of the call's own), so reading late gives what reading at once gave.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import Dict, Optional

from gpujob.agent.judge.throughput import fmt_rate

EAGER = False  # True: build at once (tests/test_policy_lazy.py compares the two ways)


class Decision:
    """``verdict``, ``reason`` (one human line), ``evidence`` (JSON-able); frozen."""

    __slots__ = ("verdict", "_reason", "_evidence", "_make")

    def __init__(self, verdict, reason: str = "", evidence: Optional[Dict] = None, make: Optional[tuple] = None):
        setattr_ = object.__setattr__
        setattr_(self, "verdict", verdict)
        setattr_(self, "_make", make)  # (builder, *args) -> (reason, evidence)
        setattr_(self, "_reason", reason)
        setattr_(self, "_evidence", {} if evidence is None else evidence)
        if make is not None and EAGER:
            self._build()

    def _build(self) -> None:
        make = self._make
        reason, evidence = make[0](*make[1:])
        object.__setattr__(self, "_reason", reason)
        object.__setattr__(self, "_evidence", evidence)
        object.__setattr__(self, "_make", None)

    @property
    def reason(self) -> str:
        if self._make is not None:
            self._build()
        return self._reason

    @property
    def evidence(self) -> Dict:
        if self._make is not None:
            self._build()
        return self._evidence

    @property
    def median(self):
        """``evidence.get("median")`` without building the evidence: what a caller that
        reads only it per sample (the samples.jsonl record) should ask."""
        make = self._make
        if make is not None:
            return make[4] if make[0] is windows else None  # (windows' arguments: ctx, considered, vals, med)
        return self._evidence.get("median")

    def __setattr__(self, name, value):
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __eq__(self, other):
        if not isinstance(other, Decision):
            return NotImplemented
        return (self.verdict, self.reason, self.evidence) == (other.verdict, other.reason, other.evidence)

    __hash__ = None  # type: ignore[assignment]  # (as the frozen dataclass with a dict field was)

    def __repr__(self) -> str:
        return f"Decision(verdict={self.verdict!r}, reason={self.reason!r}, evidence={self.evidence!r})"


def evidence(cfg, thr, src, baseline, now: float, last, considered: int = 0) -> Dict:
    """What every decision's evidence holds."""
    return {
        "threshold": thr,
        "threshold_source": src,
        "baseline": baseline,
        "window_size": cfg.window,
        "failure_limit": cfg.failure_limit,
        "last_sample_age": (now - last.t) if last is not None else None,
        "last_step": last.step if last is not None else None,
        "samples_considered": considered,
    }


def plain(ctx: tuple, reason: str, considered: int = 0) -> tuple:
    """A reason already made (a constant, or judging_start's): the evidence only."""
    return reason, evidence(*ctx, considered)


def stall(ctx: tuple, quiet: float, since: str) -> tuple:
    cfg = ctx[0]
    ev = evidence(*ctx)
    ev.update(no_data_for=quiet, no_data_timeout=cfg.no_data_timeout)
    return (f"no throughput sample for {quiet:.0f}s since {since} "
            f"(no_data_timeout {cfg.no_data_timeout:g}s)"), ev


def paused(ctx: tuple, p: tuple) -> tuple:
    now = ctx[4]
    ev = evidence(*ctx)
    ev["pause"] = [p[0], p[1]]
    return (f"paused (checkpoint save or pause_pattern) for {now - p[0]:.0f}s, "
            f"judging again in {p[1] - now:.0f}s"), ev


def windows(ctx: tuple, considered: int, first_vals: list, med: float, medians: list, streak: int,
            breach_for: float, span_needed) -> tuple:
    """The windows' verdict (ok, breach, rollback): the median, the threshold, the streak."""
    cfg, thr, src = ctx[0], ctx[1], ctx[2]
    ev = evidence(*ctx, considered)
    ev.update(window=first_vals[-50:], median=med, window_medians=medians[:20], consecutive_breaches=streak,
              breach_for=round(breach_for, 3))
    ws = cfg.window_s
    size = f"last {cfg.window_n} samples" if ws is None else f"last {ws:g}s ({len(first_vals)} samples)"
    head = f"median {fmt_rate(med)} tok/s of {size}"
    limit_txt = f"{fmt_rate(thr)} tok/s ({src})"
    if streak == 0:
        return f"{head} >= {limit_txt}", ev
    if span_needed is None:
        if streak < cfg.limit_n:
            return f"{head} < {limit_txt}: {streak} of {cfg.limit_n} consecutive windows", ev
        return f"{head} < {limit_txt} for {streak} consecutive windows", ev
    if breach_for < span_needed:
        return f"{head} < {limit_txt}: breaching for {breach_for:.0f}s of {span_needed:g}s", ev
    return f"{head} < {limit_txt}: breaching for {breach_for:.0f}s (failure_limit {span_needed:g}s)", ev
