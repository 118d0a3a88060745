"""``tqdm_steps``: a rate read from a progress bar's own step counter over time (stdlib only;
agent/judge/throughput.py's ``make_parser`` builds it)."""

from __future__ import annotations

from typing import Optional, Tuple

from gpujob.agent.judge.textpat import _STEP_TQDM, _TQDM_OTHER, _finite, strip_ansi


class StepRate:
    """``tqdm_steps``: the rate read from a bar's own step counter over the lines' times, not
    from the it/s it prints (issue 38 row 2). Lightning draws its bar with ``smoothing=0``
    (its it/s is the run's average: after an hour at 65 it/s a fall to 13 it/s keeps it above
    0.8x for 20 minutes) and counts restored steps in ``n`` (a resumed run's first rate is
    hundreds of steps in its first second); it also draws each step twice (the count, then
    the same with ``v_num=…, loss=…``). So: a sample is ``(n - n0) / (t - t0)`` over at least
    ``SPAN`` seconds since the last one; the same ``n`` again is no step; the first counter of
    a run (restored steps and all), its first move (the start-up's step) and a counter that
    went back (a new epoch's bar) only set the reference. Called with the line's time
    (``timed``); without one it gives nothing."""

    SPAN = 0.5
    timed = True

    def __init__(self, tokens_per_step: float) -> None:
        self.tps = float(tokens_per_step)
        self.ref: Optional[Tuple[float, int]] = None  # (t, n) the next sample counts from
        self.last_n: Optional[int] = None
        self.fresh = True
        self.hints: Optional[tuple] = None  # throughput.make_parser sets its prefilter

    def __call__(self, line: str, t: Optional[float] = None) -> Optional[float]:
        text = strip_ansi(line)
        if "|" not in text or _TQDM_OTHER.search(text):
            return None
        m = _STEP_TQDM.search(text)
        if not m or t is None:
            return None
        n = int(m.group(1))
        if self.ref is None or self.last_n is None or n < self.last_n:
            self.ref, self.last_n, self.fresh = (t, n), n, True
            return None
        if n == self.last_n:
            return None  # the same step drawn again
        self.last_n = n
        if self.fresh:  # the counter's first move holds the start-up (compile, the first batch)
            self.ref, self.fresh = (t, n), False
            return None
        t0, n0 = self.ref
        if t - t0 < self.SPAN:
            return None
        self.ref = (t, n)
        return _finite((n - n0) / (t - t0) * self.tps)
