"""The supervisor: owns one job inside the container, needing no laptop (stdlib only).

prepare env (venv per wheel profile) → warmup → train, while it watches tokens/s
and failure signals and rolls back to the last known-good profile by itself.
Everything it does goes to the job's journal (see journal.py).
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from typing import Any, Callable

from gpujob.agent.fleet import nodes as fleet
from gpujob.agent.judge import decide, policy, sources
from gpujob.agent.base import defaults, planshare
from gpujob.agent.base.defaults import DEFAULTS
from gpujob.agent.supervisor.cachekeep import Caches
from gpujob.agent.supervisor.cksupervise import Checkpoints
from gpujob.agent.base.protocol import ENDED
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.home.ledger import Ledger
from gpujob.agent.base.fsio import now
from gpujob.agent.base.protocol import JobState, OutcomeKind
from gpujob.agent.home.lock import Fenced, Held, Lock
from gpujob.agent.supervisor.metrics import MetricsFile
from gpujob.agent.supervisor.notify import Notifier
from gpujob.agent.base.proc import Phase, die_here, hold_here, keepers_of, kill_group, start_ticks
from gpujob.agent.home.relay import JobLog, Relay
from gpujob.agent.home.trim import Trimmer
from gpujob.agent.supervisor.guard import Guard
from gpujob.agent.supervisor.install import Envs
from gpujob.agent.supervisor.parts import (SECRETS_FILE, ChildEnv, History, Job, PolicyHolder, Report, Runner,
                                           StopFlag)
from gpujob.agent.supervisor.phases import Phases
from gpujob.agent.base.stages import Stage
from gpujob.agent.supervisor.standby import Standby
from gpujob.agent.supervisor.verdicts import Verdicts
from gpujob.agent.judge.outcome import EnvError
from gpujob.agent.supervisor.watch import Watch
from gpujob.agent.supervisor.watchpause import PauseWatch
from gpujob.agent.judge.outcome import Outcome, Stop



class FleetPort:
    """The fleet's port back to the supervisor (fleet.node.NodePort): exactly what a node
    of a multi-node job asks of it. ``judge_sample`` is the watch's, bound once the watch
    is built (the watch needs the fleet first)."""

    def __init__(self, job: Job, journal, report: Report, child_env: ChildEnv, stop: StopFlag,
                 history: History, finish, plan_rollback, requests):
        self.job_id, self.job, self.spec, self.journal = job.job_id, job.job, job.spec, journal
        self.say, self.set_state, self.secrets = report.say, report.set_state, child_env.secrets
        self.finish, self.plan_rollback, self.requests = finish, plan_rollback, requests
        self._stop, self._history = stop, history

    judge_sample: Callable[[Any, float, Any, float], Any]  # the watch's: the supervisor binds it once built

    stop_asked = property(lambda self: self._stop.asked)
    restarts = property(lambda self: self._history.restarts)


class Supervisor:
    """One job's owner in the container. Everything it decides is written to the
    job's state before it acts, so a supervisor that dies at any moment can be
    followed by a new one that re-adopts the running command and carries on."""

    def __init__(self, home: str, job_id: str, held: Held | None = None):
        self.held = held
        self.born = now()  # a stop asked before this is one asked of an earlier supervisor
        self.journal = Journal(Home(home), job_id, generation=held.generation if held else None)
        # the shared pieces (parts.py)
        self.jobv = jobv = Job.of(self.journal.home, job_id, self.journal.job())
        self.job_id, self.job, self.spec = job_id, jobv.job, jobv.spec
        self.profiles, self.rb = jobv.profiles, jobv.rb
        self.ledger = Ledger(self.journal.home, planshare.ledger_name(self.job),  # per fleet shape
                             report=self._ledger_trouble)  # damaged or locked: said, never a crash
        self.stop = StopFlag()
        self._planned_at: float | None = None  # decided_at of the rollback this supervisor planned
        self.history = History(self.journal.state())
        self.runner = Runner(self.journal)
        tp = defaults.section(self.spec, "throughput")  # throughput is watched: a policy, a ledger, rollbacks
        line_source, tp_scale = None, 1.0
        if tp:
            gpus = self.spec.get("gpus") or {}
            if tp["scope"] == "per_gpu":
                group = tp["scope_group"]
                tp_scale = float(len(gpus[group]) if group else sum(len(v) for v in gpus.values()) or 1)
            if tp["source"] == "stdout":
                line_source = sources.line_source(tp, tp_scale)
        self.policy_holder = PolicyHolder(policy.PolicyConfig.from_spec(tp) if tp else None)
        self.restart_cfg = defaults.section(self.spec["train"], "restarts") or {"on": []}
        self.notifier = Notifier(self.journal, self.job, self.journal.path(SECRETS_FILE))
        self.journal.on_internal_error = lambda line: self.notifier.emit(
            "internal_error", str(int(now() * 1000)), reason=line)
        self.metrics = MetricsFile(self.journal, self.job)
        self.report = Report(self.journal, self.metrics, self.notifier)
        self.env = ChildEnv(jobv, self.journal, self.notifier)
        self.say, self.set_state = self.report.say, self.report.set_state
        self.fleet_port = FleetPort(jobv, self.journal, self.report, self.env, self.stop, self.history,
                                    self.finish, self.plan_rollback, self.requests)
        self.fleet = fleet.make(self.fleet_port)  # None, or this node's leader/follower of a multi-node job
        self.envs = Envs(jobv, self.journal, self.report, self.runner, self.stop)
        self.caches = Caches(jobv, self.journal, self.ledger, self.envs, self.report)
        self.guard = Guard(jobv, self.journal, self.report, self.env, self.runner)
        self.pause = PauseWatch(jobv, self.journal, self.policy_holder)  # the watch's pause and trace side
        self.checkpoints = Checkpoints(jobv, self.journal, self.runner, self.env, self.report,
                                       after_events=self.pause.on_ckpt_events)
        self.standby = Standby(jobv, self.journal, self.ledger, self.envs, self.env, self.report)
        self.verdicts = Verdicts(jobv, self.journal, self.ledger, self.report, self.caches, self.history,
                                 self.policy_holder, self.fleet, ends=self)
        self.watch = Watch(jobv, self.journal, self.ledger, self.report, self.runner, self.env,
                           self.checkpoints, self.pause, self.caches.mark_good, self.verdicts,
                           self.policy_holder, self.history,
                           self.fleet, Trimmer(self.journal.dir), self.requests, line_source=line_source,
                           tp_scale=tp_scale, signatures=self.rb["error_signatures"],
                           grace_after_signature=float(self.rb["signature_grace"]),
                           start_timeout=tp["start_timeout"] if tp else None)
        self.fleet_port.judge_sample = self.watch.judge_sample
        self.phases = Phases(jobv, self.journal, self.ledger, self.envs, self.standby, self.checkpoints,
                             self.env, self.report, self.history, self.runner, self.policy_holder, self.fleet,
                             watch=self.watch.watch)

    # ---- entry -------------------------------------------------------------
    def main(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        os.makedirs(self.journal.dir, exist_ok=True)
        fenced = False
        try:
            self.report.joblog = JobLog(self.journal.path("job.log"))
            self.runner.relay = Relay(self.journal.dir, self.report.joblog)
            self.runner.relay.recover()
            self.notifier.start()
            if self.journal.state().get("state") in ENDED:  # revived only to deliver its notifications
                self.journal.set_state(supervisor_pid=os.getpid(), supervisor_ticks=start_ticks(os.getpid()))
                self.journal.event("notify_resumed", supervisor_pid=os.getpid())
                return 0
            self.guard.make_reserve()
            self.announce()
            hold_here("announced")  # the suite's races: a supervisor up that has not read its queue
            self.lifecycle()
        except Stop:
            self.finish(JobState.STOPPED, "stopped on request")
        except EnvError as e:
            self.finish(JobState.FAILED, str(e))
        except Fenced as e:  # a newer holder owns the job now: touch nothing more
            sys.stderr.write(f"gpujob supervisor: {e}; leaving\n")
            fenced = True
            return 3
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                self.crashed(e)
                raise
            self.guard.disk_full(e)
        except Exception as e:  # never die silently: the journal says what happened
            self.crashed(e)
            raise
        finally:
            if self.held:
                self.held.release()
            if not fenced:  # the job's last messages go out before the supervisor does (the
                self.pause.close_trace()
                self.notifier.close()  # container is free meanwhile: its pid in state keeps revive off)
        return 0

    def announce(self) -> None:
        """Record that this supervisor owns the job now (and if it took over)."""
        st = self.journal.state()
        before = st.get("supervisor_pid")
        self.journal.set_state(supervisor_pid=os.getpid(), supervisor_ticks=start_ticks(os.getpid()),
                               started_at=st.get("started_at") or now(),
                               supervisors=int(st.get("supervisors") or 0) + 1)
        if self.held:
            self.held.set_pid(os.getpid())
        if before and st.get("step"):
            child = st.get("child")
            what = f"re-adopting its {child['phase']} (process group {child['pgid']})" if child else \
                f"resuming at step {st['step']}"
            self.say(f"supervisor restarted (the previous one, pid {before}, was gone); {what}")
            if st.get("standby"):  # its FIFO's other end is gone with the old supervisor: start afresh
                self.standby.proc = Phase.adopt(st["standby"])
                self.standby.drop_standby()
            for pid in keepers_of([self.journal.path("standby.exit")]).values():  # one not written down
                kill_group(pid, 2)
            self.journal.event("supervisor_restarted", previous_pid=before, step=st.get("step"),
                               child=child, generation=self.journal.generation)

    def _on_sigterm(self, *_):
        self.stop.asked = True

    def crashed(self, e: BaseException) -> None:
        try:
            self.journal.event("error", error=f"{type(e).__name__}: {e}")
            self.finish(JobState.FAILED, f"supervisor error: {type(e).__name__}: {e}")
        except Exception:
            pass

    def finish(self, state: JobState, reason: str, **kw) -> None:
        if self.runner.proc is not None and self.runner.proc.running():
            left = self.runner.proc.kill(5)
            kw.setdefault("left", left)
        self.standby.drop_standby()
        # written down before the state: a death between re-emits it
        if state in (JobState.SUCCEEDED, JobState.FAILED):
            self.notifier.emit("success" if state == JobState.SUCCEEDED else "failure", "end", reason=reason,
                               profile=self.journal.state().get("profile"), signal=kw.get("signal"),
                               exit_code=kw.get("exit_code"), rollbacks=len(self.history.rollbacks))
        self.env.drop_secrets()
        self.guard.drop_boot_hook()
        self.say(f"job {state}: {reason}")
        self.set_state(state, phase="done", reason=reason, finished_at=now(), child=None, **kw)
        taken = {r.get("request") for r in self.history.rollbacks}
        for name, req in self.journal.pending():  # nothing is left to act on them
            if req.get("kind") == "rollback" and name not in taken:  # answered "requested": its end on record
                self.journal.drop_request(name, req, f"the job ended ({state}) before its supervisor acted "
                                          "on it")
                self.say(f"a rollback asked at {clock(req.get('at'))} was not carried out: the job ended "
                         f"({state}) first; `gpujob rollback {self.job_id} --to PROFILE` runs it again")
            else:
                self.journal.done(name)
        self.guard.drop_reserve()
        if self.fleet is not None:  # every node hears how it ended
            self.fleet.ended(state, reason)

    # ---- the job: a state machine whose every step is in state.json --------
    def lifecycle(self) -> None:
        if self.fleet is not None:
            if not self.fleet.wait_go():  # every node's lock taken? (else it ended here)
                return
            self.fleet.start()
        while True:
            st = self.journal.state()
            if st.get("state") in ENDED:
                return
            step = Stage.of(st.get("step")) or Stage.ENV
            profile = st.get("profile") or self.job["profile"]
            child = st.get("child")
            if st.get("child_starting") and not child:  # a start its predecessor did not write down
                self.find_started(st["child_starting"])
                continue
            if st.get("snapshot_due"):  # a known-good profile's snapshot, cut short by a death
                self.caches.take_snapshot(st["snapshot_due"])
                continue
            if child:
                out = self.phases.readopt(child, profile)
                if out is None:
                    continue
                if child.get("phase") == "warmup" and out.kind == OutcomeKind.DONE:
                    self.journal.set_state(warmup_done=sorted(set(st.get("warmup_done") or [])
                                                              | {child.get("gpu")}, key=str))
                    continue
            else:
                out = self.requests()
                if out is None:
                    if step == Stage.ROLLBACK:
                        self.switch(st["pending_rollback"])
                        continue
                    if step == Stage.ENV:
                        self.set_state(JobState.PREPARING, phase="env", profile=profile)
                        self.envs.activate(profile)
                        cold = bool(self.job.get("clear_caches") and not st.get("resume"))
                        if cold:
                            self.envs.clear_caches(profile)
                        self.journal.set_state(step=Stage.RESTORE, warmup_done=[], cache_cold=cold)
                        continue
                    if step == Stage.RESTORE:  # a known-good profile's snapshot into an empty cache
                        self.caches.cache_step(profile, bool(st.get("cache_cold")), step=Stage.WARMUP)
                        continue
                    if step == Stage.SUCCEEDED:  # the trainer exited 0 before a supervisor died
                        out = Outcome(OutcomeKind.DONE, exit_code=0)
                    elif step == Stage.WARMUP:
                        out = self.phases.warmup(profile, st.get("warmup_done") or [])
                        if out.kind == OutcomeKind.DONE:
                            if self.requests() is not None:  # the loop takes it (the trainer's start durable)
                                self.journal.set_state(step=Stage.TRAIN, durable=False)
                                continue
                            # one write fewer
                            out = self.phases.train(profile, bool(st.get("resume")), step=Stage.TRAIN)
                    else:
                        out = self.phases.train(profile, bool(st.get("resume")))
            restarts_before = len(self.history.restarts)
            if self.handle(out, profile):
                return
            if self.fleet is not None:  # the leader relaunches every node on its decision
                self.fleet.decided(out, profile, restarts_before)

    def find_started(self, rec: dict) -> None:
        """The command a dead supervisor was starting: adopt it if it runs, else forget it."""
        pid = keepers_of([rec["exit_file"]]).get(rec["exit_file"])
        if pid is None and os.path.exists(rec["exit_file"]):  # it ran and ended already
            pid = -1
        if pid is None:
            self.journal.set_state(child_starting=None)
            return
        child = dict(rec, pgid=pid if pid > 0 else 0, ticks=start_ticks(pid) if pid > 0 else None)
        self.journal.event("found_started", phase=rec.get("phase"), pgid=child["pgid"])
        self.journal.set_state(child=child, child_starting=None)

    def handle(self, out: Outcome, profile: str) -> bool:
        """Act on how a phase ended; True when the job is over. What to do is
        ``decide.next_action``'s (pure); this carries it out (verdicts.py)."""
        if self.fleet is not None:
            self.journal.sync()  # the phase's end (end_phase wrote it without fsync) before the fleet acts
            over = self.fleet.handle(out, profile)
            if over is not None:
                return over
        if out.kind == OutcomeKind.SIGNAL:
            if self.guard.disk_is_full():
                try:
                    self.journal.sync()
                except OSError:
                    pass
                raise OSError(errno.ENOSPC, "no space left on device", self.journal.dir)
            if self.caches.cold_retry(out, profile):  # a failed cold start: once more on the snapshot
                return False
        action = self.next_action(out, profile)
        if action.do != decide.Do.ROLLBACK or out.request:  # a rollback's first durable write is its
            self.journal.sync()  # spawn's (switch): what it does before that only writes state.json
        return self.verdicts.carry_out(action, out, profile)

    def _ledger_trouble(self, line: str) -> None:
        """The ledger cannot be read or written (damaged, or its lock held too long): said in
        the journal and job.log; the verdict stays in the journal's events."""
        self.journal.event("warning", message=line)
        if self.report.joblog is not None:
            self.say(line)

    def next_action(self, out: Outcome, profile: str) -> decide.Action:
        """What to do after ``out`` on ``profile``: decide.next_action over what this job knows."""
        return decide.next_action(out, profile, self.ledger.read(), self.profiles, self.rb, self.restart_cfg,
                                  self.history.rollbacks, self.history.restarts,
                                  self.journal.state().get("suspect"), now(),
                                  DEFAULTS["restarts"], warmup=defaults.section(self.spec, "warmup"))

    def plan_rollback(self, frm: str, to: str, out: Outcome, failure: str, mark_bad: bool,
                      suspect: dict | None = None) -> None:
        """Write the rollback down before doing any of it (with the suspect it leaves, which
        a new supervisor goes on confirming), then let ``switch`` do it."""
        self._planned_at = out.at  # planned here (not re-run after a death): switch's first time
        pending = {"from": frm, "to": to, "reason": out.reason, "signal": failure,
                   "evidence": out.evidence, "decided_at": out.at, "mark_bad": mark_bad,
                   "request": out.request}
        # not fsynced unless a request is removed next: every act of the switch (a ledger mark,
        # a message, a venv build, a cache restore, the spawn) is preceded by a durable write
        # (journal.sync, or the spawn's child_starting), which carries this state along
        self.journal.set_state(step=Stage.ROLLBACK, pending_rollback=pending, suspect=suspect,
                               judging_suspended=None, child=None, child_pid=None, ending=None,
                               durable=bool(out.request))
        die_here("rollback_planned")
        if out.request:
            self.journal.done(out.request)

    def switch(self, p: dict) -> None:
        """Carry out a written-down rollback (again, if a supervisor died during it)."""
        if not p.get("recorded"):
            marked = {}
            if p.get("mark_bad"):
                self.journal.sync()
                done = self.ledger.mark(p["from"], "bad", reason=p["reason"], job=self.job_id,
                                        # once, after a death too
                                        op=f"{self.job_id}:rollback:{p['decided_at']}")
                die_here("rollback_marked")  # a new supervisor redoes the switch: the op makes it one verdict
                marked = {"ledger": "written" if done is not None else "not written (see the warning)"}
            rec = {"from": p["from"], "to": p["to"], "reason": p["reason"], "signal": p["signal"],
                   "decided_at": p["decided_at"], "request": p.get("request")}
            self.history.add_rollback(rec)
            # a previous supervisor that died in the switch may have said it already (the
            # record below is deferred when nothing else was done: see the write)
            again = p["decided_at"] != self._planned_at and any(
                e.get("type") == "rollback" and e.get("decided_at") == p["decided_at"]
                for e in self.journal.events()[0])
            if not again:
                self.journal.event("rollback", evidence=p.get("evidence") or {}, **rec, **marked)
            acted = bool(p.get("mark_bad")) or self.notifier.wants("rollback")
            if self.notifier.wants("rollback"):
                self.journal.sync()
            self.notifier.emit("rollback", str(len(self.history.rollbacks)), **{k: rec[k] for k in
                                                                         ("from", "to", "reason", "signal")})
            p = dict(p, recorded=True)
            if not again:
                self.say(f"ROLLBACK {p['from']} -> {p['to']}: {p['reason']}")
        else:
            acted = True
        # one write for the record and the state shown (rollbacks before pending_rollback's recorded):
        # written at once after a ledger mark or a message (so they are never done twice), else
        # deferred with the switch's next steps to the spawn's durable write (a death before it
        # redoes the switch from the plan)
        self.set_state(JobState.ROLLING_BACK, phase="env", reason=p["reason"],
                       rollbacks=self.history.rollbacks, pending_rollback=p, durable=False if acted else None)
        die_here("rollback_recorded")
        if (self.journal.state().get("standby") or {}).get("profile") != p["to"]:
            self.standby.drop_standby()
        # the venv pointed at, then this in the same write
        self.envs.activate(p["to"], durable=None, step=Stage.RESTORE, resume=True, warmup_done=[],
                      pending_rollback=None, cache_cold=False)
        die_here("rollback_switched")

    def requests(self):
        """The next request to act on: a pending stop always wins; else the oldest
        rollback not yet taken. Requests stay queued until acted on."""
        if self.stop.asked:
            return Outcome(OutcomeKind.STOP)
        taken = {r.get("request") for r in self.history.rollbacks}
        rollback = None
        queue = self.journal.pending()
        for name, req in queue:
            if req["kind"] == "stop" and (self.journal.stale_stop(req)  # a newer command ran the job again
                                          or self.journal.superseded_stop(req, queue, self.born)):
                gone = self.journal.drop_request(name, req, "asked of an earlier run, whose supervisor died "
                                                 "before acting on it; `rollback` ran the job again")
                self.say(f"a stop asked at {clock(gone['asked_at'])} of an earlier run of this job was "
                         f"dropped: its supervisor died before acting on it, and a rollback ran the job "
                         f"again (`gpujob stop {self.job_id}` stops this run)")
                continue
            if req["kind"] == "stop":
                self.stop.asked = True
                return Outcome(OutcomeKind.STOP)
            if req["kind"] == "rollback" and rollback is None:
                if name in taken:
                    self.journal.done(name)
                    continue
                rollback = Outcome(OutcomeKind.ROLLBACK, reason=req.get("reason") or "rolled back by hand",
                                   to=req.get("to"), request=name, mark_bad=req.get("mark_bad", True))
        return rollback



restart_refusal = decide.restart_refusal  # where it was


def clock(t) -> str:
    """A request's time as people read it (UTC), or '?'."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(t)) if isinstance(t, (int, float)) else "?"


def run(home: str, job_id: str, lock_fd: int | None = None, generation: int | None = None) -> int:
    if (lock_fd is None) != (generation is None):  # a lock without its generation would fence nothing
        raise ValueError("run: --lock-fd and --generation come together (the lock and its generation)")
    held = None
    if lock_fd is not None and generation is not None:
        held = Lock.inherit(lock_fd, generation, job_id, home)
    try:
        sup = Supervisor(home, job_id, held)
    except Exception as e:  # a job it cannot even read must not look merely "lost"
        journal = Journal(Home(home), job_id, generation)
        journal.set_state(state=JobState.FAILED, phase="done", finished_at=now(),
                          reason=f"supervisor could not start: {type(e).__name__}: {e}")
        if held:
            held.release()
        raise
    return sup.main()
