"""A run's judging kept incrementally (stdlib only, pure: no I/O, no clock reads).

``policy.decide`` and ``policy.known_good`` used to rebuild the window's tail for every
sample, reaching back by all paused time so far: O(window x pauses) per sample, growing
with the run's age (issue 33 row 1, issue 38 row 9). A ``Tail`` lives in the caller's
memo and takes each sample once, as it arrives:

- its pause status and active time (``tau``) are decided on arrival, from the pauses known
  then (a copy of the pause list with the paused seconds before each, :class:`Paused`);
- a pause that opens or grows over samples already taken (a save seen a poll late, an eval
  line extending a pause) takes back only those samples (the newest: ``retract``) and takes
  them again; before judging has started the run is taken again from its start;
- the window is a sorted list of its values (the median in O(1), insertion and expiry by
  ``bisect``: O(log w) comparisons and one memmove) with expiry by active time or count;
- the breach's streak, its evidence and the known-good span's figures are kept per sample,
  so a sample taken back takes its state with it.

The judge weighs the evidence (docs/rollback.md, "How a breach is weighed"): a window
median ``m`` under the threshold ``thr`` adds ``max(ln(thr/m), EDGE)`` for each second of
active time it lasts; a rollback needs ``failure_limit x EDGE``. A breach down to 75 % of the
threshold or shallower must so hold for the whole ``failure_limit``; a deeper one is decided
sooner (a drop to a fifth, as the proof trainer's slow wheel: in a fifth of the time). A
time window is judged once it spans a quarter of its length (``min_samples`` in it) when
its median lies under 75 % of the threshold, so a deep drop needs no full window, and a
shallow one, or a quarter window's noise, waits for the full window.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_left, bisect_right, insort
from typing import List, Optional, Sequence, Tuple

EDGE = math.log(1 / 0.75)  # evidence per second of a breach at or above 75 % of the threshold
PARTIAL = 0.25  # a time window is judged once it spans this fraction of its length ...
PARTIAL_DEEP = 0.75  # ... when its median is under this fraction of the threshold
KEEP = 65536  # judged samples kept beyond the window (then the older half is dropped)


class Paused:
    """The run's pauses as last seen, with the paused seconds before each (absolute: the
    oldest may be dropped from the caller's list, never from the sums)."""

    def __init__(self) -> None:
        self.spans: List[Tuple[float, float]] = []
        self.before: List[float] = []

    def update(self, new: Sequence[Tuple[float, float]]) -> Optional[float]:
        """Take the caller's list; the earliest time whose status or active time may have
        changed (None: nothing changed; -inf: start over)."""
        old = self.spans
        if len(new) == len(old) and (not new or (new[-1] == old[-1] and new[0] == old[0])):
            return None
        if not new:
            changed = -math.inf if old else None
            self.spans, self.before = [], []
            return changed
        if not old:
            off = 0
        else:
            off = bisect_left(old, (new[0][0], -math.inf))
            if off >= len(old) or old[off][0] != new[0][0]:
                if new[0][0] > old[-1][0]:  # all new, after every known one
                    off = len(old)
                else:
                    self.spans, self.before = [], []
                    self._extend(new)
                    return -math.inf
        i = 0
        while off + i < len(old) and i < len(new) and old[off + i] == new[i]:
            i += 1
        if off + i < len(old) and i < len(new):  # a pause that changed (it grew or was cut short)
            a0, b0 = old[off + i]
            a1, b1 = new[i]
            changed = min(a0, a1) if a0 != a1 else min(b0, b1)
        elif i < len(new):
            changed = new[i][0]
        else:  # pauses dropped at the end: cannot happen, start over
            changed = old[off + i][0] if off + i < len(old) else -math.inf
        del self.spans[off + i:], self.before[off + i:]
        self._extend(new[i:])
        return changed

    def _extend(self, spans) -> None:
        for a, b in spans:
            acc = self.before[-1] + (self.spans[-1][1] - self.spans[-1][0]) if self.spans else 0.0
            self.spans.append((a, b))
            self.before.append(acc)
        if len(self.spans) > 4096:  # the oldest are never looked at again (samples come in time order)
            del self.spans[:2048], self.before[:2048]

    def at(self, t: float) -> Tuple[bool, float]:
        """(paused, active time) at ``t``."""
        sp = self.spans
        if not sp or t < sp[0][0]:
            return False, t - (0.0 if not sp else self.before[0])
        i = len(sp) - 1
        if sp[i][0] > t:  # not the newest pause: search
            i = bisect_right(sp, (t, math.inf)) - 1
        a, b = sp[i]
        return t < b, t - self.before[i] - (min(t, b) - a)


