"""Where throughput samples come from (stdlib only). The policy does not care.

- ``LineSource``: the trainer's output lines, read by one of throughput.py's parsers
  (``throughput.format``).
- ``FileSource``: a JSONL metrics file the trainer appends to (``throughput.source:
  file``), common with torchtitan- and HF-style metric loggers: one JSON object a line,
  the tok/s under ``field`` (``a.b`` reaches into nested objects). Only whole lines
  are read; a line that is not an object with a finite number there is skipped.

Both answer ``from_line(line)`` (a sample or None) and ``poll()`` (the samples that
arrived since the last poll), each sample a ``(value, step)`` pair.
"""

from __future__ import annotations

import math

from gpujob.agent.base import jsonl
from gpujob.agent.judge.ranks import RankMerge, split_rank


def field_value(record, field: str):
    """``record[field]`` for a dotted ``field``, as a finite float (None otherwise)."""
    for part in field.split("."):
        if not isinstance(record, dict) or part not in record:
            return None
        record = record[part]
    if isinstance(record, bool) or not isinstance(record, (int, float)):
        return None
    value = float(record)
    return value if math.isfinite(value) else None


def parse_record(line: bytes, field: str, step_field: str | None):
    """One JSONL line as a (value, step) sample, or None."""
    try:
        rec = jsonl.loads(line)  # a trainer's line nested deep is no sample, never a RecursionError
    except ValueError:
        return None
    value = field_value(rec, field)
    if value is None:
        return None
    step = field_value(rec, step_field) if step_field else None
    return value, (int(step) if step is not None else None)


def lines_holding(whole: str, needles) -> list:
    """The indices of the lines of ``whole`` (lines joined by one newline each, no newline
    inside a line) that hold one of ``needles`` (none holds a newline), in order: found by
    ``str.find`` over the whole text, each hit's line counted from the newlines before it,
    rather than one test per line (``lower()`` of each line: the most of a read's cost at
    1,000 lines/s after the parse). ``lower()`` keeps the newlines where they were relative
    to the lines (no character lowers into or out of one, and no case rule reaches across
    one), so the lowered whole holds line i's lowered text between its newlines i-1 and i."""
    found = set()
    for n in needles:
        pos, line, at = whole.find(n), 0, 0
        while pos >= 0:
            line += whole.count("\n", at, pos)
            found.add(line)
            at = whole.find("\n", pos + len(n))
            if at < 0:
                break
            pos = whole.find(n, at)
    return sorted(found)


class LineSource:
    """Output lines through a parser; rank prefixes ([rank3]:) are taken off first and
    per-rank values merged by ``throughput.ranks`` (agent/judge/ranks.py)."""

    def __init__(self, parse_tps, parse_step=None, ranks: str = "first"):
        self.parse_tps, self.parse_step = parse_tps, parse_step
        self.timed = bool(getattr(parse_tps, "timed", False))
        self.merge = RankMerge(ranks)

    def from_line(self, line: str, t=None):
        """A sample or None; ``t``, the line's time, for a parser that reads a rate from a
        counter over time (``timed``: throughput.StepRate)."""
        rank, text = split_rank(line) if line[:1] in ("[", "r", " ") else (None, line)
        value = self.parse_tps(text, t) if self.timed else self.parse_tps(text)
        if value is None:
            return None
        return self.merge.add(rank, value, self.parse_step(text) if self.parse_step else None)

    def candidates(self, lines) -> list:
        """The indices of ``lines`` that ``from_line`` may take a sample from, in order: every
        other line gives None and leaves the rank merge as it was, so skipping it changes
        nothing. One test per line (the parser's ``hints``) instead of the rank split and
        the parse; a line with an escape sequence (stripped before parsing) always counts."""
        hints = getattr(self.parse_tps, "hints", None)
        if hints is None:
            return list(range(len(lines)))
        text = "\n".join(lines)
        if "\x1b" in text or "\x9b" in text:
            return list(range(len(lines)))
        lower, needles = hints
        whole = text.lower() if lower else text
        if not any(n in whole for n in needles):
            return []
        if whole.count("\n") != len(lines) - 1:  # a line holding a newline itself: one by one
            return [i for i, line in enumerate(lines)
                    if any(n in (line.lower() if lower else line) for n in needles)]
        return lines_holding(whole, needles)

    def poll(self) -> list:
        return []

    def position(self):
        return None


def line_source(tp: dict, scale: float = 1.0) -> LineSource:
    """The output-line source of a (defaults-completed) throughput section: the
    supervisor's and ``gpujob replay``'s, so both read lines alike (the regex's
    ``step`` group included)."""
    from gpujob.agent.judge import throughput
    return LineSource(throughput.make_parser(tp["format"], pattern=tp.get("pattern"),
                                             tokens_per_step=tp.get("tokens_per_step"), scale=scale),
                      throughput.make_step_parser(tp["format"], pattern=tp.get("pattern")),
                      tp.get("ranks") or "first")
