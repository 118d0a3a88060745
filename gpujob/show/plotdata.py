"""tok/s over time, as data (pure: journal records in, series out; no I/O).

``series(events, samples, status)`` turns a job's events.jsonl and samples.jsonl
records (and its status) into what ``gpujob plot`` draws: the samples, the
per-minute summaries older than the full-rate samples, the phases, the threshold
as it was decided, the known-good baselines of the ledger and each rollback.
Times are seconds since the job's first record. ``grid`` draws it for a terminal
(braille dots, one cell = 2 x 4 dots), also pure.
"""

from __future__ import annotations

import math
from typing import Any

from gpujob.agent.base.protocol import JobState
from gpujob.agent.judge.throughput import fmt_rate

PHASE_OF_STATE = {JobState.PREPARING: "prepare", JobState.WARMUP: "warmup", JobState.TRAINING: "train",
                  JobState.ROLLING_BACK: "rollback", JobState.STOPPING: "stop"}


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def series(events: list[dict], samples: list[dict], status: dict | None = None) -> dict:
    """The plotted series of one job (see the module doc)."""
    status = status or {}
    recs = [r for r in events + samples if isinstance(r, dict) and _num(r.get("t")) is not None]
    t0 = min((r["t"] for r in recs), default=0.0)
    end = max((r["t"] for r in recs), default=t0)

    def rel(t: float) -> float:  # seconds since the start, to the journal's millisecond
        return round(t - t0, 3)

    seen: set = set()
    points: list[dict[str, Any]] = []
    for r in sorted((r for r in recs if r.get("type") == "sample"), key=lambda r: r["t"]):
        v = _num(r.get("value"))
        if v is None or r["t"] in seen:
            continue
        seen.add(r["t"])
        points.append({"t": rel(r["t"]), "value": v, "profile": r.get("profile"),
                       "verdict": r.get("verdict")})
    first = points[0]["t"] + t0 - 1e-6 if points else math.inf
    minutes = [{"t": rel(r["t"]), "since": rel(_num(r.get("since")) or r["t"]),
                "median": _num(r.get("median")),
                "min": _num(r.get("min")), "max": _num(r.get("max")), "n": r.get("n"),
                "profile": r.get("profile")}
               for r in events if r.get("type") == "samples_1m" and _num(r.get("t")) is not None
               and r["t"] < first and _num(r.get("median")) is not None]

    phases: list[dict] = []
    profile = None
    for r in sorted((r for r in events if r.get("type") == "state" and r.get("state")), key=lambda r: r["t"]):
        profile = r.get("profile") or profile
        if phases:
            phases[-1]["end"] = rel(r["t"])
        if r["state"] in PHASE_OF_STATE:
            phases.append({"start": rel(r["t"]), "end": None, "phase": PHASE_OF_STATE[r["state"]],
                           "profile": r.get("profile") if r["state"] != JobState.ROLLING_BACK else None})
    for p in phases:
        if p["end"] is None:
            p["end"] = rel(end)

    threshold: list[dict] = []
    for r in sorted((r for r in events if r.get("type") == "decision"), key=lambda r: r["t"]):
        ev = r.get("evidence") or {}
        v = _num(ev.get("threshold"))
        if v is not None and (not threshold or threshold[-1]["value"] != v):
            threshold.append({"t": rel(r["t"]), "value": v, "source": ev.get("threshold_source")})
    window = status.get("window") or {}
    if not threshold and _num(window.get("threshold")) is not None:
        threshold.append({"t": 0.0, "value": window["threshold"], "source": window.get("threshold_source")})

    baselines: dict[str, float] = {}
    for r in events:
        if r.get("type") == "known_good" and _num(r.get("baseline")) is not None and r.get("profile"):
            baselines[str(r["profile"])] = r["baseline"]
    for name, e in ((status.get("ledger") or {}).get("profiles") or {}).items():
        if isinstance(e, dict) and e.get("status") == "good" and _num(e.get("baseline")) is not None:
            baselines.setdefault(str(name), e["baseline"])

    rollbacks = [{"t": rel(_num(r.get("decided_at")) or r["t"]), "from": r.get("from"), "to": r.get("to"),
                  "signal": r.get("signal"), "reason": r.get("reason")}
                 for r in sorted((r for r in events if r.get("type") == "rollback"), key=lambda r: r["t"])]
    # pauses (checkpoint saves, pause_pattern lines): their samples were left out of the windows
    spans = {round(a, 3): b for a, b in (status.get("pauses") or [])
             if _num(a) is not None and _num(b) is not None}
    pauses = [{"start": rel(r["start"]),
               "end": rel(spans.get(round(r["start"], 3), r["start"] + 2.0 + (_num(r.get("tail")) or 0))),
               "why": r.get("why")}
              for r in sorted((r for r in events if r.get("type") == "pause"
                               and _num(r.get("start")) is not None),
                              key=lambda r: r["start"])]
    return {"job": status.get("job_id"), "name": status.get("name"), "state": status.get("state"),
            "t0": t0, "duration": rel(end), "points": points, "minutes": minutes, "phases": phases,
            "threshold": threshold, "baselines": baselines, "rollbacks": rollbacks, "pauses": pauses}


