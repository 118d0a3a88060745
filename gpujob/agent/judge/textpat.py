"""Text patterns the throughput parsers share (stdlib only, pure): escape sequences, and the
shape of a tqdm bar (its step counter; bars of other work)."""

from __future__ import annotations

import math
import re
from typing import Optional

_ANSI = re.compile(
    r"""
      \x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?      # OSC ... BEL | ST
    | \x1b[P^_X][^\x1b]*(?:\x1b\\)?           # DCS / PM / APC / SOS ... ST
    | (?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]        # CSI (colours, cursor moves)
    | \x1b[ -/]*[0-~]                         # other ESC sequences
    | \x1b                                    # stray ESC
    """,
    re.VERBOSE,
)


def strip_ansi(s: str) -> str:
    """Remove ANSI escape sequences (CSI, OSC, DCS, two-char ESC)."""
    if "\x1b" not in s and "\x9b" not in s:  # every sequence starts with one of them
        return s
    return _ANSI.sub("", s)


def _finite(v: float) -> Optional[float]:
    return v if math.isfinite(v) else None


# Bars that are not the trainer's steps (issue 33 item 4): a description naming other work
# (HF's save: "Writing model shards: 100%|...| 1/1 [00:00<00:00, 11.32it/s]", datasets'
# "Map:", "Loading checkpoint shards:", Lightning's "Validation DataLoader 0:"), or a bar of
# one item (a shard, a file). The trainer's own bar has no description (HF) or "Epoch N".
_TQDM_OTHER = re.compile(
    r"(?i)^\s*[^|]*?(?:writ|load|sav|map|filter|tokeni[sz]|generat|download|upload|valid|eval|test|predict|"
    r"shard|convert|process)[^|]*?:\s*\d+%\|"
    r"|\|\s*[01]/1\s*\[")

_STEP_TQDM = re.compile(r"(?<![\w.])(\d+)(?:/\d+|/\?|it)\s*\[")


# what may stand between a match's start and its first "tok": the number and the spacer
# (digits , . e E + -, a K/M/G suffix, whitespace); more than the regex takes is harmless
_BEFORE_UNIT = "0123456789.,eE+-kKmMgG \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"


def ktok_from(text: str, at: int) -> int:
    """Where ``_KTOK.search`` may start on ``text`` whose first "tok" (any case) is at ``at``
    and find the same first match as from 0: every match holds a "tok" and starts at it or
    at the number right before it, which holds no "tok"; so no match starts before the run
    of number characters ending at the first one (the lookbehinds still see what lies
    before: ``search(text, pos)`` is not a slice). ``at`` is a position in ``text.lower()``:
    the same one only for ASCII text (else 0, the whole line). At 1,000 lines/s the search
    over the whole line, from each digit of its timestamp, was most of a sample's parse."""
    if not text.isascii():
        return 0
    return len(text[:at].rstrip(_BEFORE_UNIT))
