"""The watch loop's pause and trace side (stdlib only; ``PauseWatch``, which the
``Watch`` of watch.py is built with): checkpoint file events and
``throughput.pause_pattern`` lines open pauses (agent/judge/pauses.py, pure), the policy
is asked with them, and the run's trace (agent/base/trace.py) gets every output line and
checkpoint event. It is built before the checkpoints (``Checkpoints`` hands it their
events: ``on_ckpt_events``) and the watch."""

from __future__ import annotations

import re

from gpujob.agent.judge import policy
from gpujob.agent.base import defaults, trace
from gpujob.agent.judge.pauses import Pauses


class PauseWatch:
    """Built with the job (``parts.Job``: the spec, the id), the journal and the policy
    holder (the policy in force)."""

    def __init__(self, job, journal, policy_holder):
        self.job, self.journal, self.policy_holder = job, journal, policy_holder
        self.pause_rx = None  # throughput.pause_pattern, compiled (None: no pattern)
        self._trace = None

    def pause_setup(self, run) -> None:
        """A run's pauses and its trace segment (called when its watch starts)."""
        spec = self.job.spec
        tp = defaults.section(spec, "throughput") or {}
        ck = (spec.get("train") or {}).get("checkpoint") or {}
        run.pauses = Pauses(float(tp.get("pause_tail") or 0.0), ckpt_every=ck.get("every"))
        run.memo = {}
        pat = tp.get("pause_pattern")
        self.pause_rx = re.compile(pat) if pat else None
        tr = self.trace_writer()
        tr.write({"t": round(run.start, 3), "run": {"profile": run.profile, "phase": run.phase,
                                                     "resume": bool(self.journal.record().resume),
                                                     "baseline": run.baseline}})  # what replay judges against

    def trace_writer(self):
        if self._trace is None:
            spec = self.job.spec
            jcfg = defaults.section(spec, "journal")
            self._trace = trace.TraceWriter(self.journal.dir, {
                "name": spec.get("name"), "job": self.job.job_id, "recorded_by": "gpujob supervisor",
                "meta": {"throughput": spec.get("throughput")}}, limit=int(jcfg["keep_log"]))
        return self._trace

    def close_trace(self) -> None:
        """The trace's gzip stream ended (the job's end): a whole file for any gzip reader."""
        tw, self._trace = self._trace, None
        if tw is not None:
            try:
                tw.close()
            except OSError:
                pass  # a full disk: the stream stays cut, which read_records tolerates

    def decide_now(self, run, t: float):
        """The policy's decision for ``run`` at ``t``: the same call replay makes."""
        return policy.decide(self.policy_holder.now, run.samples, t, run.start, run.baseline,
                             run.pauses.spans(), run.memo)

    def known_good_now(self, run, t: float):
        return policy.known_good(self.policy_holder.now, run.samples, t, run.start, run.baseline,
                                 run.pauses.spans(), run.memo)

    def pause_line(self, run, line: str, t: float) -> None:
        """An output line: into the trace; a pause_pattern match opens/extends a pause."""
        self.trace_writer().out(t, line)
        if self.pause_rx is not None and self.pause_rx.search(line):
            self._paused(run, run.pauses.mark(t, "pause_pattern"), t)

    def on_ckpt_events(self, run, events, t: float) -> None:
        """Checkpoint file events (CONTRACT: {t, ckpt, op, size}) from the live watcher:
        into the trace, and a save in progress is a pause."""
        tr = self.trace_writer()
        for ev in events or ():
            tr.write({"t": round(float(ev["t"]), 3), "ckpt": ev.get("ckpt"), "op": ev.get("op"),
                      "size": ev.get("size")})
        for iv in run.pauses.on_ckpt_events(events or ()):
            self._paused(run, iv, t)

    def _paused(self, run, iv, t: float) -> None:
        if iv is None:
            return
        tail = run.memo.get("tail")  # the judge's work so far (agent/judge/tail.py): its cost in view
        work = {"samples": tail.fresh, "touched": tail.touched} if tail is not None else None
        self.journal.event("pause", start=round(iv[0], 3), tail=run.pauses.tail, why=iv[2],
                           profile=run.profile, judge_work=work)
        self.journal.set_state(pauses=[[round(a, 3), round(b, 3)] for a, b in run.pauses.spans()[-20:]])

    def trace_end(self, code, t: float) -> None:
        tr = self.trace_writer()
        tr.write({"t": round(t, 3), "exit": code})
        tr.last_flush = 0.0
        tr.tick(t)
