"""Checkpoint awareness (stdlib only, pure; the step a name says is ckpaths.step_of): how a
resume point is described, how long a rollback waits for the first one, and the
plan's warning when the policy can decide before one can exist. Which checkpoints
are this job's, and finished, is the register's (agent/home/ckregister.py).

``train.checkpoint: {path: GLOB, every: DURATION}``: GLOB is relative to the
workdir (``{job_id}``/``{profile}``/``{workdir}`` substituted), ``**`` allowed.
"""

from __future__ import annotations

from gpujob.agent.base import defaults
from gpujob.agent.base.protocol import FailureSignal



def describe(point: dict) -> str:
    """'resumed from F (age 12s, step 400)' or 'no checkpoint: restarted from scratch'."""
    if not point or not point.get("file"):
        return "no checkpoint: restarted from scratch"
    bits = [f"age {point['age']:.0f}s"]
    if point.get("step") is not None:
        bits.append(f"step {point['step']}")
    return f"resumed from {point['file']} ({', '.join(bits)})"


def saved_by_run(point: dict) -> str:
    """'F, age 3s, step 12, written by this run'."""
    bits = [point["file"], f"age {point['age']:.0f}s"]
    if point.get("step") is not None:
        bits.append(f"step {point['step']}")
    return ", ".join(bits) + ", written by this run"


def hold_limit(every: float) -> float:
    """How long a rollback waits for a first checkpoint: two intervals and a minute,
    then it goes ahead (a trainer that writes none must not stay on a bad profile)."""
    return 2 * every + 60.0


def warnings(spec: dict) -> list:
    """Pure, on the agent's spec dict: the ways the policy can decide before the first
    checkpoint can exist (empty when there is no checkpoint or it cannot happen)."""
    ck = (spec.get("train") or {}).get("checkpoint")
    if not ck:
        return []
    rb = defaults.section(spec, "rollback")
    if not rb["enabled"] or rb["wait_for_checkpoint"]:
        return []
    every = float(ck["every"])
    on = rb.get("on") or []
    out = []
    tp = spec.get("throughput")
    fix = "set rollback.wait_for_checkpoint: true, or a longer delay"
    earliest = _earliest_rollback(spec) if tp else None
    if tp and earliest is not None and FailureSignal.LOW_THROUGHPUT in on and earliest < every:
        out.append(f"throughput.initial_delay ({float(tp.get('initial_delay') or 0):g}s, counted from the "
                   f"first sample) with the time parts of window and failure_limit ({earliest:g}s in all) is "
                   f"shorter than train.checkpoint.every ({every:g}s): a low_throughput rollback can come "
                   f"before the first checkpoint exists, and the resumed trainer would start from scratch; "
                   f"{fix}")
    idle = rb.get("gpu_idle")
    if idle and FailureSignal.GPU_IDLE in on and float(idle["for"]) < every:
        out.append(f"rollback.gpu_idle.for ({float(idle['for']):g}s) is shorter than train.checkpoint.every "
                   f"({every:g}s): a gpu_idle rollback can come before the first checkpoint exists; {fix}")
    return out


def _earliest_rollback(spec: dict) -> float:
    """Seconds after the first sample before the policy can roll back, as far as the
    spec says in time: the initial delay (from the first sample) plus a quarter of a time
    window: a deep drop is decided once a quarter window holds it, in a few samples
    (agent/judge/tail.py; counts of samples say nothing of time: 0)."""
    from gpujob.agent.judge.policy import PolicyConfig
    from gpujob.agent.judge.tail import PARTIAL
    tp = defaults.section(spec, "throughput")
    cfg = PolicyConfig.from_spec({**tp, "min": tp.get("min") or 1.0})
    return float(tp.get("initial_delay") or 0) + PARTIAL * (cfg.window_s or 0.0)


def idle_gap(history: list, below: float, last_saved: float, save_time: float) -> tuple:
    """Pure: (idle seconds that count, the longest checkpoint save seen).

    ``history`` holds (time, busiest GPU's utilisation) pairs, oldest first. A
    checkpoint save idles the GPUs: idle time up to the moment the newest
    checkpoint landed (``last_saved``, its mtime) does not count, and an idle
    stretch that a checkpoint ended teaches how long a save takes (``save_time``,
    the longest seen). The caller takes a gap shorter than twice that for a save
    in progress: it compares the idle time with max(for, 2 x save_time)."""
    i = len(history) - 1
    ongoing = i >= 0 and history[i][1] < below
    while i >= 0 and history[i][1] >= below:  # the busy tail, if the last stretch ended
        i -= 1
    if i < 0:
        return 0.0, save_time
    j = i
    while j > 0 and history[j - 1][1] < below:
        j -= 1
    since = history[j][0]
    end = history[i + 1][0] if i + 1 < len(history) else history[-1][0]
    if since <= last_saved <= end:
        save_time = max(save_time, last_saved - since)
    if not ongoing:
        return 0.0, save_time
    return max(0.0, history[-1][0] - max(since, last_saved)), save_time