class Tail:
    """One run's judging state (kept in ``decide``'s memo under ``"tail"``)."""

    def __init__(self, cfg, phase_start: float) -> None:
        self.cfg, self.phase_start = cfg, phase_start
        self.paused = Paused()
        self.thr: Optional[float] = None
        # the judge's work, for its cost to be seen (a ``pause`` event carries them): samples new
        # to it, and the elements it touched for them (each taken, expired, taken back, taken
        # again, read by known_good); flat per sample over a run of any age with pauses in it,
        # where a judge reaching back by all paused time touched more and more (issue 38 row 9)
        self.fresh = 0
        self.touched = 0
        self.reset()

    def reset(self) -> None:
        self.k = 0  # samples taken from the caller's list
        self.last_obj = None
        self.first_t: Optional[float] = None  # the run's first sample
        # before judging: the delays and the settle rule
        self.seen = 0  # active samples after the initial delay
        self.recent: List[Tuple[float, float, float]] = []  # (t, tau, value) of the settle candidates
        self.tau_first: Optional[float] = None
        self.t0: Optional[float] = None  # judging starts here (a sample's time)
        self.tau_start: Optional[float] = None  # the first judged sample's active time
        # judged samples (active, at or after t0): per sample
        self.at_t: List[float] = []
        self.at_tau: List[float] = []
        self.at_v: List[float] = []
        self.med: List[Optional[float]] = []  # the window's median (None: no window yet)
        self.full: List[bool] = []  # a full window
        self.state: List[Tuple[int, Optional[float], float]] = []  # (streak, breach since tau, evidence)
        self.kg: List[Tuple[float, float]] = []  # (min full-window median so far, max gap so far)
        self.wlo = 0
        self.srt: List[float] = []
        self.known: Optional[Tuple] = None  # known_good's answer once its span closed
        self._goal_t = math.inf  # the time of the sample that closed it

    # -- taking samples -------------------------------------------------------------------
    def sync(self, samples: Sequence, spans: Sequence[Tuple[float, float]], thr: Optional[float]) -> None:
        """Take the samples not taken yet (and take back what changed pauses touched)."""
        k = self.k
        if k and (k > len(samples) or samples[k - 1] is not self.last_obj):
            found = self._find(samples)
            if found is None:  # not the list we followed: start over
                self.reset()
                self.paused = Paused()
                found = 0
            self.k = k = found
        self.fresh += len(samples) - k
        changed = self.paused.update(spans)
        if changed is not None and k:
            if self.t0 is None or changed <= self.t0:
                self.reset()
                self.k = k = 0
            else:
                self._retract(changed)
                if sys.version_info >= (3, 10):  # bisect's key= came with 3.10
                    k = bisect_left(samples, changed, 0, self.k, key=_t)
                else:  # pragma: no cover - Python 3.9
                    k = _bisect_t(samples, changed, self.k)
                self.k = k
        if thr != self.thr:
            self.thr = thr
            self._restreak()
        for i in range(self.k, len(samples)):
            s = samples[i]
            if s.t >= self.phase_start:
                self._take(s.t, s.value)
        self.k = len(samples)
        self.last_obj = samples[-1] if samples else None

    def _find(self, samples) -> Optional[int]:
        """Where the last taken sample now is (the caller dropped its oldest ones)."""
        last = self.last_obj
        if last is None:
            return None
        i = _bisect_t(samples, last.t, len(samples))
        while i < len(samples) and samples[i].t == last.t:
            if samples[i] is last:
                return i + 1
            i += 1
        return None

    def _take(self, t: float, v: float) -> None:
        cfg = self.cfg
        self.touched += 1
        if self.first_t is None:
            self.first_t = t
        p, tau = self.paused.at(t)
        if p:
            return
        if self.t0 is not None:
            self._judge(t, tau, v)
            return
        if t < self.first_t + cfg.initial_delay:
            return
        self.seen += 1
        if self.seen <= cfg.initial_delay_samples:
            return
        n = cfg.settle_samples
        if n == 0:
            self._start(t, [(t, tau, v)])
            return
        self.tau_first = tau if self.tau_first is None else self.tau_first
        if tau - self.tau_first >= cfg.settle_timeout:
            self._start(t, [(t, tau, v)])
            return
        self.recent.append((t, tau, v))
        if len(self.recent) > n:
            del self.recent[0]
        if len(self.recent) == n:
            vals = sorted(x[2] for x in self.recent)
            m = _median_sorted(vals)
            if m > 0 and vals[0] >= m - cfg.settle_tolerance * m and vals[-1] <= m + cfg.settle_tolerance * m:
                self._start(self.recent[0][0], list(self.recent))

    def _start(self, t0: float, first) -> None:
        self.t0 = t0
        self.recent = []
        for t, tau, v in first:
            self._judge(t, tau, v)

    def _judge(self, t: float, tau: float, v: float) -> None:
        cfg = self.cfg
        if self.at_tau and tau < self.at_tau[-1]:
            tau = self.at_tau[-1]  # a pause learnt late: active time never runs back
        if self.tau_start is None:
            self.tau_start = tau
        if len(self.at_t) >= KEEP and self.known is not None:
            self._trim()
        self.at_t.append(t)
        self.at_tau.append(tau)
        self.at_v.append(v)
        insort(self.srt, v)
        ws, srt = cfg.window_s, self.srt
        if ws is not None:
            while self.at_tau[self.wlo] <= tau - ws:
                del srt[bisect_left(srt, self.at_v[self.wlo])]
                self.wlo += 1
                self.touched += 1
            covered = tau - self.tau_start
            n = len(srt)
            full = covered >= ws and n >= cfg.min_samples
            judged = n >= cfg.min_samples and (full or covered >= PARTIAL * ws)
        else:
            while len(srt) > cfg.window_n:
                del srt[bisect_left(srt, self.at_v[self.wlo])]
                self.wlo += 1
                self.touched += 1
            full = judged = len(srt) >= cfg.window_n
        m = _median_sorted(srt) if judged else None
        if m is not None and not full and self.thr is not None and m >= PARTIAL_DEEP * self.thr:
            m = None  # a part of a window speaks only of a deep drop
        self.med.append(m)
        self.full.append(full)
        self.state.append(self._step(len(self.med) - 1))
        lo, gap = self.kg[-1] if self.kg else (math.inf, 0.0)
        if full and m is not None:
            lo = min(lo, m)
        if len(self.at_tau) > 1:
            gap = max(gap, tau - self.at_tau[-2])
        self.kg.append((lo, gap))

    def _step(self, j: int) -> Tuple[int, Optional[float], float]:
        """The streak after sample j: (windows breaching in a row, since which tau, evidence)."""
        m, thr = self.med[j], self.thr
        if m is None or thr is None or m >= thr:
            return 0, None, 0.0
        streak, since, ev = self.state[j - 1] if j > 0 else (0, None, 0.0)
        if streak == 0:
            return 1, self.at_tau[j], 0.0
        dt = self.at_tau[j] - self.at_tau[j - 1]
        if self.cfg.window_s is not None:
            dt = min(dt, self.cfg.window_s)
        return streak + 1, since, ev + dt * weight(m, thr)

    def _trim(self) -> None:
        """Drop the judged samples older than the window (once known_good is decided: its span
        is read no more), so a run of hours keeps what its window holds, not its history."""
        cut = max(0, self.wlo - 1)
        if cut < KEEP // 2:
            return
        for arr in (self.at_t, self.at_tau, self.at_v, self.med, self.full, self.state, self.kg):
            del arr[:cut]
        self.wlo -= cut

    def _restreak(self) -> None:
        self.touched += len(self.med)
        self.state = []
        for j in range(len(self.med)):
            self.state.append(self._step(j))

    def _retract(self, t: float) -> None:
        """Take back the judged samples at or after ``t`` (a pause reached them)."""
        cut = bisect_left(self.at_t, t)
        ws, srt = self.cfg.window_s, self.srt
        self.touched += len(self.at_t) - cut
        for j in range(len(self.at_t) - 1, cut - 1, -1):
            if j >= self.wlo:
                del srt[bisect_left(srt, self.at_v[j])]
        for arr in (self.at_t, self.at_tau, self.at_v, self.med, self.full, self.state, self.kg):
            del arr[cut:]
        if self.known is not None and t <= self._goal_t:
            self.known = None  # the known-good span itself was touched
        if self.wlo > cut:
            self.wlo = cut
        if self.at_tau:  # the window of the newest sample left: older ones may be back in it
            last = self.at_tau[-1]
            while self.wlo > 0 and (self.at_tau[self.wlo - 1] > last - ws if ws is not None
                                    else len(srt) < self.cfg.window_n):
                self.wlo -= 1
                insort(srt, self.at_v[self.wlo])
                self.touched += 1

    # -- answers --------------------------------------------------------------------------
    def window_values(self) -> List[float]:
        return self.at_v[self.wlo:]

    def known_good(self, now_tau: float) -> Tuple[bool, Optional[float]]:
        """(decided, baseline) of policy.known_good, from the kept figures."""
        cfg = self.cfg
        if self.known is not None and self.known[0] == self.thr:
            return True, self.known[1]
        if not self.at_tau:
            return False, None
        goal = (self.tau_start or 0.0) + cfg.good_after
        if now_tau < goal or self.at_tau[-1] < goal:
            return False, None
        end = bisect_left(self.at_tau, goal)
        self.touched += end + 1  # (once a span: the answer is kept)
        lo, gap = self.kg[end]
        nfull = any(self.full[:end + 1]) if cfg.window_s is not None else end + 1 >= cfg.window_n
        ok = nfull and not (cfg.no_data_timeout is not None and gap > cfg.no_data_timeout) and \
            not (self.thr is not None and lo < self.thr)
        base = _median_sorted(sorted(self.at_v[:end + 1])) if ok else None
        self.known = (self.thr, base)
        self._goal_t = self.at_t[end]
        return True, base


def weight(m: float, thr: float) -> float:
    """Evidence per second of a window median ``m`` under ``thr``: ``EDGE`` down to 75 % of
    the threshold, then ``EDGE x (ln(thr/m) / EDGE)^2``: a drop to half the threshold counts
    5.8 seconds of the limit per second, one to a fifth 31."""
    depth = math.log(thr / m) if m > 0 else 50.0
    return EDGE * max(1.0, depth / EDGE) ** 2


def _t(s):
    return s.t


def _bisect_t(samples, t: float, hi: int) -> int:
    lo = 0
    while lo < hi:
        mid = (lo + hi) // 2
        if samples[mid].t < t:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _median_sorted(v: Sequence[float]) -> float:
    n = len(v)
    h = n // 2
    return v[h] if n % 2 else (v[h - 1] + v[h]) / 2
