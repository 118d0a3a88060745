"""Pauses: stretches of a run whose samples say nothing of its speed (stdlib only,
pure: no I/O, callers pass the time).

A checkpoint save (a file under ``train.checkpoint.path`` new or changing) or a
line matching ``throughput.pause_pattern`` (an eval, a data reload) opens a pause;
it lasts until ``pause_tail`` after the last such event (the rate's recovery:
tqdm's smoothed rate climbs back for a second or so after a save). A pause also
reaches ``LEAD`` seconds back before its first event: the checkpoint watcher sees
a save up to about a poll late, and the samples printed meanwhile are the save's.
The policy leaves samples inside pauses out of every window and counts no pause
time in any duration (:class:`Clock`).

Saves are pauses only while they are rare: a trainer that checkpoints more often than
every ``2 × (LEAD + pause_tail)`` seconds (``train.checkpoint.every``) would be paused
for good and never judged (jobs/dflash-mini.yaml saves every 5 s: found on the H200),
so its saves are its pace and only ``pause_pattern`` lines pause it
(:func:`checkpoints_pause`). One save is told from the next by its name (the path part
that names a step: ``checkpoint-1133/``, ``epoch=0-step=12.ckpt``) or, for a file
rewritten in place (nanoGPT's ``out/ckpt.pt``, Lightning's ``last.ckpt``), by a change
after ``QUIET`` seconds without one (:meth:`Pauses.starts_save`).
"""

from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

LEAD = 2.0  # seconds before a pause's first event that still belong to it
KEEP = 2000  # pauses kept per run (the oldest dropped first)
QUIET = 2.0  # a file that changes again after this long without a change is saved anew (polls: 0.2-0.5 s)


_NUMBERED = re.compile(r"\d")
_STEP_NAMED = re.compile(r"(?:step|checkpoint|ckpt|iter|epoch)\D{0,2}\d", re.I)


def save_key(path: str) -> str:
    """Which save a checkpoint file belongs to (pure): its first path component that names
    a step (``checkpoint-1133/model.safetensors`` -> ``checkpoint-1133``,
    ``lightning_logs/version_0/checkpoints/epoch=0-step=12.ckpt`` -> ``epoch=0-step=12.ckpt``),
    else its first holding a number (``run_3/w.pt`` -> ``run_3``), else the path itself
    (``out/ckpt.pt``, rewritten in place)."""
    parts = str(path).split("/")
    for rx in (_STEP_NAMED, _NUMBERED):
        for part in parts:
            if rx.search(part):
                return part
    return str(path)


def checkpoints_pause(every, tail: float, lead: float = LEAD) -> bool:
    """Whether checkpoint saves every ``every`` seconds (None: not known) open pauses."""
    return every is None or float(every) >= 2 * (lead + float(tail))


