"""Failure classification of a trainer's output and exit (stdlib only, pure):
the spec's error signatures, CUDA OOM, NCCL timeouts, hardware and driver errors,
the OOM killer, and any other crash."""

from __future__ import annotations

import re
import signal as _signal
from typing import Optional, Sequence, Tuple

from gpujob.agent.base.protocol import FailureSignal as F
from gpujob.agent.judge.throughput import strip_ansi

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
# the seeds' race: threads compiling flex_attention at once on one cache; a restart on a
# warmer cache cures it, so it is told apart from the spec's error signatures (which it wins over)
_COMPILE_RACE = re.compile(r"Detected that you are using FX to symbolically trace a dynamo-optimized "
                           r"function|is_fx_symbolic_tracing\(\) is True")
_EXC_LINE = re.compile(r"\b\w*(?:Error|Exception|Interrupt)\b")
# words every match of these holds: a line (or a whole read) without them cannot match
_RACE_WORDS = ("symbolically trace", "is_fx_symbolic_tracing()")
_OOM_WORD = "emory"  # in each of _CUDA_OOM's alternatives


def find_signature(lines: Sequence[str], error_signatures: Sequence[str]) -> Optional[str]:
    """The first signature (earliest line, then spec order) found in ``lines``.

    Matching is a plain substring test on ANSI-stripped lines; empty
    signatures are ignored.
    """
    patterns = [s for s in error_signatures if s]
    if not patterns:
        return None
    for line in lines:
        text = strip_ansi(line)
        for pattern in patterns:
            if pattern in text:
                return pattern
    return None


def scan_line(line: str, error_signatures: Sequence[str]) -> Optional[str]:
    """Live check of one log line: 'compile_race', 'error_signature', 'cuda_oom' or None.

    Called for every line a trainer prints (1,000 a second is common), so it strips
    the line once and tries each regex only on lines that can match it."""
    text = strip_ansi(line)
    if any(w in text for w in _RACE_WORDS) and _COMPILE_RACE.search(text):
        return F.COMPILE_RACE
    for pattern in error_signatures:
        if pattern and pattern in text:
            return F.ERROR_SIGNATURE
    if _OOM_WORD in text and _CUDA_OOM.search(text):
        return F.CUDA_OOM
    return None


def may_hit(text: str, error_signatures: Sequence[str]) -> bool:
    """False when :func:`scan_line` finds nothing in any line of ``text`` (lines joined
    by newlines): each line is a piece of ``text``, and without an escape sequence
    stripping leaves a line as it is, so a word absent from ``text`` is in no line.
    True means "maybe": scan the lines one by one. One pass over a whole read instead of
    one call per line."""
    if "\x1b" in text or "\x9b" in text or _OOM_WORD in text or any(w in text for w in _RACE_WORDS):
        return True
    return any(pattern and pattern in text for pattern in error_signatures)


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
    sig: Optional[int],
    log_tail: Sequence[str],
    error_signatures: Sequence[str],
    *,
    log_name: str = "train.log",
) -> Tuple[str, str]:
    """Classify how the trainer ended (``sig``: the OS signal that killed it, if
    known): ``(failure, reason)``.

    ``failure`` is one of ``ok`` (return code 0 and no signal: a clean
    exit is ok even if a signature was printed — live detection is
    :func:`scan_line`'s job), ``error_signature`` (a spec signature in the
    tail; wins over everything else), ``cuda_oom``, ``driver_mismatch``,
    ``nccl_timeout``, ``hw_error`` (an Xid or ECC line), ``oom_killed``
    (SIGKILL: signal 9, exit -9 or 137) or ``crash`` (any other failure,
    including an unknown exit status).
    """
    if returncode == 0 and sig is None:
        return "ok", "exited with code 0"
    how, sig = _exit_text(returncode, sig)
    lines = [strip_ansi(l) for l in log_tail]
    race = next((l for l in lines if _COMPILE_RACE.search(l)), None)
    if race is not None:
        return F.COMPILE_RACE, f"compile race ({how}): {_clip(race)}"
    found = find_signature(lines, error_signatures)
    if found is not None:
        return F.ERROR_SIGNATURE, f"error signature {found!r} in {log_name} ({how})"
    oom = next((l for l in reversed(lines) if _CUDA_OOM.search(l)), None)
    if oom is not None:
        return F.CUDA_OOM, f"CUDA out of memory ({how}): {_clip(oom)}"
    for name, rx, what in ((F.DRIVER_MISMATCH, _DRIVER_MISMATCH, "driver/library mismatch"),
                           (F.NCCL_TIMEOUT, _NCCL_TIMEOUT, "NCCL timeout"),
                           (F.HW_ERROR, _HW_ERROR, "GPU hardware error")):
        hit = next((l for l in reversed(lines) if rx.search(l)), None)
        if hit is not None:
            return name, f"{what} ({how}): {_clip(hit)}"
    if sig == _signal.SIGKILL:
        return F.OOM_KILLED, f"{how}, likely the OOM killer"
    last = next((l for l in reversed(lines) if _EXC_LINE.search(l)), None)
    if last is None:
        last = next((l for l in reversed(lines) if l.strip()), None)
    return F.CRASH, f"{how}: {_clip(last)}" if last else how
