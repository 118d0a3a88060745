"""A policy decision's reason and evidence, built when first read (stdlib only, pure).

``policy.decide`` runs after every throughput sample, and most of its answers are read
only for their verdict; the reason (one human line) and the evidence (a JSON-able dict)
are read when the verdict changes, when a breach or rollback is journalled, and once a
second for state.json. So ``decide`` hands a :class:`Decision` the builder and its
arguments, and the text and the dict are made on the first read of either, then kept:
the same strings and dicts, byte for byte, as when they were built at once
(tests/unit/test_policy_lazy.py holds the two ways to each other over the recorded traces).
A builder's arguments are values that nothing changes after the call (numbers, the last
sample, lists of the call's own), so reading late gives what reading at once gave.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import Dict, Optional

from gpujob.agent.judge.throughput import fmt_rate

EAGER = False  # True: build at once (tests/unit/test_policy_lazy.py compares the two ways)
_set = object.__setattr__


class Decision:
    """``verdict``, ``reason`` (one human line), ``evidence`` (JSON-able); frozen.
    ``make``: ``(reason builder, evidence builder, *args)``: each is built on its own
    first read (the samples.jsonl record reads the evidence's median every sample, the
    reason is read when the verdict changes and once a second)."""

    __slots__ = ("verdict", "_reason", "_evidence", "_make")
    verdict: str
    _reason: Optional[str]  # None: not built yet (then _make is given)
    _evidence: Optional[Dict]
    _make: Optional[tuple]

    def __init__(self, verdict, reason: str = "", evidence: Optional[Dict] = None,
                 make: Optional[tuple] = None):
        _set(self, "verdict", verdict)
        _set(self, "_make", make)
        if make is None:
            _set(self, "_reason", reason)
            _set(self, "_evidence", {} if evidence is None else evidence)
        elif EAGER:
            _set(self, "_reason", make[0](*make[2:]))
            _set(self, "_evidence", make[1](*make[2:]))
        else:  # None: not built yet
            _set(self, "_reason", None)
            _set(self, "_evidence", None)

    @property
    def reason(self) -> str:
        reason = self._reason
        if reason is None:
            make = self._make
            assert make is not None  # a reason is missing only where a builder was given
            reason = make[0](*make[2:])
            _set(self, "_reason", reason)
        return reason

    @property
    def evidence(self) -> Dict:
        evidence = self._evidence
        if evidence is None:
            make = self._make
            assert make is not None  # evidence is missing only where a builder was given
            evidence = make[1](*make[2:])
            _set(self, "_evidence", evidence)
        return evidence

    @property
    def built(self) -> bool:
        """Both the reason and the evidence are made (always, for a decision given them)."""
        return self._reason is not None and self._evidence is not None

    @property
    def median(self):
        """``evidence.get("median")`` without building the evidence: what a caller that
        reads only it per sample (the samples.jsonl record) should ask."""
        if self._evidence is None:
            make = self._make
            assert make is not None  # evidence is missing only where a builder was given
            return make[5] if make[1] is windows_evidence else None  # (ctx, considered, vals, med, ...)
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


# Each verdict's pair of builders over the same arguments; ``ctx`` is
# (cfg, threshold, its source, baseline, now, the last sample), see policy.decide.

def given_reason(ctx: tuple, reason: str, considered: int = 0) -> str:
    return reason  # a constant, or judging_start's text


def given_evidence(ctx: tuple, reason: str, considered: int = 0) -> Dict:
    cfg, thr, src, baseline, now, last = ctx
    return evidence(cfg, thr, src, baseline, now, last, considered)


PLAIN = (given_reason, given_evidence)


def stall_reason(ctx: tuple, quiet: float, since: str) -> str:
    return (f"no throughput sample for {quiet:.0f}s since {since} (no_data_timeout "
            f"{ctx[0].no_data_timeout:g}s)")


def stall_evidence(ctx: tuple, quiet: float, since: str) -> Dict:
    ev = evidence(*ctx)
    ev.update(no_data_for=quiet, no_data_timeout=ctx[0].no_data_timeout)
    return ev


STALL = (stall_reason, stall_evidence)


def paused_reason(ctx: tuple, p: tuple) -> str:
    now = ctx[4]
    return (f"paused (checkpoint save or pause_pattern) for {now - p[0]:.0f}s, "
            f"judging again in {p[1] - now:.0f}s")


def paused_evidence(ctx: tuple, p: tuple) -> Dict:
    ev = evidence(*ctx)
    ev["pause"] = [p[0], p[1]]
    return ev


PAUSED = (paused_reason, paused_evidence)


def windows_reason(ctx: tuple, considered: int, first_vals: list, med: float, medians: list, streak: int,
                   breach_for: float, span_needed, weighed=None) -> str:
    """The windows' verdict (ok, breach, rollback): the median, the threshold, the streak."""
    cfg, thr, src = ctx[0], ctx[1], ctx[2]
    ws = cfg.window_s
    size = f"last {cfg.window_n} samples" if ws is None else f"last {ws:g}s ({len(first_vals)} samples)"
    head = f"median {fmt_rate(med)} tok/s of {size}"
    limit_txt = f"{fmt_rate(thr)} tok/s ({src})"
    if streak == 0:
        return f"{head} >= {limit_txt}"
    if span_needed is None:
        if streak < cfg.limit_n:
            return f"{head} < {limit_txt}: {streak} of {cfg.limit_n} consecutive windows"
        return f"{head} < {limit_txt} for {streak} consecutive windows"
    if weighed is not None and weighed > breach_for + 0.5:  # a deep breach counts more (agent/judge/tail.py)
        return (f"{head} < {limit_txt}: breaching for {breach_for:.0f}s, weighed as "
                f"{min(weighed, span_needed):.0f}s of failure_limit {span_needed:g}s (a deeper breach counts "
                f"more)")
    if breach_for < span_needed:
        return f"{head} < {limit_txt}: breaching for {breach_for:.0f}s of {span_needed:g}s"
    return f"{head} < {limit_txt}: breaching for {breach_for:.0f}s (failure_limit {span_needed:g}s)"


def windows_evidence(ctx: tuple, considered: int, first_vals: list, med: float, medians: list, streak: int,
                     breach_for: float, span_needed, weighed=None) -> Dict:
    # (evidence()'s keys, then the windows': one literal, read per sample)
    cfg, thr, src, baseline, now, last = ctx
    return {"threshold": thr, "threshold_source": src, "baseline": baseline, "window_size": cfg.window,
            "failure_limit": cfg.failure_limit, "last_sample_age": now - last.t, "last_step": last.step,
            "samples_considered": considered, "window": first_vals[-50:], "median": med,
            "window_medians": medians[:20], "consecutive_breaches": streak,
            "breach_for": round(breach_for, 3),
            "breach_weighed": round(weighed, 3) if weighed is not None else None}


WINDOWS = (windows_reason, windows_evidence)
