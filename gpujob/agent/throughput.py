"""Throughput watch for the in-container supervisor: log parsing, failure
classification and the rollback policy.

Stdlib only, Python >= 3.9, and pure: no I/O and no clock reads (callers pass
``now``).  The supervisor feeds trainer output through :class:`LineSplitter`,
turns lines into tok/s samples with :func:`make_parser`, and asks
:func:`decide` what to do after every sample.  The policy is modelled on Argo
Rollouts' analysis runs: an initial delay, a sliding window (median of the last
N samples), and a failure limit of consecutive breaching windows before acting.
"""

from __future__ import annotations

import math
import re
import signal as _signal
from dataclasses import dataclass, field
from statistics import median
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from gpujob.agent.protocol import Verdict

__all__ = [
    "FORMATS",
    "LineSplitter",
    "strip_ansi",
    "make_parser",
    "make_step_parser",
    "scan_line",
    "find_signature",
    "classify_exit",
    "Sample",
    "PolicyConfig",
    "Decision",
    "threshold",
    "decide",
    "known_good",
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


# --------------------------------------------------------------------------
# Throughput and step parsers
# --------------------------------------------------------------------------

FORMATS = ("ktok", "torchtitan", "tqdm", "hf", "regex")

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


def _finite(v: float) -> Optional[float]:
    return v if math.isfinite(v) else None


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
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown throughput format {fmt!r} (expected one of {', '.join(FORMATS)})")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError("scale must be a positive number")
    if tokens_per_step is not None and not (tokens_per_step > 0 and math.isfinite(tokens_per_step)):
        raise ValueError("tokens_per_step must be a positive number")
    if pattern is not None and fmt != "regex":
        raise ValueError("pattern is only used with fmt='regex'")
    if tokens_per_step is not None and fmt not in ("tqdm", "regex"):
        raise ValueError(f"tokens_per_step is not used with fmt={fmt!r}")

    if fmt == "ktok":

        def parse(line: str) -> Optional[float]:
            text = strip_ansi(line)
            if "tok" not in text.lower():  # every match holds tok(ens)/s: skip the regex
                return None
            m = _KTOK.search(text)
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
            m = _TQDM.search(strip_ansi(line))
            if not m:
                return None
            rate = float(m.group(1)) * _TQDM_SI[m.group(2)]
            if m.group(3) == "s/it":
                if rate <= 0:
                    return None
                rate = 1.0 / rate
            return _finite(rate * tps * scale)

    elif fmt == "hf":

        def parse(line: str) -> Optional[float]:
            m = _HF.search(strip_ansi(line))
            return _finite(float(m.group(1)) * scale) if m else None

    else:  # regex
        if not pattern:
            raise ValueError("fmt='regex' needs a pattern with a named group 'value'")
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"bad throughput pattern {pattern!r}: {e}") from None
        if "value" not in rx.groupindex:
            raise ValueError(f"throughput pattern {pattern!r} has no named group 'value'")
        has_unit = "unit" in rx.groupindex
        mult = scale * (tokens_per_step if tokens_per_step is not None else 1.0)

        def parse(line: str) -> Optional[float]:
            m = rx.search(strip_ansi(line))
            if not m or m.group("value") is None:
                return None
            unit = ((m.group("unit") or "") if has_unit else "").strip().lower()
            if unit not in _SUFFIX:
                return None
            try:
                value = _num(m.group("value").strip())
            except ValueError:
                return None
            return _finite(value * _SUFFIX[unit] * mult)

    return parse


_STEP_TEXT = re.compile(r"(?<!\w)step\s*[:=]?\s*(\d+)(?![\d.])", re.IGNORECASE)
_STEP_TQDM = re.compile(r"(?<![\w.])(\d+)(?:/\d+|it)\s*\[")
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
    step_rx = {"ktok": _STEP_TEXT, "torchtitan": _STEP_TEXT, "tqdm": _STEP_TQDM, "hf": _STEP_HF}[fmt]

    def parse(line: str) -> Optional[int]:
        m = step_rx.search(strip_ansi(line))
        return int(m.group(1)) if m else None

    return parse


# --------------------------------------------------------------------------
# Failure classification
# --------------------------------------------------------------------------

_CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory")
# failures a restart on the same wheels may cure (the job goes on) or never can
_NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|NCCL (?:watchdog )?timeout|"
                           r"ProcessGroupNCCL.*(?:timed out|Timeout)", re.IGNORECASE)
_HW_ERROR = re.compile(r"\bXid\b|uncorrectable ECC error|ECC error encountered|GPU has fallen off the bus")
_DRIVER_MISMATCH = re.compile(r"Driver/library version mismatch|CUDA driver version is insufficient|"
                              r"NVML library version mismatch")
_EXC_LINE = re.compile(r"\b\w*(?:Error|Exception|Interrupt)\b")


def find_signature(lines: Sequence[str], error_signatures: Sequence[str]) -> Optional[str]:
    """The first signature (earliest line, then spec order) found in ``lines``.

    Matching is a plain substring test on ANSI-stripped lines; empty
    signatures are ignored.
    """
    sigs = [s for s in error_signatures if s]
    if not sigs:
        return None
    for line in lines:
        text = strip_ansi(line)
        for sig in sigs:
            if sig in text:
                return sig
    return None


