"""``gpujob plot JOB [-o FILE.png|.svg|.html]``: tok/s over time, with the phases
shaded, the threshold, the known-good baselines and each rollback marked.

The job's events.jsonl and samples.jsonl are read through the agent by gpujob/ops/plot.py
(``tail``, as ``logs --events`` reads them); gpujob/show/plotdata.py turns them into series (pure).
Files are drawn by matplotlib (Agg, imported only here: the ``plot`` extra); the
terminal plot is gpujob's own braille grid (no dependency).
"""

from __future__ import annotations

import html
from pathlib import Path

from rich.text import Text

from gpujob.show import plotdata
from gpujob.agent.judge.throughput import fmt_rate
from gpujob.show import render
from gpujob.errors import GpujobError, InputError

FORMATS = (".png", ".svg", ".html")
# the distribution is gpujob-proxmox: "gpujob" on PyPI is somebody else's project
INSTALL = ("pip install 'gpujob-proxmox[plot]'  (or: uv tool install 'gpujob-proxmox[plot]'; "
           "from a clone: pip install '.[plot]')")
PHASE_COLOUR = {"prepare": "#bbbbbb", "warmup": "#f2d16b", "train": "#9fd4a3", "rollback": "#d98cd9",
                "stop": "#cccccc"}
PROFILE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf")
CELL_STYLE = {"point": "cyan", "threshold": "red", "baseline": "green", "rollback": "magenta",
              "axis": "dim", "phase": "yellow"}


class MissingDependency(GpujobError):
    """A file plot without matplotlib installed."""


# ---- the terminal ---------------------------------------------------------------

def terminal(s: dict, width: int = 72, height: int = 12) -> list[Text]:
    title = render.lit(f"tok/s of {s['job']} on {s.get('target', '?')} ({s.get('state') or '?'})", "bold")
    lines = [title]
    for row in plotdata.grid(s, width=width, height=height):
        text = Text()
        for ch, kind in row:
            text.append(ch, CELL_STYLE.get(kind, ""))
        lines.append(text)
    lines.extend(render.lit(x) for x in legend(s))
    return lines


def legend(s: dict) -> list[str]:
    """The lines under the terminal plot: time, phases, threshold, baselines, rollbacks."""
    d = render.duration
    lines = [f"time 0 → {d(s['duration'])};  phases: p prepare, w warmup, t train, R rolling back, s stop"]
    for i, th in enumerate(s["threshold"]):
        lines.append(f"┄ {plotdata.threshold_label(th)}" + (f" from {d(th['t'])}" if i else ""))
    for name, v in sorted(s["baselines"].items()):
        lines.append(f"· known-good {name}: {fmt_rate(v)} tok/s")
    for i, rb in enumerate(s["rollbacks"], 1):
        lines.append(f"{i if i < 10 else '+'} {plotdata.rollback_label(rb)} at {d(rb['t'])}")
    if s.get("pauses"):
        total = sum(p["end"] - p["start"] for p in s["pauses"])
        lines.append(f"‖ {len(s['pauses'])} pauses (checkpoint saves, pause_pattern), {d(total)} in all: "
                     "their samples were not judged")
    if not s["points"] and not s["minutes"]:
        lines.append("no throughput samples yet")
    return lines


# ---- files ------------------------------------------------------------------------

def _pyplot():
    from gpujob.show import render
    from gpujob.show.waits import Wait
    err = render.console(stderr=True)
    # the first import builds matplotlib's font cache (18 s on a laptop): said when it takes over 2 s
    with Wait(err, "loading matplotlib (its first use builds its font cache, once)"):
        try:
            import matplotlib
        except ImportError:
            raise MissingDependency(f"plot -o needs matplotlib, which is not installed: {INSTALL}") from None
        matplotlib.use("Agg")
        matplotlib.rcParams.update({"svg.fonttype": "none", "text.parse_math": False,
                                    "svg.hashsalt": "gpujob"})
        import matplotlib.pyplot as plt
        import matplotlib.font_manager  # noqa: F401  # where the cache is built
    return plt


