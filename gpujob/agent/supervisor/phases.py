"""The supervisor's phases (stdlib only): the warmup (fanned out per GPU), the
trainer, and re-adopting a phase command a previous supervisor left. ``Phases`` is
built with the job (``parts.Job``), the journal, the ledger, the envs, the standby,
the checkpoints, the child env, the report, the history, the runner, the policy
holder, the fleet (None on one node) and ``watch``: the watch loop's entry.
"""

from __future__ import annotations

import shlex

from gpujob.agent.base import defaults, envs, planshare
from gpujob.agent.base.placeholders import command_argv
from gpujob.agent.base.fsio import now
from gpujob.agent.base.proc import Phase, die_here
from gpujob.agent.base.protocol import JobState, OutcomeKind
from gpujob.agent.home import scratch
from gpujob.agent.judge.outcome import EnvError, Outcome


class Phases:
    """What runs, in which environment."""

    def __init__(self, job, journal, ledger, envs, standby, checkpoints, child_env, report, history, runner,
                 policy_holder, fleet, watch):
        self.job, self.journal, self.ledger, self.envs, self.standby = job, journal, ledger, envs, standby
        self.checkpoints, self.child_env, self.report, self.history = checkpoints, child_env, report, history
        self.runner, self.policy_holder, self.fleet, self.watch = runner, policy_holder, fleet, watch
        self.say, self.set_state, self.values = report.say, report.set_state, child_env.values
        self.env_key, self.cache_key = envs.env_key, envs.cache_key
        self.watching = policy_holder.base is not None

    # ---- phases ------------------------------------------------------------
    def warmup(self, profile: str, done: list) -> Outcome:
        w = defaults.section(self.job.spec, "warmup")
        if not w:
            return Outcome(OutcomeKind.DONE)
        when = w["when"]
        gpus = planshare.warmup_gpus(self.job.spec)
        digest = envs.warm_hash(w, gpus, self.job.profiles[profile], self.env_key(profile))
        cache = envs.warm_state(self.job.home.root, self.cache_key(profile), digest)
        again = bool(self.journal.state().get("warmup_again"))  # after a compile race on a cold cache
        if not done and not again and (when == "never" or (when == "cold" and cache == "warm")):
            self.journal.event("warmup_skipped", profile=profile, cache=cache, when=when)
            self.say(f"warmup skipped: profile {profile}'s compile cache is {cache}"
                     + (" (this warmup succeeded on it before)" if cache == "warm" else ""))
            return Outcome(OutcomeKind.DONE)
        self.set_state(JobState.WARMUP, phase="warmup", profile=profile)
        for gpu in gpus:
            if gpu in done:
                continue
            extra = planshare.warmup_env(gpu)
            argv = command_argv(w["command"], self.values(profile, gpu))
            where = f" on GPU {gpu}" if gpu is not None else ""
            if w.get("scratch"):
                self.empty_scratch(w["scratch"], where)
            self.say(f"warmup{where} (profile {profile}): {shlex.join(argv)}")
            self.journal.event("phase", phase="warmup", gpu=gpu, profile=profile, argv=argv)
            out = self.watch(argv, self.child_env.child_env(profile, extra), "warmup.log", profile,
                             timeout=w["timeout"], watch_tps=False, gpu=gpu)
            if out.kind != OutcomeKind.DONE:
                return out
            done = list(done) + [gpu]
            self.journal.set_state(warmup_done=done)
        die_here("warm_marking")  # the suite's death points: every warmup run done, no marker yet
        envs.mark_warm(self.job.home.root, self.cache_key(profile), digest, profile=profile,
                       job=self.job.job_id, at=now(), was=cache)
        die_here("warm_marked")  # the marker written (atomically), its event not yet
        self.journal.event("warm_marked", profile=profile, hash=digest)
        if again:
            self.journal.set_state(warmup_again=None)
        return Outcome(OutcomeKind.DONE)

    def empty_scratch(self, rel: str, where: str) -> None:
        """warmup.scratch emptied before a warmup run (EnvError when it cannot be, safely)."""
        try:
            path = scratch.empty(self.job.workdir, rel)
        except (scratch.ScratchError, OSError) as e:
            raise EnvError(f"warmup{where}: {e}") from None
        self.journal.event("scratch_emptied", path=path)
        self.say(f"warmup{where}: emptied its scratch folder {path} (warmup.scratch)")

    def train(self, profile: str, resume: bool, **then) -> Outcome:
        """Start (or hand to its standby) and watch the trainer (``then``: state written with its start)."""
        if self.fleet is not None:  # every node's trainer starts together, or none
            if then:  # written before the barrier, whatever it answers
                self.journal.set_state(**then)
                then = {}
            out = self.fleet.barrier(profile)
            if out is not None:
                return out
        t = defaults.section(self.job.spec, "train")
        extra, point = self.checkpoints.resume_args(profile, resume)  # {resume_from}: the checkpoint chosen
        argv = command_argv(t["command"], self.values(profile), extra)
        env = self.child_env.child_env(profile)
        # deferred to the trainer's start (child_starting, or the sync before the standby's
        # hand-over), which is durable; a death before it redoes this step
        self.set_state(JobState.TRAINING, phase="train", profile=profile,
                       restarts_count=len(self.history.restarts), durable=None, **then)
        self.say(f"train (profile {profile}){' resuming' if resume else ''}: {shlex.join(argv)}")
        self.journal.event("phase", phase="train", profile=profile, argv=argv, resume=resume)
        self.resumed_policy(profile, resume)
        started = self.standby.take_standby(profile, extra)
        if started is None:
            self.standby.keep_standby(profile)
        return self.watch(argv, env, "train.log", profile,
                          timeout=t["timeout"], watch_tps=self.watching,
                          grace=t["grace"], started=started, after_start=lambda: self.rollback_done(point))

    def rollback_done(self, point) -> None:
        """The trainer of a rollback's target runs (just spawned, or handed to its
        standby): the rollback's record gets when, and how long from the decision."""
        if self.history.rollbacks and "running_at" not in self.history.rollbacks[-1]:
            rec = self.history.rollbacks[-1]
            if point is not None:
                rec["resumed"] = point["note"]
            rec["running_at"] = self.runner.spawned_at
            rec["took"] = round(rec["running_at"] - rec["decided_at"], 3)
            rec["timings"] = {"trainer_start": rec["took"]}
            self.journal.event("rollback_done", **rec)
            self.journal.set_state(rollbacks=self.history.rollbacks)
            die_here("rollback_done")

    def resumed_policy(self, profile: str, resume: bool) -> None:
        """A known-good profile resumed needs no long start-up grace
        (throughput.resume_initial_delay)."""
        if self.watching:
            delay = (self.job.spec.get("throughput") or {}).get("resume_initial_delay")
            good = resume and delay is not None and self.ledger.status(profile) == "good"
            self.policy_holder.resumed(delay if good else None)

    def readopt(self, child: dict, profile: str):
        """A phase command recorded in state by a supervisor that is gone: watch it
        on (warmup, train) or end it (an install: its venv is rebuilt from scratch).
        Returns its outcome, or None when there is nothing to go on with."""
        if child.get("phase") == "prepare":
            proc = Phase.adopt(child)
            if proc.running():
                left = proc.kill(5)
                self.say(f"ended the install left by the previous supervisor (process group "
                         f"{child['pgid']}{', survivors ' + str(left) if left else ''})")
                self.journal.event("install_ended", pgid=child["pgid"], left=left)
            for _ in self.runner.relay.drain():
                pass
            self.journal.set_state(child=None)
            return None
        logname = child.get("log") or f"{child.get('phase')}.log"
        if child.get("phase") == "train":
            self.resumed_policy(child.get("profile") or profile, bool(self.journal.state().get("resume")))
            # its supervisor died at the spawn:
            if self.history.rollbacks and "running_at" not in self.history.rollbacks[-1]:
                self.runner.spawned_at = child.get("started_at") or now()  # the start it wrote down
                self.rollback_done(None)
        watch_tps = bool(child.get("watch_tps"))
        timeout = defaults.section(self.job.spec, "warmup")["timeout"] if child.get("phase") == "warmup" \
            else defaults.section(self.job.spec, "train")["timeout"]
        return self.watch(None, None, logname, child.get("profile") or profile, timeout=timeout,
                          watch_tps=watch_tps, grace=defaults.section(self.job.spec, "train")["grace"],
                          adopt=child)
