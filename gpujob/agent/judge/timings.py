"""How fast a rollback really returns to good training (stdlib only, pure).

From the decision on: the known-good trainer started (``trainer_start``), printed
its first throughput sample (``first_sample``), its first sample at or above the
threshold (``first_good``), and the policy's first ``ok`` verdict (``first_ok``).
Each is seconds after the decision, kept in the rollback's record (state.json,
``status``) and journalled as a ``rollback_timing`` event when it happens.
"""

from __future__ import annotations

from gpujob.agent.base.protocol import Verdict

MARKS = ("trainer_start", "first_sample", "first_good", "first_ok")


def on_sample(rec: dict, t: float, value: float, threshold, verdict: str) -> list:
    """Update a rollback record with one sample of the trainer it started; returns
    the marks newly reached (name, seconds after the decision)."""
    marks = rec.setdefault("timings", {})
    new = []

    def mark(name: str) -> None:
        if name not in marks:
            marks[name] = round(t - rec["decided_at"], 3)
            new.append((name, marks[name]))
    mark("first_sample")
    if threshold is None or value >= threshold:
        mark("first_good")
    if verdict == Verdict.OK:
        mark("first_ok")
    return new


def pending(rec: dict | None) -> bool:
    """Whether a rollback still waits for one of its marks."""
    if not rec:
        return False
    return "running_at" in rec and "first_ok" not in (rec.get("timings") or {})


def describe(rec: dict) -> str:
    """'start 0.21s, sample 2.9s, good 2.9s, ok 6.1s' (what has happened so far)."""
    marks = rec.get("timings") or {}
    names = {"trainer_start": "start", "first_sample": "sample", "first_good": "good", "first_ok": "ok"}
    return ", ".join(f"{names[m]} {marks[m]:.2f}s" for m in MARKS if m in marks) or "-"
