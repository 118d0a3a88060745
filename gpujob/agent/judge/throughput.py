"""Throughput from the trainer's output: line splitting, the tok/s and step
parsers of each log format, and the formatting of rates. Failure classification
is in signals.py, the rollback policy in policy.py.

Stdlib only, Python >= 3.9, and pure: no I/O.  The supervisor feeds trainer
output through :class:`LineSplitter`, turns lines into tok/s samples with
:func:`make_parser`, and asks :func:`gpujob.agent.judge.policy.decide` what to do after
every sample.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Callable, List, Optional, Sequence

from gpujob.agent.judge.steprate import StepRate
# strip_ansi: its home for callers
from gpujob.agent.judge.textpat import _STEP_TQDM, _TQDM_OTHER, _finite, ktok_from, strip_ansi  # noqa: F401

__all__ = [
    "FORMATS",
    "LineSplitter",
    "strip_ansi",
    "make_parser",
    "make_step_parser",
    "fmt_rate",
    "sparkline",
]

# --------------------------------------------------------------------------
# Line splitting
# --------------------------------------------------------------------------

_EOL = re.compile(rb"\r\n|\r|\n")


class LineSplitter:
    """Split a byte stream into text lines.

    ``\\n``, ``\\r`` and ``\\r\\n`` each end one line (tqdm redraws its bar
    with a bare ``\\r``).  A ``\\r`` that ends one chunk ends the line at once;
    a ``\\n`` starting the next chunk is then swallowed so a split ``\\r\\n``
    still counts once.  Lines (and an unterminated tail) longer than
    ``max_line`` bytes are emitted in pieces of at most ``max_line`` bytes, cut
    on a UTF-8 character boundary, so a trainer that never prints a newline
    cannot grow the buffer without bound.  Empty lines are emitted as ``''``.
    """

    def __init__(self, max_line: int = 64 * 1024) -> None:
        if max_line < 4:
            raise ValueError("max_line must be >= 4 bytes")
        self.max_line = max_line
        self._buf = b""  # partial line; never contains \r or \n
        self._skip_lf = False

    def feed(self, data: bytes) -> List[str]:
        if not data:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if data[:1] == b"\n":
                data = data[1:]
        if b"\r" not in data:  # the common case: one decode and one split for the whole read
            fast = self._feed_lf(data)
            if fast is not None:
                return fast
        out: List[str] = []
        pos = 0
        for m in _EOL.finditer(data):
            self._emit(self._buf + data[pos:m.start()], out)
            self._buf = b""
            pos = m.end()
        if pos == len(data) and data.endswith(b"\r"):
            self._skip_lf = True
        rest = self._buf + data[pos:]
        while len(rest) > self.max_line:
            cut = self._cut(rest)
            out.append(rest[:cut].decode("utf-8", "replace"))
            rest = rest[cut:]
        self._buf = rest
        return out

    def _feed_lf(self, data: bytes) -> Optional[List[str]]:
        """``feed`` for data without ``\\r`` when no piece needs cutting: the same lines
        (decoding at ``\\n`` boundaries or across them gives the same text: ``\\n`` is
        never part of a multi-byte sequence), or None, state untouched, to take the
        line-by-line way."""
        last = data.rfind(b"\n")
        if last < 0:
            rest = self._buf + data
            if len(rest) > self.max_line:
                return None
            self._buf = rest
            return []
        rest = data[last + 1:]
        if len(rest) > self.max_line:
            return None
        head = self._buf + data[:last]
        lines = head.decode("utf-8", "replace").split("\n")
        # a line of n characters holds at most 4n bytes
        if len(head) > self.max_line and max(map(len, lines)) * 4 > self.max_line:
            return None
        self._buf = rest
        return lines

    def flush(self) -> List[str]:
        """Return the unterminated tail (if any) and reset."""
        out: List[str] = []
        if self._buf:
            self._emit(self._buf, out)
        self._buf = b""
        self._skip_lf = False
        return out

    def _emit(self, line: bytes, out: List[str]) -> None:
        while len(line) > self.max_line:
            cut = self._cut(line)
            out.append(line[:cut].decode("utf-8", "replace"))
            line = line[cut:]
        out.append(line.decode("utf-8", "replace"))

    def _cut(self, b: bytes) -> int:
        cut = self.max_line
        # Back off over UTF-8 continuation bytes (at most 3) to a char start.
        while cut > self.max_line - 3 and (b[cut] & 0xC0) == 0x80:
            cut -= 1
        return cut


# --------------------------------------------------------------------------
# Throughput and step parsers
# --------------------------------------------------------------------------

FORMATS = ("ktok", "torchtitan", "tqdm", "tqdm_steps", "hf", "regex")

# A number: 12800, 12,800, 12.8, .5, 1.28e4.  Not preceded by a word char,
# '.' or '/', so '12/1000' or 'v1.2' never yields a stray tail.
_NUM = r"(?<![\w./])((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?|\.\d+)"
_PLAIN = r"(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)"
_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}
_TOKUNIT = r"tok(?:ens)?/s(?:ec)?"

_KTOK = re.compile(
    # "12.8K tok/s", "20 Ktok/s", "4.3k tokens/s", "12,800 tokens/sec";
    # not "... tok/s: 12.8K" (that number is a different field) nor tok/s/gpu.
    rf"{_NUM}\s?([kmg])?\s?{_TOKUNIT}(?![\w/])(?!\s*[:=])"
    # "tok/s: 12.8K", "tok/s=12800"
    rf"|(?<!\w){_TOKUNIT}\s*[:=]\s*{_NUM}\s?([kmg])?(?!\w)",
    re.IGNORECASE,
)
_TORCHTITAN = re.compile(rf"(?<!\w)(?:tps|wps)\s*:\s*{_NUM}\s?([kmg])?(?!\w)", re.IGNORECASE)
# tqdm rate inside "[elapsed<remaining, 1.64it/s, ...]"; SI prefix with unit_scale.
_TQDM = re.compile(rf"(?:(?<=[\s,\[])|^){_PLAIN}([kMGT]?)(it/s|s/it)(?![\w/])")
_TQDM_SI = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_HF = re.compile(
    rf"""['"](?:train_)?tokens_per_second['"]\s*:\s*(?:np\.float(?:16|32|64)\()?{_PLAIN}"""
)


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def make_parser(
    fmt: str,
    *,
    pattern: Optional[str] = None,
    tokens_per_step: Optional[float] = None,
    scale: float = 1.0,
) -> Callable[[str], Optional[float]]:
    """Return ``parse(line) -> tok/s | None`` for a log format.

    All presets strip ANSI codes first; the first match on a line wins; the
    result is multiplied by ``scale`` (e.g. the GPU count for per-GPU rates).

    * ``ktok``: ``12.8K tok/s``, ``20 Ktok/s``, ``4300 tokens/sec``,
      ``tok/s: 12.8K``, ``tok/s=12800``; K/M/G suffix, any case.  Per-GPU
      ``tok/s/gpu`` and non-token units (``12.8Kb/s``, ``tok/step``) do not match.
    * ``torchtitan``: ``tps: 12,800`` (or the older ``wps:``).
    * ``tqdm``: ``1.64it/s`` → 1.64 × tokens_per_step, ``3.20s/it`` →
      tokens_per_step / 3.20 (required; ``?it/s`` → None).
    * ``hf``: ``'train_tokens_per_second': 12800.0`` / ``"tokens_per_second": …``.
    * ``regex``: ``pattern`` with a named group ``value`` and optional ``unit``
      (K/M/G, any case; another unit → None); commas stripped.  Here
      ``tokens_per_step``, when given, multiplies the value (a steps/s pattern).
      A group ``ms`` or ``seconds`` instead of ``value`` is a time per step:
      tok/s = tokens_per_step / time (nanoGPT's ``time 52.1ms``); ``unit``
      still scales the result.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown throughput format {fmt!r} (expected one of {', '.join(FORMATS)})")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError("scale must be a positive number")
    if tokens_per_step is not None and not (tokens_per_step > 0 and math.isfinite(tokens_per_step)):
        raise ValueError("tokens_per_step must be a positive number")
    if pattern is not None and fmt != "regex":
        raise ValueError("pattern is only used with fmt='regex'")
    if tokens_per_step is not None and fmt not in ("tqdm", "tqdm_steps", "regex"):
        raise ValueError(f"tokens_per_step is not used with fmt={fmt!r}")

    if fmt == "ktok":

        def parse(line: str) -> Optional[float]:
            text = strip_ansi(line)
            at = text.lower().find("tok")
            if at < 0:  # every match holds tok(ens)/s: skip the regex
                return None
            m = _KTOK.search(text, ktok_from(text, at))
            if not m:
                return None
            value, unit = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            return _finite(_num(value) * _SUFFIX[(unit or "").lower()] * scale)

    elif fmt == "torchtitan":

        def parse(line: str) -> Optional[float]:
            m = _TORCHTITAN.search(strip_ansi(line))
            if not m:
                return None
            return _finite(_num(m.group(1)) * _SUFFIX[(m.group(2) or "").lower()] * scale)

    elif fmt == "tqdm":
        if tokens_per_step is None:
            raise ValueError("fmt='tqdm' needs tokens_per_step (tqdm counts steps, not tokens)")
        tps = tokens_per_step

        def parse(line: str) -> Optional[float]:
            text = strip_ansi(line)
            m = _TQDM.search(text)
            if not m or _TQDM_OTHER.search(text):
                return None
            rate = float(m.group(1)) * _TQDM_SI[m.group(2)]
            if m.group(3) == "s/it":
                if rate <= 0:
                    return None
                rate = 1.0 / rate
            return _finite(rate * tps * scale)

    elif fmt == "tqdm_steps":
        if tokens_per_step is None:
            raise ValueError("fmt='tqdm_steps' needs tokens_per_step (tqdm counts steps, not tokens)")
        counter = StepRate(tokens_per_step * scale)
        counter.hints = _HINTS["tqdm_steps"]
        return counter

    elif fmt == "hf":

        def parse(line: str) -> Optional[float]:
            m = _HF.search(strip_ansi(line))
            return _finite(float(m.group(1)) * scale) if m else None

    else:  # regex
        if not pattern:
            raise ValueError("fmt='regex' needs a pattern with a named group 'value', 'ms' or 'seconds'")
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"bad throughput pattern {pattern!r}: {e}") from None
        group = next((g for g in ("value", "ms", "seconds") if g in rx.groupindex), None)
        if group is None:
            raise ValueError(f"throughput pattern {pattern!r} has no named group 'value', 'ms' or 'seconds'")
        if group != "value" and tokens_per_step is None:
            raise ValueError(f"a pattern with (?P<{group}>...) needs tokens_per_step (tok/s = tokens / time)")
        has_unit = "unit" in rx.groupindex
        per = {"ms": 1e-3, "seconds": 1.0}.get(group)  # time per step, in seconds per unit
        mult = scale * (tokens_per_step if tokens_per_step is not None else 1.0)

        def parse(line: str) -> Optional[float]:
            m = rx.search(strip_ansi(line))
            if not m or m.group(group) is None:
                return None
            unit = ((m.group("unit") or "") if has_unit else "").strip().lower()
            if unit not in _SUFFIX:
                return None
            try:
                value = _num(m.group(group).strip())
            except ValueError:
                return None
            if per is not None:  # time per step: tokens_per_step / seconds
                if value <= 0:
                    return None
                value = 1.0 / (value * per)
            return _finite(value * _SUFFIX[unit] * mult)

    # what every line this parser can read holds (a prefilter for a batch of lines,
    # agent/judge/sources.py): ``(lower, needles)``, a line is a candidate when one of
    # ``needles`` is in it (in ``line.lower()`` when ``lower``); None: every line is one
    parse.hints = _HINTS.get(fmt)  # type: ignore[attr-defined]  # a function's own attribute: mypy knows none
    return parse


# ktok: its parser's own test; torchtitan: "tps"/"wps" under IGNORECASE, whose "s" also
# matches "ſ" (U+017F), so only the "tp"/"wp" that every match holds; tqdm and hf: case-sensitive
_HINTS = {"ktok": (True, ("tok",)), "torchtitan": (True, ("tp", "wp")), "tqdm": (False, ("it/s", "s/it")),
          "tqdm_steps": (False, ("it/s", "s/it")),
          "hf": (False, ("tokens_per_second",))}


_STEP_TEXT = re.compile(r"(?<!\w)step\s*[:=]?\s*(\d+)(?![\d.])", re.IGNORECASE)

_STEP_HF = re.compile(r"""['"](?:global_)?step['"]\s*:\s*(\d+)""")


