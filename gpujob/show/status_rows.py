"""What `gpujob status` says beside the rate (issue 34 rows 8, 12): a rate that is not the
current one (warmup, preparing, a rollback under way), a suspect not confirmed yet, and
judging that waits for a baseline. Pure: status_view's dict in, (label, text) rows out."""

from __future__ import annotations

from gpujob.agent.base.protocol import JobState
from gpujob.agent.judge.throughput import fmt_rate
from gpujob.show.judgeview import suspended_text

#: states whose rate is the one being measured now (an ended job's is its last, as history)
_LIVE = (JobState.TRAINING,)
_BETWEEN = (JobState.PREPARING, JobState.WARMUP, JobState.ROLLING_BACK, JobState.STOPPING)


def rate_label(v: dict) -> tuple[str, str]:
    """(the row's label, a note after the rate): 'last tok/s' while no trainer measures it."""
    if v.get("state") in _BETWEEN:
        return "last tok/s", f"   (the last train run's; now {v['state']}" + \
            (f", {v['phase']}" if v.get("phase") else "") + ")"
    return "tok/s", ""


def judging_rows(v: dict) -> list[tuple[str, str]]:
    rows = []
    s = v.get("suspect")
    if isinstance(s, dict) and s.get("profile"):
        rows.append(("suspect", f"{s['profile']} (was {s.get('status_before') or 'untried'}) left on "
                     f"{s.get('signal') or 'a breach'}: not marked bad until {s.get('target') or '?'} holds "
                     "for rollback.confirm"))
    held = v.get("judging_suspended")
    if isinstance(held, dict) and held:
        rows.append(("judging", "suspended: " + suspended_text(held)))
    elif v.get("run_baseline"):
        rows.append(("judging", f"against {fmt_rate(v['run_baseline'])} tok/s, a baseline this run set "
                     "(no known one when judging came back)"))
    elif v.get("state") in _LIVE and v.get("tok_s") is not None and v.get("baseline") is None \
            and v.get("threshold") is None:
        rows.append(("judging", "none yet: min_ratio needs a baseline, which this profile sets once it "
                     "holds steady for good_after (or give throughput.baseline or throughput.min)"))
    return rows
