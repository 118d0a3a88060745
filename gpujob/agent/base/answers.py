"""Answers that stay bounded whatever the container holds (stdlib only). The controller takes
at most 8 MiB from one answer (transport/base.py MAX_ANSWER) and a user reads a screen, so a
verb that lists what grows with the container's data (checkpoints, job directories, venvs,
snapshots, a ledger's verdicts) lists at most a bounded number and says how many it left out
under ``more`` (``{list's key: count not listed}``); totals are worked out over all of them
before the cut."""

from __future__ import annotations

from typing import Callable, Optional

LIST_MAX = 200  # rows of a listing (gc, cache ls, profiles)
HISTORY_MAX = 500  # verdicts of ``ledger history`` (the newest)
LEDGER_HISTORY = 20  # verdicts a ledger carries inside another answer (status, ledger show)


def cap(res: dict, key: str, n: int = LIST_MAX, *, first: Optional[Callable[[dict], bool]] = None,
        newest: bool = False) -> dict:
    """``res[key]`` cut to ``n`` rows (``first``: the rows it holds true for listed before the
    others; ``newest``: the last ``n``, for a list oldest first), the rest counted in
    ``res["more"][key]``. ``res`` itself, changed."""
    rows = res.get(key)
    if not isinstance(rows, list) or len(rows) <= n:
        return res
    if first is not None:
        rows = [r for r in rows if first(r)] + [r for r in rows if not first(r)]
    res[key] = rows[len(rows) - n:] if newest else rows[:n]
    res.setdefault("more", {})[key] = len(rows) - n
    return res


def ledger_view(led, n: int = LEDGER_HISTORY):
    """A ledger as another answer carries it: its profiles whole, the newest ``n`` verdicts of
    its history (``more``: how many older ones; ``gpujob ledger history`` lists them)."""
    if not isinstance(led, dict) or not isinstance(led.get("history"), list):
        return led
    return cap(dict(led), "history", n, newest=True)