def figure(s: dict):
    """The matplotlib figure of a job's series. Artists carry ids (``gid``) that the SVG
    keeps: samples-PROFILE, minutes-PROFILE, phase-N, threshold, baseline-PROFILE, rollback-N."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(11, 4.8), dpi=100)
    scale, unit = ((3600.0, "h") if s["duration"] > 3 * 3600 else (60.0, "min") if s["duration"] > 180
                   else (1.0, "s"))
    seen_phase = set()
    for i, p in enumerate(s["phases"]):
        label = p["phase"] if p["phase"] not in seen_phase else None
        seen_phase.add(p["phase"])
        span = ax.axvspan(p["start"] / scale, p["end"] / scale, color=PHASE_COLOUR.get(p["phase"], "#dddddd"),
                          alpha=0.35, lw=0, label=label)
        span.set_gid(f"phase-{i}")
    profiles = list(dict.fromkeys([p["profile"] for p in s["points"]] + [m["profile"] for m in s["minutes"]]
                                  + sorted(s["baselines"])))
    colour = {p: PROFILE_COLOURS[i % len(PROFILE_COLOURS)] for i, p in enumerate(profiles)}
    for prof in profiles:
        ms = [m for m in s["minutes"] if m["profile"] == prof]
        if ms:
            xs = [m["t"] / scale for m in ms]
            ax.fill_between(xs, [m["min"] or m["median"] for m in ms], [m["max"] or m["median"] for m in ms],
                            color=colour[prof], alpha=0.2, lw=0)
            line, = ax.plot(xs, [m["median"] for m in ms], color=colour[prof], lw=1.2,
                            label=f"{prof} (median a minute)")
            line.set_gid(f"minutes-{prof}")
        ps = [p for p in s["points"] if p["profile"] == prof]
        if ps:
            line, = ax.plot([p["t"] / scale for p in ps], [p["value"] for p in ps], ls="", marker="o", ms=3,
                            color=colour[prof], label=f"{prof} tok/s")
            line.set_gid(f"samples-{prof}")
    for prof, v in sorted(s["baselines"].items()):
        ln = ax.axhline(v, color=colour.get(prof, "green"), ls=":", lw=1.2,
                        label=f"known-good {prof}: {fmt_rate(v)} tok/s")
        ln.set_gid(f"baseline-{prof}")
    if s["threshold"]:
        end = s["duration"] / scale
        xs = [th["t"] / scale for th in s["threshold"]] + [end]
        ys = [th["value"] for th in s["threshold"]]
        ln, = ax.step(xs, ys + ys[-1:], where="post", color="#d62728", ls="--", lw=1.4,
                      label=plotdata.threshold_label(s["threshold"][-1]))
        ln.set_gid("threshold")
    ymax = plotdata.y_max(s)
    for i, rb in enumerate(s["rollbacks"]):
        x = rb["t"] / scale
        ax.axvline(x, color="#8e24aa", lw=1.5).set_gid(f"rollback-{i}")
        ax.text(x, ymax * 0.97, " " + plotdata.rollback_label(rb), rotation=90, va="top", ha="right",
                fontsize=8, color="#8e24aa", gid=f"rollback-label-{i}")
    ax.set_ylim(0, ymax)
    ax.set_xlim(0, max(s["duration"] / scale, 1e-6))
    ax.set_xlabel(f"time since the job started ({unit})")
    ax.set_ylabel("tok/s")
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: fmt_rate(v)))
    ax.set_title(f"{s['job']} on {s.get('target', '?')}: tok/s ({s.get('state') or '?'})", fontsize=11)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # a job with no samples yet has nothing to name
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def write_file(s: dict, path: Path) -> None:
    fig = figure(s)
    import io
    import matplotlib.pyplot as plt
    try:
        suffix = path.suffix.lower()
        if suffix == ".html":
            text = io.StringIO()
            fig.savefig(text, format="svg")
            svg = text.getvalue()
            svg = svg[svg.index("<svg"):]  # no XML declaration or DOCTYPE inside HTML
            title = html.escape(f"gpujob plot: {s['job']} on {s.get('target', '?')}")
            _atomic(path, (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                           f"<title>{title}</title></head>\n<body>\n<h1 style=\"font: 16px sans-serif\">"
                           f"{title}</h1>\n{svg}\n</body></html>\n").encode())
        else:
            buf = io.BytesIO()
            fig.savefig(buf, format=suffix[1:])
            _atomic(path, buf.getvalue())
    finally:
        plt.close(fig)


def _atomic(path: Path, data: bytes) -> None:
    """The file appears whole or not at all (written beside it, then renamed)."""
    import os
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise InputError(f"-o {path}: cannot write: {e.strerror or e}") from None
