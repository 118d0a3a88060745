"""Watching one phase command (stdlib only): start it under its keeper, relay its
log into job.log, read its lines for throughput samples and failure signals, and
end it when a decision or a request says so. The same loop watches a command a
previous supervisor started (re-adoption): the command never depended on it.
"""

from __future__ import annotations

import collections
import os

from gpujob.agent.supervisor import hang
from gpujob.agent.base import logwait
from gpujob.agent.home import ckregister, snapshots
from gpujob.agent.judge import checkpoint, policy, signals, throughput, timings
from gpujob.agent.supervisor.filesource import FileSource
from gpujob.agent.base.fsio import now
from gpujob.agent.judge.outcome import Outcome
from gpujob.agent.supervisor.boothook import boot_identity
from gpujob.agent.base.placeholders import substitute
from gpujob.agent.base import defaults
from gpujob.agent.base.defaults import DEFAULTS
from gpujob.agent.base.proc import Phase, die_here
from gpujob.agent.base.protocol import FailureSignal, JobState, OutcomeKind, Verdict
from gpujob.agent.home.trim import read_jsonl_from
from gpujob.agent.supervisor.watchrun import Run, gpu_utilisation

POLL = 0.05            # seconds between looks at a quiet log
COALESCE = 0.1         # after a small read, let output gather this long: one wakeup per
                       # 100 lines of a trainer printing 1000 lines/s instead of one per line
                       # (CPU); job.log lags the trainer by 100 ms at most. 0.05 -> 0.1 took the
                       # supervisor from 1.18 % to 0.83 % of a core at 70 samples/s (bench.supervisor_cpu)
COALESCE_BELOW = 16384  # a read this big means a fast writer: read on at once, never throttle
STATE_EVERY = 1.0      # state.json rewrite period while samples stream in
KNOWN_GOOD_EVERY = 0.5  # seconds between asks whether the profile has proven itself (not per sample:
#                        at 70 samples/s that ask was ~7 % of the supervisor's CPU under cProfile)



def quiet_first(grace: float) -> float:
    """How long a stopped trainer's main process has to end with its workers before the
    rest of its group gets SIGTERM too (half of train.grace, at most 10 s): a framework
    stops its DataLoader workers or torchrun's ranks itself, with no traceback."""
    return min(10.0, grace / 2)

