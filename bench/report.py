"""A benchmark figure as a value (ours, its baseline, the ratio, the target met or not),
the statistics figures take (median, percentile), and how a run is written out: the table
BENCHMARKS.md carries and the machine it ran on."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from dataclasses import dataclass, field


@dataclass
class Figure:
    key: str
    figure: str
    unit: str
    target: str
    ours: float | None = None
    baseline: float | None = None
    ratio: float | None = None      # >1 is better for us: baseline/ours for times, ours/baseline for rates
    met: bool | None = None         # None: no target
    samples: dict = field(default_factory=dict)
    note: str = ""
    error: str | None = None


def median(xs):
    return statistics.median(xs) if xs else None


def percentile(xs, q):
    if not xs:
        return None
    s = sorted(xs)
    k = min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))
    return s[k]


def fmt(v, unit: str) -> str:
    if v is None:
        return "—"
    if unit in ("ms", "MB/s", "MB", "% core"):
        digits = 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2
        return f"{v:.{digits}f} {unit}"
    if unit == "s":
        return f"{v:.3f} s" if v < 10 else f"{v:.1f} s"
    return f"{v:g} {unit}"


def fmt_ratio(r) -> str:
    return "—" if r is None else f"{r:.2f}×"


def met_text(m) -> str:
    return {True: "yes", False: "NO", None: "—"}[m]


def table(figs: list[Figure]) -> str:
    rows = [("figure", "ours", "baseline", "ratio", "target", "met?")]
    for f in figs:
        if f.error:
            rows.append((f.figure, "error", "", "", f.target, f.error[:60]))
        else:
            rows.append((f.figure, fmt(f.ours, f.unit), fmt(f.baseline, f.unit), fmt_ratio(f.ratio),
                         f.target, met_text(f.met)))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = []
    for n, r in enumerate(rows):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def machine() -> dict:
    def run(*argv):
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            return (p.stdout or p.stderr).strip()
        except OSError:
            return None
    cpu = None
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import paramiko
    return {"nproc": os.cpu_count(), "cpu": cpu, "memory": run("free", "-h"), "uname": run("uname", "-a"),
            "python": platform.python_version(), "paramiko": paramiko.__version__,
            "openssh": run("ssh", "-V")}
