"""What a job's supervisor waits for before it acts, as `status` shows it (state.json's ``waiting``)."""

from __future__ import annotations

from gpujob.agent.base.staterec import StateRecord


def waiting_line(rec: StateRecord, answer: dict) -> str | None:
    """What the supervisor waits for before it acts (a decided rollback held for a
    checkpoint, a stop for a save), how long so far and at most how long still."""
    w = rec.waiting if rec.finished_at is None else None
    if not isinstance(w, dict) or not isinstance(w.get("since"), (int, float)):
        return None
    clock = answer.get("now")
    since = max(0.0, clock - w["since"]) if isinstance(clock, (int, float)) else None
    limit = w.get("limit") if isinstance(w.get("limit"), (int, float)) else None
    line = f"{w.get('what', '?')} decided, waiting for {w.get('for', '?')}"
    if since is not None:
        line += f": {since:.0f}s so far"
        if limit is not None:
            line += f", {max(0.0, limit - since):.0f}s left at most"
    return line + (f" ({w['reason']})" if isinstance(w.get("reason"), str) else "")
