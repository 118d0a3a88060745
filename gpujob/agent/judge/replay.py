"""``gpujob replay``'s engine (stdlib only, pure over parsed records: no clock, no I/O;
the file is read at the edge, cli/replay_cmds.py, with base/trace.py's parser). It runs the
supervisor's own pieces over a recorded run: ``sources.line_source`` reads the
lines, ``pauses.Pauses`` takes the checkpoint events and pause_pattern lines, and
``policy.decide`` / ``policy.known_good`` judge after every sample with the same
arguments the watch loop passes (agent/supervisor/watchpause.py).

A trace holds segments (one per trainer run, ``{"run": ...}`` records); each is
replayed on its own, as the supervisor would have judged it: a segment the
replay rolls back is judged no further ("would have rolled back at t=…"), and
what the live supervisor recorded is set beside it ("recorded: at …").
"""

from __future__ import annotations

import dataclasses
import re

from gpujob.agent.judge import policy, sources
from gpujob.agent.base import defaults
from gpujob.agent.judge.pauses import Pauses
from gpujob.agent.base.protocol import Verdict

LOUD = (Verdict.BREACH, Verdict.ROLLBACK)


def throughput_section(spec: dict) -> dict:
    """The defaults-completed throughput section of an agent spec dict (job.json's
    ``spec``) or of a bare throughput section."""
    tp = spec.get("throughput") if isinstance(spec.get("throughput"), dict) else spec
    return {**defaults.DEFAULTS["throughput"], **(tp or {})}


class Segment:
    def __init__(self, tp: dict, start: float, profile, baseline, resume: bool, scale: float = 1.0,
                 ckpt_every=None):
        cfg = policy.PolicyConfig.from_spec(tp)
        if resume and tp.get("resume_initial_delay") is not None and baseline is not None:
            cfg = dataclasses.replace(cfg, initial_delay=tp["resume_initial_delay"])  # phases.resumed_policy
        self.cfg, self.start, self.profile, self.baseline = cfg, start, profile, baseline
        self.source = sources.line_source(tp, scale) if tp.get("format") else None
        self.pauses = Pauses(float(tp.get("pause_tail") or 0.0), ckpt_every=ckpt_every)
        self.rx = re.compile(tp["pause_pattern"]) if tp.get("pause_pattern") else None
        self.samples: list = []
        self.memo: dict = {}
        self.last: str | None = None
        self.decisions: list = []
        self.recorded: list = []
        self.rolled_back_at: float | None = None
        self.known_good: float | None = None
        self.first_sample: float | None = None

    def line(self, t: float, text: str) -> None:
        if self.rx is not None and self.rx.search(text):
            self.pauses.mark(t, "pause_pattern")
        got = self.source.from_line(text, t) if self.source else None
        if got is not None:
            self.sample(t, got[0], got[1])

    def sample(self, t: float, value: float, step=None) -> None:
        if self.rolled_back_at is not None:
            return
        self.first_sample = self.first_sample if self.first_sample is not None else t
        self.samples.append(policy.Sample(t, value, step))
        spans = self.pauses.spans()
        d = policy.decide(self.cfg, self.samples, t, self.start, self.baseline, spans, self.memo)
        if d.verdict != self.last or d.verdict in LOUD:
            self.decisions.append({"t": round(t, 3), "since_start": round(t - self.start, 3), "value": value,
                                   "step": step, "verdict": str(d.verdict), "reason": d.reason,
                                   "profile": self.profile, "median": d.median})
            self.last = d.verdict
        if d.verdict == Verdict.ROLLBACK:
            self.rolled_back_at = t
        elif self.known_good is None:
            base = policy.known_good(self.cfg, self.samples, t, self.start, self.baseline, spans, self.memo)
            if base is not None:
                self.known_good = base
                self.baseline = self.baseline or base

    def summary(self) -> dict:
        verdicts = [d["verdict"] for d in self.decisions]
        return {"profile": self.profile, "start": self.start, "samples": len(self.samples),
                "breaches": verdicts.count("breach"), "rollback_at": self.rolled_back_at,
                "time_to_decide": (round(self.rolled_back_at - self.first_sample, 3)
                                   if self.rolled_back_at is not None and self.first_sample is not None
                                   else None),
                "pauses": self.pauses.count, "known_good": self.known_good,
                "recorded_rollback_at": next((r["t"] for r in self.recorded if r["verdict"] == "rollback"),
                                             None)}


