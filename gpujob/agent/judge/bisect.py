"""Which of a profile's changes made it slow, as values (stdlib only, pure: no I/O, no clock reads;
the laptop runs it, like replay: judge/ is the wing the laptop imports).

``gpujob bisect`` and ``gpujob tune`` (ops/bisect.py) run the trials; this module says
what differs between two profiles, which subset of the difference to try next, and what
one trial's samples say against the good profile's.

- :func:`resolved` / :func:`difference`: two profiles as exact sets (pins and env
  entries) and their difference, one :class:`Change` per package changed, added or
  removed and per env entry; changes that must move together form one group.
- :func:`search`: a generator that yields the next subset of groups to try (a frozenset
  of group indices applied on top of the good set) and is sent that trial's verdict;
  it returns the :class:`Answer`. The groups needed are found one at a time: the
  shortest slow prefix of the groups left (with those found so far) ends with a needed
  one (a binary search of prefixes); once the groups found are slow on their own they
  are the answer. One culprit costs ``ceil(log2 n) + 1`` trials besides the good one;
  two changes slow only together at most ``2 ceil(log2 n) + 4`` (the tests hold both).
  A subset that does not resolve is merged with its neighbour and the search starts
  over; sets tried before are not tried again. A merged group in the answer is then
  shrunk: each member but the first left out once, and kept out when the rest is slow.
- :func:`steady`, :func:`verdict`, :func:`enough`: a trial's steady rate with the
  judge's own rules (its initial delay and settle rule from ``tail.Tail``,
  then the median of the window to the end and its spread), slow or ok against the
  good profile's, and whether a running trial has measured enough to end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Generator, Optional, Sequence

from gpujob.agent.base.envs import pin_of
from gpujob.agent.judge.policy import PolicyConfig, Sample
from gpujob.agent.judge.tail import Tail

SLOW, OK, UNRESOLVED = "slow", "ok", "unresolved"


@dataclass(frozen=True)
class Change:
    """One difference: a package (``kind`` package) or an env entry (``kind`` env);
    ``old`` None: added by the bad profile, ``new`` None: removed."""

    kind: str
    name: str
    old: Optional[str]
    new: Optional[str]

    def label(self) -> str:
        what = self.name if self.kind == "package" else f"env {self.name}"
        return f"{what} {self.old or '(none)'} -> {self.new or '(none)'}"


Group = tuple  # tuple[Change, ...]: changes that move together


def resolved(profile: dict, holds: Optional[dict] = None) -> dict:
    """A profile (its agent dict: ``packages``, ``env``) as exact sets: ``packages``
    {name: version}, ``env`` {name: value}. ``holds``: what its venv really holds
    (the env marker's report), which wins over the pins where it names a version."""
    pkgs = dict(pin_of(p) for p in profile.get("packages") or [])
    for name, version in (holds or {}).items():
        if version:
            pkgs[name] = version
    return {"packages": pkgs, "env": dict(profile.get("env") or {})}


def difference(good: dict, bad: dict, together: Sequence = ()) -> list:
    """The groups of changes from ``good`` to ``bad`` (both :func:`resolved`), in name
    order; the package names of each set in ``together`` form one group (at the place
    of its first member)."""
    changes = []
    for kind, key in (("package", "packages"), ("env", "env")):
        a, b = good[key], bad[key]
        for name in sorted(set(a) | set(b)):
            if a.get(name) != b.get(name):
                changes.append(Change(kind, name, a.get(name), b.get(name)))
    groups: list = []
    where: dict = {}
    for c in changes:
        tied = next((i for i, s in enumerate(together) if c.kind == "package" and c.name in s), None)
        if tied is not None and tied in where:
            groups[where[tied]].append(c)
            continue
        if tied is not None:
            where[tied] = len(groups)
        groups.append([c])
    return [tuple(g) for g in groups]


def apply(good: dict, groups: Sequence) -> dict:
    """The good set with the changes of ``groups`` applied."""
    out = {"packages": dict(good["packages"]), "env": dict(good["env"])}
    for g in groups:
        for c in g:
            key = "packages" if c.kind == "package" else "env"
            if c.new is None:
                out[key].pop(c.name, None)
            else:
                out[key][c.name] = c.new
    return out


def pins(res: dict) -> list:
    return [f"{n}=={v}" for n, v in sorted(res["packages"].items())]


def describe(groups: Sequence) -> str:
    """``triton 3.5.1 -> 3.6.0 (moves with torch 2.10.0 -> 2.11.0)``; groups joined by ``+``."""
    out = []
    for g in groups:
        first, rest = g[0], g[1:]
        text = first.label()
        if rest:
            text += f" (moves with {', '.join(c.label() for c in rest)})"
        out.append(text)
    return " + ".join(out) if out else "(no change)"


# ---- the search ------------------------------------------------------------------

@dataclass(frozen=True)
class Answer:
    """``culprit``: indices of the groups (as given to :func:`search`, merges undone into
    their members) whose changes together make it slow; empty when the whole bad set
    was tried and is not slow. ``merged``: the groups merged because a subset did not
    resolve (lists of indices)."""

    culprit: tuple
    merged: tuple = ()


def culprit_groups(groups: Sequence, answer: Answer) -> list:
    """The answer's groups, those merged because they only resolve together as one group
    (so they read ``a -> b (moves with c -> d)``)."""
    out: list = []
    done: set = set()
    for i in answer.culprit:
        if i in done:
            continue
        unit = next((m for m in answer.merged if i in m), (i,))
        done.update(unit)
        out.append(tuple(c for j in unit for c in groups[j]))
    return out


class _Merge(Exception):
    def __init__(self, subset: frozenset):
        self.subset = subset


def _flat(units) -> frozenset:
    return frozenset(i for u in units for i in u)


def merge_neighbour(units: list, subset: frozenset) -> list:
    """Units with the last unit inside ``subset`` joined to the unit after it (or the
    first one inside to the unit before it, when ``subset`` ends the list)."""
    inside = [k for k, u in enumerate(units) if set(u) <= subset]
    if not inside or len(units) < 2:
        return units
    k = inside[-1]
    j = k + 1 if k + 1 < len(units) else inside[0] - 1
    if j < 0 or j == k:
        j = k - 1 if k > 0 else k + 1
    a, b = sorted((k, j))
    return units[:a] + [tuple(units[a]) + tuple(units[b])] + units[a + 1:b] + units[b + 1:]


def search(n: int) -> Generator[frozenset, str, Answer]:
    """Yields subsets of ``range(n)`` (group indices to apply on the good set) and is
    sent each one's verdict (SLOW, OK, UNRESOLVED; anything else counts as OK); returns
    the :class:`Answer`. The empty set is the good profile (measured by the caller
    first) and never asked for."""
    units: list = [(i,) for i in range(n)]
    cache: dict = {frozenset(): OK}
    merged: list = []
    while True:
        try:
            found = yield from _find(units, cache)
            found = yield from _shrink(found, merged, cache)
            kept = [tuple(sorted(set(m) & found)) for m in merged]
            return Answer(tuple(sorted(found)), tuple(m for m in kept if len(m) > 1))
        except _Merge as m:
            before = len(units)
            units = merge_neighbour(units, m.subset)
            if len(units) == before:  # one unit that does not resolve on its own: nothing to merge
                return Answer((), tuple(tuple(sorted(x)) for x in merged))
            merged = [u for u in units if len(u) > 1]


def _ask(s: frozenset, cache: dict):
    if s not in cache:
        got = yield s
        cache[s] = got if got in (SLOW, OK, UNRESOLVED) else OK
    if cache[s] == UNRESOLVED:
        raise _Merge(s)
    return cache[s]


def _shrink(found: frozenset, merged: list, cache: dict):
    """A merge joins a unit to its neighbour blindly: each member of a merged unit in the
    answer (but its first) is left out once; when the rest is still slow it stays out."""
    for unit in merged:
        for j in sorted(set(unit) & found)[1:][::-1]:
            s = found - {j}
            if s not in cache:
                got = yield s
                cache[s] = got if got in (SLOW, OK, UNRESOLVED) else OK
            if cache[s] == SLOW:
                found = s
    return found


def _find(units: list, cache: dict):
    """The culprit units, one at a time: the shortest slow prefix of the units left (with
    those found so far) ends with a unit that is needed (a binary search of prefixes);
    once the units found are slow on their own, they are the answer."""
    found: list = []
    rest = list(units)
    whole_checked = False
    while rest:
        lo, hi = 0, len(rest)  # prefix lo (with found) is not slow; prefix hi is (or is assumed)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if (yield from _ask(_flat(found + rest[:mid]), cache)) == SLOW:
                hi = mid
            else:
                lo = mid
        assumed = hi == len(rest) and not whole_checked
        found.append(rest[hi - 1])
        rest = rest[:hi - 1]
        if (yield from _ask(_flat(found), cache)) == SLOW:
            return _flat(found)
        if assumed:  # the whole set was only assumed slow: is it?
            whole_checked = True
            if (yield from _ask(_flat(found + rest), cache)) != SLOW:
                return frozenset()
    return frozenset()  # not slow with everything (monotony broken by noise)


def single_bound(n: int) -> int:
    """Trials for one culprit among ``n`` groups, the good profile's included."""
    return math.ceil(math.log2(n)) + 2 if n > 1 else 2


# ---- one trial's verdict -----------------------------------------------------------

@dataclass(frozen=True)
class Steady:
    """A trial's steady rate: the median of its samples from where the judge starts
    judging to the end, their spread (median absolute deviation) and count."""

    median: float
    spread: float
    n: int
    start: float
    end: float

    def rel_spread(self) -> float:
        return self.spread / self.median if self.median > 0 else math.inf


def steady(samples: Sequence, cfg: PolicyConfig) -> Optional[Steady]:
    """``samples``: (t, value) pairs of the train phase, in time order. None while the
    judge would not judge yet (initial delay, settle) or fewer than ``min_samples``."""
    ss = [Sample(float(t), float(v)) for t, v in samples]
    if not ss:
        return None
    tail = Tail(cfg, ss[0].t)  # the judge's own start: its initial delay, then its settle rule
    tail.sync(ss, (), None)
    t0 = tail.t0
    if t0 is None:
        return None
    vals = [s.value for s in ss if s.t >= t0]
    if len(vals) < max(1, cfg.min_samples):
        return None
    m = median(vals)
    return Steady(m, median(abs(v - m) for v in vals), len(vals), float(t0), ss[-1].t)


def verdict(trial: Optional[Steady], good: Steady, slower: float) -> tuple:
    """(SLOW or OK or ``unclear``, ratio to good). Slow: the median below ``slower`` x the
    good one's and the two apart by more than twice their spreads together."""
    if trial is None:
        return "unclear", None
    ratio = trial.median / good.median if good.median > 0 else math.inf
    apart = good.median - trial.median > 2 * (good.spread + trial.spread)
    if ratio < slower and apart:
        return SLOW, ratio
    if ratio < slower:
        return "unclear", ratio
    return OK, ratio


def enough(st: Optional[Steady], slower: float, at_least: int = 5) -> bool:
    """A trial has measured enough once its steady median is known closer than a
    quarter of the gap it must tell apart (``1 - slower``)."""
    if st is None or st.n < at_least:
        return False
    return st.rel_spread() / math.sqrt(st.n) < (1 - slower) / 4


def rank(rates: dict) -> list:
    """``tune``: [(profile, Steady or None, margin over the next)] fastest first; a
    profile without a steady rate last."""
    order = sorted(rates.items(), key=lambda kv: -(kv[1].median if kv[1] else -1))
    out = []
    for i, (name, st) in enumerate(order):
        nxt = order[i + 1][1] if i + 1 < len(order) else None
        margin = st.median / nxt.median if st and nxt and nxt.median > 0 else None
        out.append((name, st, margin))
    return out
