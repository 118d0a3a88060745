"""The watch loop's pause and trace side (stdlib only; a mixin of the supervisor,
like PhaseWatch): checkpoint file events and ``throughput.pause_pattern`` lines open
pauses (agent/judge/pauses.py, pure), the policy is asked with them, and the run's
trace (agent/base/trace.py) gets every output line and checkpoint event. The lines of
one read are taken together (``on_lines``) when none can hit a signature or a pause."""

from __future__ import annotations

import re

from gpujob.agent.judge import policy, signals
from gpujob.agent.base import defaults, trace
from gpujob.agent.judge.pauses import Pauses


class PauseWatch:
    _pause_rx = None

    def pause_setup(self, run) -> None:
        """A run's pauses and its trace segment (called when its watch starts)."""
        tp = defaults.section(self.spec, "throughput") or {}
        ck = (self.spec.get("train") or {}).get("checkpoint") or {}
        run.pauses = Pauses(float(tp.get("pause_tail") or 0.0), ckpt_every=ck.get("every"))
        run.memo = {}
        pat = tp.get("pause_pattern")
        self._pause_rx = re.compile(pat) if pat else None
        tr = self.trace_writer()
        tr.write({"t": round(run.start, 3), "run": {"profile": run.profile, "phase": run.phase,
                                                     "resume": bool(self.journal.state().get("resume"))}})

    def trace_writer(self):
        if getattr(self, "_trace", None) is None:
            jcfg = defaults.section(self.spec, "journal")
            self._trace = trace.TraceWriter(self.journal.dir, {
                "name": self.spec.get("name"), "job": self.job_id, "recorded_by": "gpujob supervisor",
                "meta": {"throughput": self.spec.get("throughput")}}, limit=int(jcfg["keep_log"]))
        return self._trace

    def close_trace(self) -> None:
        """The trace's gzip stream ended (the job's end): a whole file for any gzip reader."""
        tw, self._trace = getattr(self, "_trace", None), None
        if tw is not None:
            try:
                tw.close()
            except OSError:
                pass  # a full disk: the stream stays cut, which read_records tolerates

    def decide_now(self, run, t: float):
        """The policy's decision for ``run`` at ``t``: the same call replay makes."""
        return policy.decide(self.policy, run.samples, t, run.start, run.baseline, run.pauses.spans(), run.memo)

    def known_good_now(self, run, t: float):
        return policy.known_good(self.policy, run.samples, t, run.start, run.baseline, run.pauses.spans(),
                                 run.memo)

    def pause_line(self, run, line: str, t: float) -> None:
        """An output line: into the trace; a pause_pattern match opens/extends a pause."""
        self.trace_writer().out(t, line)
        if self._pause_rx is not None and self._pause_rx.search(line):
            self._paused(run, run.pauses.mark(t, "pause_pattern"), t)

    def on_lines(self, run, lines: list, t: float):
        """The lines of one read, taken as ``on_line`` takes them one by one (same order,
        the same first outcome, no line after it), at a cost per read rather than per
        line when no line can hit a signature or a pause: only the lines that may hold a
        sample are parsed. The tail and the trace get the lines up to a sample's before
        anything else is written into the trace (a decision's record follows its line);
        nothing an ``on_sample`` reads depends on them, so they get them in one piece
        otherwise."""
        if not lines:
            return None
        if self._pause_rx is not None or signals.may_hit("\n".join(lines), self.signatures):
            for line in lines:
                outcome = self.on_line(run, line, t)
                if outcome:
                    return outcome
            return None
        src = run.source if run.watch_tps else None
        owed = self._owed = [run, lines, 0, 0, t]  # [run, lines, given, up to, t]
        try:
            for i in src.candidates(lines) if src is not None else ():
                got = src.from_line(lines[i])
                if got is None:
                    continue
                owed[3] = i + 1
                outcome = self.on_sample(run, got[0], got[1], t)
                if outcome:
                    return outcome
            owed[3] = len(lines)
            return None
        finally:
            self._pay()
            self._owed = None

    _owed = None

    def _pay(self) -> None:
        """The lines ``on_lines`` owes the tail and the trace so far."""
        owed = self._owed
        if owed is None or owed[2] >= owed[3]:
            return
        run, lines, given, upto, t = owed
        piece = lines if given == 0 and upto == len(lines) else lines[given:upto]
        run.tail.extend(piece)
        self.trace_writer().out_lines(t, piece)
        owed[2] = upto

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
        self.journal.event("pause", start=round(iv[0], 3), tail=run.pauses.tail, why=iv[2], profile=run.profile)
        self.journal.set_state(pauses=[[round(a, 3), round(b, 3)] for a, b in run.pauses.spans()[-20:]])

    def trace_decision(self, d, t: float) -> None:
        self._pay()
        self.trace_writer().write({"t": round(t, 3), "recorded": {"verdict": str(d.verdict), "reason": d.reason}})

    def trace_end(self, code, t: float) -> None:
        tr = self.trace_writer()
        tr.write({"t": round(t, 3), "exit": code})
        tr.last_flush = 0.0
        tr.tick(t)