def make_step_parser(fmt: str, *, pattern: Optional[str] = None) -> Callable[[str], Optional[int]]:
    """Return ``parse(line) -> step | None``.

    ``ktok``/``torchtitan``: ``step: 10``, ``step 10``, ``step=10``;
    ``tqdm``: ``1234/10000 [`` (or ``1234it [``) → 1234; ``hf``: ``'step': 10``
    or ``'global_step': 10``; ``regex``: the named group ``step`` of
    ``pattern`` when it has one, else the parser always returns None.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown throughput format {fmt!r} (expected one of {', '.join(FORMATS)})")
    if fmt == "regex":
        rx = re.compile(pattern) if pattern else None
        if rx is None or "step" not in rx.groupindex:
            return lambda line: None

        def parse_rx(line: str) -> Optional[int]:
            m = rx.search(strip_ansi(line))
            s = m.group("step") if m else None
            return int(s) if s and s.isdigit() else None

        return parse_rx
    step_rx = {"ktok": _STEP_TEXT, "torchtitan": _STEP_TEXT, "tqdm": _STEP_TQDM, "tqdm_steps": _STEP_TQDM,
               "hf": _STEP_HF}[fmt]

    def parse(line: str) -> Optional[int]:
        m = step_rx.search(strip_ansi(line))
        return int(m.group(1)) if m else None

    return parse


# --------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------

_UNITS = ((1.0, ""), (1e3, "K"), (1e6, "M"), (1e9, "G"), (1e12, "T"))


def _short(x: float) -> str:
    s = f"{x:.1f}" if x < 100 else f"{x:.0f}"
    return s[:-2] if s.endswith(".0") else s


@functools.lru_cache(maxsize=1024)  # a decision's reason formats its threshold every time
def fmt_rate(v: float) -> str:
    """12800 → '12.8K', 4300 → '4.3K', 1_200_000 → '1.2M', 950 → '950'."""
    if not math.isfinite(v):
        return str(v)
    sign, a = ("-" if v < 0 else ""), abs(v)
    i = 0
    for k in range(len(_UNITS) - 1, 0, -1):  # the largest unit not above it
        if a >= _UNITS[k][0]:
            i = k
            break
    s = _short(a / _UNITS[i][0])
    if float(s) >= 1000 and i + 1 < len(_UNITS):  # 999_960 → '1M', not '1000K'
        i += 1
        s = _short(a / _UNITS[i][0])
    return f"{sign}{s}{_UNITS[i][1]}"


_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 40) -> str:
    """Unicode sparkline scaled min..max.

    More than ``width`` values are averaged into ``width`` buckets; fewer are
    drawn one character each (never stretched).  A flat series is drawn
    mid-height; non-finite values are dropped.
    """
    vals = [float(v) for v in values if math.isfinite(v)]
    if not vals or width < 1:
        return ""
    n = len(vals)
    if n > width:
        vals = [sum(vals[i * n // width : (i + 1) * n // width]) / ((i + 1) * n // width - i * n // width)
                for i in range(width)]
    lo, hi = min(vals), max(vals)
    if hi <= lo:
        return _BARS[3] * len(vals)
    return "".join(_BARS[min(7, int((v - lo) / (hi - lo) * 8))] for v in vals)
