"""What ``gpujob bisect`` and ``gpujob tune`` print (pure: results in, plain lines out;
the CLI shows them literally, never as markup)."""

from __future__ import annotations

from gpujob.agent.judge.throughput import fmt_rate
from gpujob.agent.judge import bisect as core


def rate(st) -> str:
    if st is None:
        return "no steady rate"
    return f"{fmt_rate(st.median)} tok/s ± {fmt_rate(st.spread)} ({st.n} samples)"


def progress_line(n: int, tr, word: str) -> str:
    """``trial 3: torch 2.10.0 -> 2.11.0: measuring, 12.3K tok/s ± 0.1K (8 samples) so far``."""
    text = f"trial {n}" + (f" ({tr.job_id})" if tr.job_id else "") + f": {tr.label}: {word}"
    if word in ("measuring", "stopping") and tr.steady is not None:
        text += f", {rate(tr.steady)} so far"
    elif word == "measuring" and tr.samples:
        text += f", {len(tr.samples)} samples (settling)"
    if word == "done":
        text += f" in {tr.seconds:.0f}s: {tr.verdict}" + (f" ({tr.ratio:.2f}x of good)"
                                                          if tr.ratio is not None
                                                            else "")
        if tr.verdict == core.UNRESOLVED:
            text += f" ({tr.reason[:160]})" if tr.reason else ""
    return text


def difference_lines(groups) -> list:
    return [f"  {i + 1}. {core.describe([g])}" for i, g in enumerate(groups)]


def trial_lines(result) -> list:
    lines = []
    for i, tr in enumerate([result.good, *result.trials], 1):
        ratio = f"{tr.ratio:.2f}x" if tr.ratio is not None else "-"
        lines.append(f"  {i}. {tr.verdict:<10} {ratio:>6}  {rate(tr.steady)}  {tr.label}  [{tr.job_id}]")
    return lines


def tune_lines(ranked) -> list:
    """Fastest first; the winner with its margin over the next."""
    lines = []
    for i, (name, st, margin, tr) in enumerate(ranked, 1):
        extra = f"  {margin:.2f}x the next" if margin is not None and i == 1 else ""
        why = "" if st else f"  ({tr.state}{': ' + tr.reason[:120] if tr.reason else ''})"
        lines.append(f"  {i}. {name:<20} {rate(st)}{extra}{why}  [{tr.job_id}]")
    return lines


def tune_sentence(ranked) -> str:
    name, st, margin, _tr = ranked[0]
    if st is None:
        return "no profile gave a steady rate"
    more = f", {margin:.2f}x the next ({ranked[1][0]})" if margin is not None else ""
    return f"fastest: {name} at {fmt_rate(st.median)} tok/s{more}"