def rollback_label(r: dict) -> str:
    why = f" ({r['signal']})" if r.get("signal") else ""
    return f"rollback {r.get('from')} → {r.get('to')}{why}"


def threshold_label(th: dict) -> str:
    return f"threshold {fmt_rate(th['value'])} tok/s" + (f" ({th['source']})" if th.get("source") else "")


def y_max(s: dict) -> float:
    vals = [p["value"] for p in s["points"]] + [m["max"] or m["median"] for m in s["minutes"]]
    vals += [th["value"] for th in s["threshold"]] + list(s["baselines"].values())
    return max(vals, default=1.0) * 1.08 or 1.0


# ---- the terminal plot --------------------------------------------------------

_DOT = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))  # braille dot bits by (row, col)
PHASE_CHAR = {"prepare": "p", "warmup": "w", "train": "t", "rollback": "R", "stop": "s"}


def grid(s: dict, width: int = 72, height: int = 12) -> list[list[tuple[str, str]]]:
    """The plot as rows of (character, kind) cells, kind one of '', 'point', 'threshold',
    'baseline', 'rollback', 'axis', 'phase', 'label': the caller colours them.
    The plot area is ``width`` x ``height`` cells; a y-axis label column is added."""
    width, height = max(width, 10), max(height, 3)
    span = max(s["duration"], 1e-9)
    ymax = y_max(s)
    dots = [[0] * width for _ in range(height)]
    kind = [[""] * width for _ in range(height)]

    def col(t: float) -> int:
        return min(width - 1, max(0, int(t / span * (width * 2 - 1)) // 2))

    def row_of(v: float) -> tuple[int, int]:  # cell row, dot row (0 = top)
        y = int(round((1 - min(max(v / ymax, 0.0), 1.0)) * (height * 4 - 1)))
        return y // 4, y % 4

    def dot(t: float, v: float) -> None:
        x = min(width * 2 - 1, max(0, int(t / span * (width * 2 - 1))))
        r, dr = row_of(v)
        dots[r][x // 2] |= _DOT[dr][x % 2]
        kind[r][x // 2] = "point"

    for m in s["minutes"]:
        dot(m["t"], m["median"])
    for p in s["points"]:
        dot(p["t"], p["value"])
    cells = [[(chr(0x2800 + dots[r][c]), kind[r][c]) if dots[r][c] else (" ", "") for c in range(width)]
             for r in range(height)]

    def hline(v: float, ch: str, k: str, start: int = 0) -> None:
        r, _ = row_of(v)
        for c in range(start, width):
            if cells[r][c][1] == "":
                cells[r][c] = (ch, k)

    for v in s["baselines"].values():
        hline(v, "·", "baseline")
    for i, th in enumerate(s["threshold"]):
        hline(th["value"], "┄", "threshold", col(th["t"]) if i else 0)
    for i, rb in enumerate(s["rollbacks"]):
        c = col(rb["t"])
        for r in range(height):
            if cells[r][c][1] in ("", "threshold", "baseline"):
                cells[r][c] = ("│", "rollback")
        cells[0][c] = (str(i + 1) if i < 9 else "+", "rollback")

    labels = {0: fmt_rate(ymax), height - 1: "0"}
    for th in s["threshold"][:1]:
        labels.setdefault(row_of(th["value"])[0], fmt_rate(th["value"]))
    lw = max(len(v) for v in labels.values()) + 1
    out = [[(labels.get(r, "").rjust(lw - 1) + " ", "axis")] + cells[r] for r in range(height)]
    strip = [(" " * lw, "")] + [(" ", "")] * width
    for p in sorted(s["phases"], key=lambda p: p["phase"] == "rollback"):  # a short rollback stays seen
        for c in range(col(p["start"]), col(p["end"]) + 1):
            strip[c + 1] = (PHASE_CHAR.get(p["phase"], "?"), "phase")
    for p in s.get("pauses") or ():  # a pause: "‖" on the phase strip
        for c in range(col(p["start"]), col(p["end"]) + 1):
            strip[c + 1] = ("‖", "phase")
    out.append(strip)
    return out