def scan_line(line: str, error_signatures: Sequence[str]) -> Optional[str]:
    """Live check of one log line: 'error_signature', 'cuda_oom' or None."""
    if find_signature([line], error_signatures) is not None:
        return "error_signature"
    if _CUDA_OOM.search(strip_ansi(line)):
        return "cuda_oom"
    return None


def _signal_name(n: int) -> str:
    try:
        return _signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _exit_text(returncode: Optional[int], sig: Optional[int]) -> Tuple[str, Optional[int]]:
    """Describe how the process ended; returns (text, signal number or None).

    Negative return codes (Python's subprocess) and shell-style 128+N codes
    are read as "killed by signal N".
    """
    if sig is None and returncode is not None:
        if returncode < 0:
            sig = -returncode
        elif 128 < returncode <= 128 + 64:
            sig = returncode - 128
    if sig is not None:
        detail = f"exit {returncode}" if returncode is not None and returncode > 0 else f"signal {sig}"
        return f"killed by {_signal_name(sig)} ({detail})", sig
    if returncode is None:
        return "exit status unknown", None
    return f"exited with code {returncode}", None


def _clip(s: str, n: int = 200) -> str:
    s = s.strip()
    return s if len(s) <= n else s[: n - 1] + "…"


def classify_exit(
    returncode: Optional[int],
    signal: Optional[int],
    log_tail: Sequence[str],
    error_signatures: Sequence[str],
    *,
    log_name: str = "train.log",
) -> Tuple[str, str]:
    """Classify how the trainer ended: ``(signal_name, reason)``.

    ``signal_name`` is one of ``ok`` (return code 0 and no signal: a clean
    exit is ok even if a signature was printed — live detection is
    :func:`scan_line`'s job), ``error_signature`` (a spec signature in the
    tail; wins over everything else), ``cuda_oom``, ``driver_mismatch``,
    ``nccl_timeout``, ``hw_error`` (an Xid or ECC line), ``oom_killed``
    (SIGKILL: signal 9, exit -9 or 137) or ``crash`` (any other failure,
    including an unknown exit status).
    """
    if returncode == 0 and signal is None:
        return "ok", "exited with code 0"
    how, sig = _exit_text(returncode, signal)
    lines = [strip_ansi(l) for l in log_tail]
    found = find_signature(lines, error_signatures)
    if found is not None:
        return "error_signature", f"error signature {found!r} in {log_name} ({how})"
    oom = next((l for l in reversed(lines) if _CUDA_OOM.search(l)), None)
    if oom is not None:
        return "cuda_oom", f"CUDA out of memory ({how}): {_clip(oom)}"
    for name, rx, what in (("driver_mismatch", _DRIVER_MISMATCH, "driver/library mismatch"),
                           ("nccl_timeout", _NCCL_TIMEOUT, "NCCL timeout"),
                           ("hw_error", _HW_ERROR, "GPU hardware error")):
        hit = next((l for l in reversed(lines) if rx.search(l)), None)
        if hit is not None:
            return name, f"{what} ({how}): {_clip(hit)}"
    if sig == _signal.SIGKILL:
        return "oom_killed", f"{how}, likely the OOM killer"
    last = next((l for l in reversed(lines) if _EXC_LINE.search(l)), None)
    if last is None:
        last = next((l for l in reversed(lines) if l.strip()), None)
    return "crash", f"{how}: {_clip(last)}" if last else how


# --------------------------------------------------------------------------
# Policy
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    t: float
    value: float
    step: Optional[int] = None


@dataclass(frozen=True)
class PolicyConfig:
    """Throughput policy.

    ``initial_delay_samples`` counts *samples*, not trainer steps: step
    counters restart or jump on resume from a checkpoint, while the warm-up
    (compilation, cache fill) happens on every start.  ``no_data_timeout``
    None disables stall detection.
    """

    min: Optional[float] = None  # absolute tok/s
    min_ratio: Optional[float] = None  # of baseline
    window: int = 5  # median of the last N samples
    failure_limit: int = 3  # consecutive breaching windows before acting
    initial_delay: float = 0.0  # seconds after phase start: samples ignored
    initial_delay_samples: int = 0  # then ignore the first K samples too
    no_data_timeout: Optional[float] = 600.0  # no sample for that long = stall
    good_after: float = 600.0  # held above threshold this long = known-good

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


# --------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------

_UNITS = ((1.0, ""), (1e3, "K"), (1e6, "M"), (1e9, "G"), (1e12, "T"))


def _short(x: float) -> str:
    s = f"{x:.1f}" if x < 100 else f"{x:.0f}"
    return s[:-2] if s.endswith(".0") else s


def fmt_rate(v: float) -> str:
    """12800 → '12.8K', 4300 → '4.3K', 1_200_000 → '1.2M', 950 → '950'."""
    if not math.isfinite(v):
        return str(v)
    sign, a = ("-" if v < 0 else ""), abs(v)
    i = max((k for k, (div, _) in enumerate(_UNITS) if a >= div), default=0)
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
        vals = [sum(vals[i * n // width : (i + 1) * n // width]) / ((i + 1) * n // width - i * n // width) for i in range(width)]
    lo, hi = min(vals), max(vals)
    if hi <= lo:
        return _BARS[3] * len(vals)
    return "".join(_BARS[min(7, int((v - lo) / (hi - lo) * 8))] for v in vals)