class Watch:
    """Runs and watches one phase command at a time (``watch``, the entry ``Phases`` is
    given). Built with the job (``parts.Job``), the journal, the ledger (a run's baseline),
    the report (banners, the state write, the notifier, the metrics file), the runner (the
    phase process and the relay), the child env (placeholder values, the hang's stacks),
    the checkpoints (their watch, the gate, the save wait), its pause side (``PauseWatch``),
    ``mark_good`` (``Caches``), the verdicts (review, refuse_promotion, keep_running), the
    policy holder, the history (the rollbacks), the fleet (None on one node), the trimmer,
    the line source and the throughput scale, the error signatures with their grace, the
    start timeout, and ``requests``: the supervisor's next request (a stop, a rollback)."""

    def __init__(self, job, journal, ledger, report, runner, child_env, checkpoints, pause, mark_good,
                 verdicts, policy_holder, history, fleet, trimmer, requests, *, line_source=None,
                 tp_scale: float = 1.0, signatures: list | None = None,
                 grace_after_signature: float = DEFAULTS["rollback"]["signature_grace"], start_timeout=None):
        self.job, self.journal, self.ledger, self.report, self.runner = job, journal, ledger, report, runner
        self.child_env, self.checkpoints = child_env, checkpoints
        self.pause, self.mark_good = pause, mark_good
        self.verdicts, self.policy_holder, self.history, self.fleet = verdicts, policy_holder, history, fleet
        self.trimmer, self.requests = trimmer, requests
        self.line_source, self.tp_scale = line_source, tp_scale
        self.signatures, self.grace_after_signature = list(signatures or []), grace_after_signature
        self.start_timeout = start_timeout  # throughput.start_timeout (None: not watched)
        self.spec, self.rb, self.workdir = job.spec, job.rb, job.workdir
        self.say, self.set_state = report.say, report.set_state
        self.notifier, self.metrics = report.notifier, report.metrics
        self.watching = policy_holder.base is not None  # throughput is watched: a policy, a ledger, rollbacks
        jcfg = defaults.section(self.spec, "journal")
        self.keep_log, self.full_rate = int(jcfg["keep_log"]), float(jcfg["full_rate_samples"])
        # (time, offset in samples.jsonl), one a minute
        self.sample_marks: collections.deque = collections.deque()
        self._owed: list | None = None  # on_lines' lines not yet in the tail and the trace

    def samples_since(self, start: float) -> list:
        """The samples a previous supervisor recorded for this run (re-adoption)."""
        records = read_jsonl_from(self.journal.path("samples.jsonl"), self.trimmer.start_of("samples.jsonl"))
        return [policy.Sample(r["t"], r["value"], r.get("step")) for r in records
                if r.get("t", 0) >= start and "value" in r]

    def keep_small(self, run, t: float) -> None:
        """The logs cut to their size (a stat each); once a minute a summary of the
        minute's samples into events.jsonl and the samples cut to their full-rate span."""
        self.trimmer.trim("job.log", self.keep_log)
        relay = self.runner.relay
        if relay.src:
            self.trimmer.trim(relay.src, self.keep_log, upto=relay.offset)
        if t - run.last_trim < 60:
            return
        run.last_trim = t
        self.summarise(run, t)
        for t_mark, offset in list(self.sample_marks):
            if t - t_mark <= self.full_rate:
                break
            self.sample_marks.popleft()
            self.trimmer.trim_before("samples.jsonl", offset)

    def summarise(self, run, t: float) -> None:
        """One ``samples_1m`` record for the samples since the last one."""
        fresh = run.minute
        run.minute = []
        if not fresh:
            return
        values = sorted(fresh)
        self.journal.event("samples_1m", since=round(run.minute_start, 3), n=len(values),
                           median=values[len(values) // 2], min=values[0], max=values[-1],
                           profile=run.profile, verdict=run.last_verdict)
        run.minute_start = t

    def watch(self, argv, env, logname, profile, *, timeout, watch_tps, grace=30.0, gpu=None,
              adopt: dict | None = None, started=None, after_start=None) -> Outcome:
        """Run one phase command (or go on watching ``adopt``, a command a previous
        supervisor started); parse its output; act on signals and requests."""
        os.makedirs(self.workdir, exist_ok=True)
        relay = self.runner.relay  # (opened by Supervisor.main)
        if adopt is not None:
            proc = Phase.adopt(adopt)
            self.runner.proc = proc
            run = self.new_run(logname, profile, timeout, watch_tps, adopt.get("started_at"), adopt)
            run.samples = self.samples_since(run.start) if watch_tps else []
            relay.follow(logname, adopt.get("log_start", 0))
            self.journal.event("readopted", phase=run.phase, pgid=proc.pgid, running=proc.running(),
                               samples=len(run.samples))
        else:
            run = self.new_run(logname, profile, timeout, watch_tps, None)
            if watch_tps and self.start_timeout:  # a start hang on an empty cache is the compile race
                run.cold_cache = snapshots.cache_files(self.job.home.root, self.job.cache_key(profile)) == 0
            extra = {"profile": profile, "gpu": gpu, "watch_tps": watch_tps, "cold_cache": run.cold_cache}
            if run.ckwatch is not None:  # a re-adopting supervisor takes this run's watch over
                extra["ck_run"] = run.ckwatch.run
            proc = self.runner.start_phase(argv, env, self.workdir, logname, extra, started)
            # (a figure: shown, never acted on)
            self.journal.set_state(phase_started_at=run.start, durable=False)
            if after_start is not None:  # what can wait until the command runs
                after_start()
        split = throughput.LineSplitter()
        # a hung trainer's end that a dead supervisor had decided (and maybe begun: SIGABRT)
        outcome = hang.predecessor_outcome(self.journal, proc, Outcome) if adopt is not None else None
        while outcome is None:
            chunk = relay.poll()
            t = now()
            lines = split.feed(chunk) if chunk else []
            # asked once a turn: a command that printed and ended between two asks left the
            # loop with its last output neither relayed nor read
            alive = bool(chunk) or proc.running()
            if not alive:
                for rest in relay.drain():
                    lines += split.feed(rest)
                lines += split.flush()  # a last line without a newline counts too
                outcome = self.poll_source(run, t)  # a metrics file's last records
            if not outcome:  # a decision already taken (from the file's last records) stands
                outcome = self.on_lines(run, lines, t)
            if outcome is None and t - run.last_check >= 0.2:
                run.last_check = t
                outcome = self.poll_source(run, t) or self.check(run, t)
                self.keep_small(run, t)
                self.pause.trace_writer().tick(t)
            outcome = self.checkpoints.gate(run, outcome, t)
            if outcome is not None or not alive:
                break
            # until the log grows (or COALESCE), it ends, or the checks are due
            if len(chunk) < COALESCE_BELOW:
                logwait.after_read(relay, proc.wait_fd(), bool(chunk), POLL if run.held else
                                   run.last_check + 0.2 - now(), POLL, COALESCE)
        if outcome is not None:
            self.say(f"stopping {run.phase}: {outcome.reason or outcome.kind}")
            if outcome.kind == OutcomeKind.STOP:
                self.set_state(JobState.STOPPING, phase=run.phase)
            if outcome.kind == OutcomeKind.SIGNAL and outcome.evidence.get("hung"):
                # its stacks first (journal, logs --stacks)
                hang.end_hung(self.journal, self.child_env, self.say, proc, run, outcome)
            else:  # a hung trainer finishes no save; any other first ends the save it is in
                self.checkpoints.wait_for_save(run, proc, now())
            first = quiet_first(grace) if run.phase == "train" else 0.0
            if first:
                self.say(f"gpujob stops the trainer: SIGTERM to its main process, then to the rest of its "
                         f"process group after {first:g}s at most, SIGKILL after {grace:g}s more")
            left = proc.kill(grace, first=first)
            self.journal.event("group_stopped", pgid=proc.pgid, left=left, first=first)
            for _ in relay.drain():  # what it printed while dying
                pass
        self.keep_small(run, now())
        self.summarise(run, now())
        if run.samples and outcome is None:  # the last word on this run's throughput
            last = run.samples[-1].t
            d = self.pause.decide_now(run, now())
            if run.watch_tps and self.fleet is None and d.verdict != Verdict.ROLLBACK:
                self.promote_if_good(run, last)  # its last samples, asked after the throttle's gap
            self.publish(run.samples, d, run.baseline)
        code = proc.returncode
        self.checkpoints.close_checkpoints(run, code)
        self.pause.trace_end(code, now())
        self.journal.event("exit", phase=run.phase, returncode=code, profile=profile)
        self.runner.end_phase(durable=False)
        die_here(f"{run.phase}_ended:{profile}")
        if outcome is not None:
            return outcome
        if code == 0:
            return Outcome(OutcomeKind.DONE, exit_code=0)
        if adopt is not None and code is None and adopt.get("boot") not in (None, boot_identity()):
            reason = f"the container restarted while {run.phase} ran (exit status unknown)"
            self.say(f"{run.phase} failed: {reason}")
            if self.spec.get("resume_after_reboot"):
                return Outcome(OutcomeKind.SIGNAL, "container_restart", reason,
                               {"tail": list(run.tail)[-10:]})
            return Outcome(OutcomeKind.SIGNAL, FailureSignal.CRASH, reason, {"tail": list(run.tail)[-10:]})
        sig = -code if code is not None and code < 0 else None
        name, reason = signals.classify_exit(code if code is None or code >= 0 else None, sig,
                                                run.hits + list(run.tail), self.signatures)
        self.say(f"{run.phase} failed: {reason}")
        return Outcome(OutcomeKind.SIGNAL, name, reason, {"returncode": code, "tail": list(run.tail)[-10:]},
                       exit_code=code)

    def new_run(self, logname, profile, timeout, watch_tps, start, adopt=None):
        run = Run(self.job, self.ledger, logname, profile, timeout, watch_tps, start)
        run.cold_cache = bool((adopt or {}).get("cold_cache"))
        self.pause.pause_setup(run)
        run.source = self.make_source(profile, adopt) if watch_tps else None
        if run.phase == "train":
            run.ckwatch = self.checkpoints.checkpoint_watch(profile, adopt)
        return run

    def make_source(self, profile: str, adopt: dict | None):
        """The run's throughput source: output lines, or the metrics file (from where
        a previous supervisor left it, when re-adopting)."""
        tp = defaults.section(self.spec, "throughput")
        if tp is None or tp["source"] != "file":
            return self.line_source
        path = substitute(tp["path"], self.child_env.values(profile))
        path = path if os.path.isabs(path) else os.path.join(self.workdir, path)
        # where a previous supervisor had read to (state.json's top level; None on a fresh start)
        offset = self.journal.record().source_offset if adopt is not None else None
        return FileSource(path, tp["field"], tp.get("step_field"), offset, scale=self.tp_scale)

    def poll_source(self, run, t: float):
        """The samples a metrics-file source has gained (none for a line source): the first
        outcome they lead to, or None."""
        outcome = None
        for value, step in run.source.poll() if run.source else ():
            outcome = outcome or self.on_sample(run, value, step, t)
        return outcome

    def on_line(self, run, line: str, t: float):
        """One line of output: error signatures, then (in training) a throughput sample."""
        run.tail.append(line)
        self.pause.pause_line(run, line, t)
        hit = signals.scan_line(line, self.signatures)
        if hit:
            run.hits.append(line)
            run.hit_at = run.hit_at or (t, hit)
        if not run.watch_tps:
            return None
        got = run.source.from_line(line, t) if run.source else None
        if got is None:
            return None
        return self.on_sample(run, got[0], got[1], t)

    def on_lines(self, run, lines: list, t: float):
        """The lines of one read, taken as ``on_line`` takes them one by one (same order,
        the same first outcome, no line after it), at a cost per read rather than per
        line when no line can hit a signature or open a pause (``pause_pattern``: one search
        a line): only the lines that may hold a sample are parsed (a pause_pattern used to
        send every read of a nanoGPT run line by line). The tail and the trace get the lines
        up to a sample's before anything else is written into the trace (a decision's record
        follows its line);
        nothing an ``on_sample`` reads depends on them, so they get them in one piece
        otherwise."""
        if not lines:
            return None
        rx = self.pause.pause_rx  # (a line it matches opens a pause: then line by line, as it must)
        if (rx is not None and any(map(rx.search, lines))) or \
                signals.may_hit("\n".join(lines), self.signatures):
            for line in lines:
                outcome = self.on_line(run, line, t)
                if outcome:
                    return outcome
            return None
        src = run.source if run.watch_tps else None
        owed = self._owed = [run, lines, 0, 0, t]  # [run, lines, given, up to, t]
        try:
            for i in src.candidates(lines) if src is not None else ():
                got = src.from_line(lines[i], t) if src is not None else None  # (no candidates without one)
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

    def _pay(self) -> None:
        """The lines ``on_lines`` owes the tail and the trace so far."""
        owed = self._owed
        if owed is None or owed[2] >= owed[3]:
            return
        run, lines, given, upto, t = owed
        piece = lines if given == 0 and upto == len(lines) else lines[given:upto]
        run.tail.extend(piece)
        self.pause.trace_writer().out_lines(t, piece)
        owed[2] = upto

    def trace_decision(self, d, t: float) -> None:
        self._pay()
        self.pause.trace_writer().write({"t": round(t, 3),
                                         "recorded": {"verdict": str(d.verdict), "reason": d.reason}})

    def on_sample(self, run, value: float, step, t: float):
        """One throughput sample of this node's trainer; a multi-node job's leader judges
        the aggregate, a follower only reports it (agent/fleet/nodes.py)."""
        if self.fleet is not None:
            return self.fleet.own_sample(run, value, step, t)
        return self.judge_sample(run, value, step, t)

    def judge_sample(self, run, value: float, step, t: float):
        """One throughput sample, from whichever source: the policy, the journal, the ledger."""
        run.samples.append(policy.Sample(t, value, step))
        if len(run.samples) > 50000:
            del run.samples[:25000]
        d = self.pause.decide_now(run, t)
        # a rollback's confirmation; judging suspended (agent/supervisor/verdicts.py)
        d = self.verdicts.review(run, d, t)
        mark = not self.sample_marks or t - self.sample_marks[-1][0] >= 60  # where to trim to, once a minute
        at = self.journal.sample(mark, t=round(t, 3), value=value, step=step, verdict=d.verdict,
                                 median=d.median, profile=run.profile)
        if mark:
            self.sample_marks.append((t, at))
        run.minute.append(value)
        # one event per change of verdict, with how long the last one held (agent/judge/coalesce.py)
        held = run.verdicts.step(d.verdict, t, again=d.verdict == Verdict.ROLLBACK and run.held is None and
                                 run.last_verdict == Verdict.ROLLBACK)
        if held is not None:
            self.journal.event("decision", verdict=d.verdict, reason=d.reason, evidence=d.evidence, **held)
            self.trace_decision(d, t)
            run.last_verdict = d.verdict
        if t - run.last_state > STATE_EVERY or d.verdict == Verdict.ROLLBACK:
            where = run.source.position() if run.source is not None else None  # for a re-adopting supervisor
            self.publish(run.samples, d, run.baseline,
                         **({"source_offset": where} if where is not None else {}))
            run.last_state = t
        rollbacks = self.history.rollbacks
        rec = rollbacks[-1] if rollbacks and run.phase == "train" else None
        if rec is not None and timings.pending(rec):  # decision -> first sample -> first good -> first ok
            for mark, secs in timings.on_sample(rec, t, value, d.evidence.get("threshold"), d.verdict):
                self.journal.event("rollback_timing", mark=mark, seconds=secs, profile=run.profile)
                self.journal.set_state(rollbacks=rollbacks)
        if d.verdict == Verdict.ROLLBACK:
            out = Outcome(OutcomeKind.SIGNAL, FailureSignal.LOW_THROUGHPUT, d.reason, d.evidence)
            return None if self.verdicts.keep_running(run, out) else out
        if not run.good_known and t - run.good_asked >= KNOWN_GOOD_EVERY:
            self.promote_if_good(run, t)
        return None

    def promote_if_good(self, run, t: float) -> None:
        """The profile proven (policy.known_good: the span's median, fixed once reached, so
        asking every KNOWN_GOOD_EVERY and once at the run's end finds the same baseline as
        asking at every sample): the ledger, the event, the notice."""
        run.good_asked = t
        if run.good_known or not run.samples:
            return
        base = self.pause.known_good_now(run, t)
        if base is None or self.verdicts.refuse_promotion(run):
            return
        run.good_known = True
        die_here("known_good_asked")  # the suite's death points: decided, nothing written yet
        self.journal.event("known_good", profile=run.profile, baseline=base)
        die_here("known_good_said")  # the event written, the ledger not yet
        self.notifier.emit("known_good", f"{run.profile}.{len(self.history.rollbacks)}", profile=run.profile,
                           baseline=base)
        self.say(f"profile {run.profile} is now known-good "
                 f"(baseline {throughput.fmt_rate(base)} tok/s)")
        self.mark_good(run.profile, baseline=base,  # the ledger, then a cache snapshot
                       reason=f"held {throughput.fmt_rate(base)} tok/s for "
                              f"{self.policy_holder.now.good_after:g}s")
        run.baseline = run.baseline or base

    def check(self, run, t: float):
        """The checks made every 0.2 s whether or not output came: requests, a hung
        trainer after an error signature, the phase timeout, idle GPUs, a stall."""
        self.checkpoints.poll_checkpoints(run, t)  # the register, and the events of CONTRACT.md
        outcome = self.fleet.poll(run, t) if self.fleet is not None else None
        outcome = outcome or self.requests()
        if outcome:
            return outcome
        acted_on = (self.rb.get("on") or []) + (self.rb.get("stop_on") or []) + [FailureSignal.COMPILE_RACE]
        if run.hit_at and t - run.hit_at[0] > self.grace_after_signature and run.hit_at[1] in acted_on:
            _name, reason = signals.classify_exit(1, None, run.hits, self.signatures)
            return Outcome(OutcomeKind.SIGNAL, run.hit_at[1], f"{reason} (the process kept running "
                           f"{self.grace_after_signature:g}s after it)",
                           {"lines": run.hits[-5:], "hung": True})
        if run.timeout and t - run.start > run.timeout:
            return Outcome(OutcomeKind.SIGNAL, FailureSignal.CRASH,
                           f"{run.phase} timed out after {run.timeout:g}s")
        first = run.samples[0].t if run.samples else run.start
        if run.idle_gpus and t - run.last_gpu >= run.idle_poll and (run.samples or not run.watch_tps) and \
                t >= first + (self.policy_holder.now.initial_delay if self.watching else 0) and \
                run.pauses.active_at(t) is None:
            # start-up (imports, compile) idles the GPUs: watched from the first sample (plus the
            # initial delay, which counts from it) on; a pause (save, eval) is not idleness
            run.last_gpu = t
            outcome = self.check_gpu_idle(run, t)
            if outcome:
                return outcome
        # before the first sample: start_timeout's
        if run.watch_tps and not run.samples and self.start_timeout:
            if t - run.start > self.start_timeout:
                name, reason, ev = hang.start_hang(run.phase, t - run.start, self.start_timeout,
                                                   run.cold_cache)
                self.journal.event("decision", verdict=name, reason=reason, evidence=ev)
                return Outcome(OutcomeKind.SIGNAL, name, reason, ev)
        elif run.watch_tps:
            d = self.pause.decide_now(run, t)
            if d.verdict == Verdict.STALL:
                self.journal.event("decision", verdict=d.verdict, reason=d.reason, evidence=d.evidence)
                return Outcome(OutcomeKind.SIGNAL, FailureSignal.STALL, d.reason, dict(d.evidence, hung=True))
        return None

    def check_gpu_idle(self, run, t: float):
        cfg = run.idle_cfg
        util = gpu_utilisation(run.idle_gpus)
        if util is None:
            return None
        run.gpu_history.append((t, util))
        del run.gpu_history[:-1000]
        self.journal.event("gpu_util", group=cfg["group"], max=util)
        ck = self.spec["train"].get("checkpoint")
        saved = (ckregister.find(self.workdir, substitute(ck["path"], self.child_env.values(run.profile)))
                 if ck else [])
        last_pause = run.pauses.intervals[-1][1] if run.pauses.intervals else 0.0  # idle counts after it
        idle, run.save_time = checkpoint.idle_gap(run.gpu_history, cfg["below"],
                                                  max(saved[0][1] if saved else 0.0, min(last_pause, t)),
                                                  run.save_time)
        if idle < max(cfg["for"], 2 * run.save_time):  # shorter than a checkpoint save: not idle
            return None
        return Outcome(OutcomeKind.SIGNAL, FailureSignal.GPU_IDLE,
                       f"GPUs {cfg.get('group') or 'all'} ({','.join(map(str, run.idle_gpus))}) "
                       f"under {cfg['below']:g}% for {idle:.0f}s",
                       {"group": cfg["group"], "below": cfg["below"], "idle_for": round(idle, 1),
                        "history": run.gpu_history[-10:]})

    def publish(self, samples: list, d, baseline, **more) -> None:
        """The figures ``status`` shows, once a second: replaced atomically, not fsynced (nothing
        is acted on from them; a machine crash that loses the last one ends the trainer too)."""
        values = [s.value for s in samples[-120:]]
        self.journal.set_state(tps=values[-1] if values else None, tps_recent=values,
                               window=d.evidence, verdict=d.verdict, verdict_reason=d.reason,
                               baseline=baseline, durable=False, **more)
        self.metrics.write()

