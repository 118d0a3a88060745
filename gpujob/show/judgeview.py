"""The judge's state as `gpujob status` writes it: rates that read apart, judging suspended."""

from __future__ import annotations

import time

from gpujob.agent.judge.throughput import fmt_rate


def rate_pair(a: float, b: float) -> tuple:
    """Two rates written so that different ones read different: ``1.21M`` and ``1.23M``, not
    ``1.2M < 1.2M`` (issue 38 item 5)."""
    x, y = fmt_rate(a), fmt_rate(b)
    if x == y and a != b:
        x, y = f"{a:,.0f}", f"{b:,.0f}"
    return x, y


def suspended_text(held: dict) -> str:
    """Judging suspended: why, since when, what brings it back (agent/supervisor/verdicts.py)."""
    since = held.get("since")
    when = time.strftime("%H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    base = held.get("baseline")
    back = (f"comes back when {held.get('profile')} holds the threshold of its baseline "
            f"{fmt_rate(base)} tok/s for good_after" if isinstance(base, (int, float))
            else "comes back when a new baseline holds for good_after")
    head = "no recovery; " if held.get("no_recovery") else ""
    return f"  since {when}: {head}{held.get('reason') or ''}; {back}"
