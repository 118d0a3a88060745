"""Per-rank trainer lines (stdlib only, pure): torchrun and friends print one copy of
a line per rank, prefixed ``[rank3]:``, ``[default0]:`` or ``rank 3:``.
``throughput.ranks`` says how the per-rank values of one interval become one sample:

- ``first`` (the default): only the lowest rank seen (rank 0) gives samples;
- ``sum`` / ``min``: the values of one interval are added / the slowest is kept.
  An interval is one step when the line has a step; otherwise it ends when a rank
  prints again. It is emitted as soon as it holds as many ranks as the largest
  interval seen so far (the world size, learned), else when the next one starts.

A line without a rank prefix is a single process's: its sample passes as is.
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Tuple

_PREFIX = re.compile(r"^\s*(?:\[(?:rank|default)(\d+)\]:|rank\s+(\d+):)\s?")


def split_rank(line: str) -> Tuple[Optional[int], str]:
    """``(rank, the line without its prefix)``; rank None for a line without one."""
    m = _PREFIX.match(line)
    if not m:
        return None, line
    return int(m.group(1) or m.group(2)), line[m.end():]


class RankMerge:
    def __init__(self, how: str = "first"):
        if how not in ("first", "sum", "min"):
            raise ValueError(f"ranks must be first, sum or min, got {how!r}")
        self.how = how
        self.lowest: Optional[int] = None
        self.group: Dict[int, float] = {}
        self.key: int | str | None = None
        self.world = 0

    def _emit(self):
        vals = list(self.group.values())
        step = self.key if isinstance(self.key, int) else None
        self.world = max(self.world, len(vals))
        self.group, self.key = {}, None
        return (sum(vals) if self.how == "sum" else min(vals)), step

    def add(self, rank: Optional[int], value: float, step: Optional[int]):
        """One rank's sample; returns a ``(value, step)`` sample, or None while the
        interval is open (or the line is another rank's, with ``first``)."""
        if rank is None:
            return value, step
        if self.how == "first":
            if self.lowest is None or rank < self.lowest:
                self.lowest = rank
            return (value, step) if rank == self.lowest else None
        out = None
        key = step if step is not None else "interval"
        if self.group and (key != self.key or rank in self.group):
            out = self._emit()
        self.key = key
        self.group[rank] = value
        if out is None and self.world > 1 and len(self.group) >= self.world:
            out = self._emit()
        return out