class Pauses:
    """The pauses of one run, as merged ``[start, end]`` intervals in time order."""

    def __init__(self, tail: float, lead: float = LEAD, ckpt_every=None):
        self.tail, self.lead = float(tail), float(lead)
        self.ckpt = checkpoints_pause(ckpt_every, self.tail, self.lead)  # saves pause judging
        # the save in progress or last seen: {key, start, files: {path: last event}}
        self.save: dict | None = None
        self.rhythm: str | None = None  # why saves stopped pausing (they came as often as a pause lasts)
        self.intervals: List[List] = []  # [start, end, why]
        self._key: Optional[tuple] = None  # what spans() was built from
        self._spans: List[Tuple[float, float]] = []
        self.count = 0  # pauses opened (a merged extension does not count)

    def mark(self, t: float, why: str) -> Optional[List]:
        """An event at ``t`` that pauses judging; returns the interval when it opened a
        new pause (None when it extended the current one)."""
        if self.intervals and t - self.lead <= self.intervals[-1][1]:
            last = self.intervals[-1]
            last[1] = max(last[1], t + self.tail)
            return None
        iv = [t - self.lead, t + self.tail, why]
        self.intervals.append(iv)
        self.count += 1
        del self.intervals[:-KEEP]
        return iv

    def on_ckpt_events(self, events: Sequence[dict]) -> List[List]:
        """Checkpoint file events (CONTRACT: {t, ckpt, op, size}): ``new`` and ``changed``
        are a save in progress; ``gone`` (an old checkpoint rotated away) is not."""
        opened: List[List] = []
        if not self.ckpt:
            return opened
        for ev in events:
            if ev.get("op") in ("new", "changed") and isinstance(ev.get("t"), (int, float)):
                t = float(ev["t"])
                last = self.save["start"] if self.save else None
                if self.starts_save(t, str(ev.get("ckpt") or ""), ev["op"]) and \
                        self.saves_are_the_pace(t, last):
                    return opened
                got = self.mark(t, f"checkpoint {ev.get('ckpt')}")
                if got is not None:
                    opened.append(got)
        return opened

    def starts_save(self, t: float, path: str, op: str) -> bool:
        """Whether a file event at ``t`` starts another save rather than going on with the
        one in progress: a file of another step (its :func:`save_key` names one), a file
        of no step name after ``QUIET`` s without checkpoint events, or a file of this save
        written again after ``QUIET`` s without a change (a rewrite in place)."""
        key, cur = save_key(path), self.save
        if cur is None:
            new = True
        elif key != cur["key"]:
            new = bool(_STEP_NAMED.search(key)) or t - max(cur["files"].values()) >= QUIET
        else:
            new = op == "changed" and path in cur["files"] and t - cur["files"][path] >= QUIET
        if new or cur is None:  # (no save in progress: new)
            self.save = cur = {"key": key, "start": t, "files": {}}
        cur["files"][path] = t
        return new

    def saves_are_the_pace(self, t: float, last) -> bool:
        """A save starting at ``t``: when it comes sooner after the last one's start
        (``last``; None: the first) than a pause lasts (2 × (lead + tail)), the trainer
        saves as often as it trains: saves stop pausing for the rest of the run, and the
        pause in progress ends now."""
        if last is None or t - last >= 2 * (self.lead + self.tail):
            return False
        self.ckpt = False
        self.rhythm = f"two saves {t - last:.1f}s apart: saves are this trainer's pace, not pauses"
        if self.intervals and self.intervals[-1][1] > t:
            self.intervals[-1][1] = max(self.intervals[-1][0], t)
        return True

    def spans(self) -> List[Tuple[float, float]]:
        """The pauses as (start, end) pairs, built again only when they changed (asked for every
        sample: up to KEEP of them; a change is a new pause or the last one's end moving)."""
        iv = self.intervals
        key = (len(iv), iv[0][0], iv[-1][0], iv[-1][1]) if iv else None
        if key != self._key:
            self._key, self._spans = key, [(a, b) for a, b, _ in iv]
        return self._spans

    def active_at(self, t: float) -> Optional[List]:
        return (self.intervals[-1] if self.intervals and self.intervals[-1][0] <= t < self.intervals[-1][1]
                else None)

    def paused_seconds(self, since: float, until: float) -> float:
        """Paused time inside ``[since, until]`` (gpu_idle does not count it as idle)."""
        return sum(max(0.0, min(b, until) - max(a, since)) for a, b, _ in self.intervals)


class Clock:
    """Active time: wall time minus the pauses (merged, sorted ``(start, end)`` pairs,
    from agent/judge/pauses.py). ``tau(t)`` is ``t`` less the paused seconds before it."""

    def __init__(self, pauses: Sequence[Tuple[float, float]] = ()):
        self.pauses = list(pauses)
        self.before: List[float] = []  # paused seconds before each pause's start
        acc = 0.0
        for a, b in self.pauses:
            self.before.append(acc)
            acc += b - a

    def _index(self, t: float) -> int:
        lo, hi = 0, len(self.pauses)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.pauses[mid][0] <= t:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1  # the last pause starting at or before t

    def paused(self, t: float) -> Optional[Tuple[float, float]]:
        if not self.pauses:
            return None
        i = self._index(t)
        return self.pauses[i] if i >= 0 and t < self.pauses[i][1] else None

    def tau(self, t: float) -> float:
        if not self.pauses:
            return t
        i = self._index(t)
        if i < 0:
            return t
        a, b = self.pauses[i]
        return t - self.before[i] - (min(t, b) - a)