def replay_records(records, spec: dict, profile=None, baseline=None) -> tuple:
    """(decisions, summary) over trace records (CONTRACT trace format v1)."""
    tp = throughput_section(spec)
    # a spec's train.checkpoint.every: frequent saves open no pauses (agent/judge/pauses.py)
    every = (((spec.get("train") or {}).get("checkpoint") or {}).get("every")
             if isinstance(spec.get("train"), dict) else None)
    segs: list = []
    base = baseline
    cur = None
    for rec in records:
        if "trace" in rec or not isinstance(rec.get("t"), (int, float)):
            continue
        t = float(rec["t"])
        if "run" in rec:
            run = rec["run"] or {}
            if run.get("phase", "train") != "train":
                cur = None
                continue
            prof = profile or run.get("profile")
            judged = run.get("baseline") if isinstance(run.get("baseline"), (int, float)) else None
            # the baseline given (--baseline) first, then the one the run was judged against,
            # then the inferred
            cur = Segment(tp, t, prof, baseline if baseline is not None else judged if judged is not None
                          else base, bool(run.get("resume")), ckpt_every=every)
            segs.append(cur)
            continue
        if cur is None:
            if "out" not in rec and "ckpt" not in rec:
                continue
            # a trace cut before its first run record
            cur = Segment(tp, t, profile, base, False, ckpt_every=every)
            segs.append(cur)
        if "out" in rec:
            cur.line(t, str(rec["out"]))
        elif "ckpt" in rec:
            cur.pauses.on_ckpt_events([{"t": t, "ckpt": rec["ckpt"], "op": rec.get("op"),
                                        "size": rec.get("size")}])
        elif "recorded" in rec:
            r = rec["recorded"] or {}
            cur.recorded.append({"t": t, "verdict": r.get("verdict"), "reason": r.get("reason")})
        elif "exit" in rec:
            base = base if base is not None else cur.known_good
            cur = None
    return _finish(segs)


def _finish(segs) -> tuple:
    decisions = []
    for i, s in enumerate(segs):
        for d in s.decisions:
            decisions.append(dict(d, segment=i))
        if s.rolled_back_at is not None or s.summary()["recorded_rollback_at"] is not None:
            rec = s.summary()["recorded_rollback_at"]
            decisions.append({"t": s.rolled_back_at or rec, "segment": i, "value": None, "verdict": "note",
                              "reason": ("would have rolled back at t=+%.1fs" % (s.rolled_back_at - s.start)
                                         if s.rolled_back_at is not None else "would not have rolled back") +
                              ("; recorded: at t=+%.1fs" % (rec - s.start) if rec is not None
                               else "; recorded: no rollback")})
    per = [s.summary() for s in segs]
    first = next((p["time_to_decide"] for p in per if p["time_to_decide"] is not None), None)
    summary = {"segments": len(per), "rollbacks": sum(p["rollback_at"] is not None for p in per),
               "breaches": sum(p["breaches"] for p in per), "pauses": sum(p["pauses"] for p in per),
               "time_to_decide": first, "per_segment": per}
    return decisions, summary


def replay_sample_records(records, spec: dict, profile=None, baseline=None) -> tuple:
    """``(decisions, summary)`` over a plain samples.jsonl's records ({t, value, [step],
    [profile]}), judged as ``profile``, without pause information; records of another
    shape are passed over."""
    tp = throughput_section(spec)
    seg = None
    for rec in records:
        if not isinstance(rec, dict) or not isinstance(rec.get("t"), (int, float)) or \
                not isinstance(rec.get("value"), (int, float)):
            continue
        if profile and rec.get("profile") not in (None, profile):
            continue
        if seg is None:
            seg = Segment(tp, float(rec["t"]), profile or rec.get("profile"), baseline, False)
        seg.sample(float(rec["t"]), float(rec["value"]), rec.get("step"))
    return _finish([seg] if seg else [])


def summary_line(summary: dict) -> str:
    ttd = summary["time_to_decide"]
    return (f"{summary['segments']} segment(s): {summary['rollbacks']} rollback(s), {summary['breaches']} "
            f"breach(es), {summary['pauses']} pause(s), time to decide: "
            f"{'%.1fs' % ttd if ttd is not None else 'no decision'}")
