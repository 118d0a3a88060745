"""The pieces every role of the supervisor shares (stdlib only), each with one owner:

- ``Job``: the job as submitted, a read-only value (its id, job.json, the spec, the
  home, the workdir, the profiles, the rollback section, the cache keys);
- ``Report``: what the job says (job.log banners, the state write with its event and
  the metrics file) and the notifier;
- ``StopFlag``: a stop was asked (SIGTERM, a stop request);
- ``History``: the rollbacks and restarts written to state.json;
- ``ChildEnv``: the placeholder values and the environment of every child, and the
  job's secrets;
- ``Runner``: starts, waits on and ends a phase command under its keeper; it owns the
  running phase process and the relay into job.log.

The roles (envs, caches, guard, checkpoints, standby, watch, verdicts, phases) get
these in their constructors (supervisor.py builds them; docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import os
import select
import time

from gpujob.agent.base import defaults, envs, jobenv, planshare
from gpujob.agent.base.fsio import now, read_json, write_json
from gpujob.agent.base.placeholders import fleet_env, placeholder_env
from gpujob.agent.base.proc import Phase, die_here
from gpujob.agent.base.protocol import JobState
from gpujob.agent.home.journal import Home
from gpujob.agent.home.relay import JobLog, Relay
from gpujob.agent.judge.outcome import EnvError
from gpujob.agent.supervisor.boothook import boot_identity

SECRETS_FILE = "secrets.json"  # in the job dir, 0600: env values the spec marks as secrets


@dataclasses.dataclass(frozen=True)
class Job:
    """The job as submitted: nothing here changes while a supervisor runs."""

    job_id: str
    job: dict
    spec: dict
    home: Home
    workdir: str
    profiles: dict
    rb: dict
    per_profile_caches: bool

    @classmethod
    def of(cls, home, job_id: str, job: dict) -> Job:
        spec = job["spec"]
        return cls(job_id=job_id, job=job, spec=spec, home=home, workdir=home.workdir(spec),
                   profiles={p["name"]: p for p in spec["profiles"]},
                   rb=defaults.section(spec, "rollback"),
                   per_profile_caches=defaults.section(spec, "caches")["per_profile"])

    def env_key(self, profile: str) -> str:
        return self.job["env_keys"][profile]

    def cache_key(self, profile: str) -> str:
        """Caches are per profile (the venv's key) unless the spec shares them."""
        return self.env_key(profile) if self.per_profile_caches else "shared"


class Report:
    """job.log's banners, the state write that users see, and the notifier."""

    def __init__(self, journal, metrics, notifier):
        self.journal, self.metrics, self.notifier = journal, metrics, notifier
        self.joblog: JobLog | None = None  # opened by Supervisor.main

    def say(self, text: str) -> None:
        """A gpujob banner line in job.log (the combined log `gpujob logs` follows),
        always on a line of its own. None before job.log is open, or when it could not be
        (Supervisor.main): the state and the events say what happened then."""
        if self.joblog is None:
            return
        self.joblog.banner(f"[gpujob {time.strftime('%H:%M:%S')}] {text}")

    def set_state(self, state: JobState, durable: bool | None = True, **kw) -> None:
        self.journal.set_state(state=state, durable=durable, **kw)
        self.journal.event("state", state=state, **{k: v for k, v in kw.items()
                                                    if k in ("phase", "profile", "reason")})
        self.metrics.write(force=True)


class PolicyHolder:
    """The throughput policy in force (None when throughput is not watched): the spec's,
    or with a resumed known-good profile's short start-up delay (``Phases``)."""

    def __init__(self, base):
        self.base = self.now = base

    def resumed(self, initial_delay: float | None) -> None:
        """``initial_delay`` for this run (None: the spec's policy as it is)."""
        self.now = self.base if initial_delay is None else dataclasses.replace(self.base,
                                                                               initial_delay=initial_delay)


class StopFlag:
    """A stop was asked: set by SIGTERM and by a stop request, read by every loop."""

    def __init__(self):
        self.asked = False


class History:
    """The job's rollbacks and restarts (state.json's lists), appended here only."""

    def __init__(self, state: dict):
        self.rollbacks: list = list(state.get("rollbacks") or [])
        self.restarts: list = list(state.get("restarts") or [])

    def add_rollback(self, rec: dict) -> None:
        self.rollbacks.append(rec)

    def add_restart(self, rec: dict) -> None:
        self.restarts.append(rec)


class ChildEnv:
    """The placeholder values and the environment of every child; the job's secrets."""

    def __init__(self, job: Job, journal, notifier):
        self.job, self.journal, self.notifier = job, journal, notifier
        self._secrets: dict | None = None
        self._login: dict | None = None
        self._passed: dict = {}

    def values(self, profile: str, gpu=None) -> dict:
        j = self.job
        return planshare.template_values(j.spec, job_id=j.job_id, profile=profile, workdir=j.workdir,
                                         fleet=j.job.get("fleet"), gpu=gpu)

    def child_env(self, profile: str, extra: dict | None = None) -> dict:
        j = self.job
        if self._login is None:  # once per supervisor: a login shell costs ~10 ms
            self._login, source = jobenv.login_env()
            passed = jobenv.passed_through(dict(os.environ), j.job.get("env_passthrough") or [])
            self.journal.event("job_env", login=source, passthrough=sorted(passed))
            self._passed = passed
        secrets = self.secrets()
        # GPUJOB_GPUS_*, _JOB_ID, ...
        own = {"GPUJOB_HOME": j.home.root, **placeholder_env(self.values(profile))}
        if j.job.get("fleet"):
            own.update(fleet_env(j.job["fleet"]["values"]))
        return jobenv.job_env(self._login, self._passed,
                              [j.spec.get("env"), secrets.get("env"), j.profiles[profile].get("env"),
                               (secrets.get("profiles") or {}).get(profile),
                               envs.cache_env(j.home.root, j.cache_key(profile)), own],
                              self.journal.path("venv"), extra)

    def secrets(self) -> dict:
        """The secret env values of the job (secrets.json, 0600), read once; {} without."""
        if self._secrets is None:
            self._secrets = read_json(self.journal.path(SECRETS_FILE), {}) or {}
            env_names = [n for n in self.job.job.get("secret_names") or [] if not n.startswith("notify[")]
            if env_names and not (self._secrets.get("env") or self._secrets.get("profiles")):
                raise EnvError("the job's secrets were removed from the container when it ended; "
                               "submit it again to run it")
        return self._secrets

    def drop_secrets(self) -> None:
        """The job has ended: its secrets leave the container (a webhook's stay until
        the job's last messages are out: notify.py)."""
        kept = self.notifier.kept_secrets()
        if kept:
            try:
                write_json(self.journal.path(SECRETS_FILE), kept, mode=0o600)
                return
            except OSError:  # a full disk: all of them go
                pass
        try:
            os.unlink(self.journal.path(SECRETS_FILE))
        except FileNotFoundError:
            pass


class Runner:
    """Starts a phase command under its keeper (its record in state first), waits on it
    and ends it; owns the running phase process and the relay into job.log."""

    def __init__(self, journal):
        self.journal = journal
        self.relay: Relay | None = None  # opened by Supervisor.main
        self.proc: Phase | None = None
        self.spawned_at: float | None = None

    def start_phase(self, argv, env, cwd, logname: str, extra: dict, started=None) -> Phase:
        """Start a phase command (or take ``started``: (a Phase already running, where
        its output starts in the log)); its record goes to state before anything else."""
        log_path = self.journal.path(logname)
        phase = logname[:-len(".log")]
        rec = dict(phase=phase, log=logname, started_at=now(), boot=boot_identity(), **extra)
        if started is not None:
            proc, log_start = started
        else:
            log_start = os.path.getsize(log_path) if os.path.exists(log_path) else 0
            exit_file = self.journal.path(f"{phase}.exit")
            for stale in (exit_file, exit_file + ".tmp"):  # the last run's: one left here would read,
                if os.path.exists(stale):  # to a supervisor dying before the start, as this one's end
                    os.unlink(stale)
            # written before the start: a supervisor dying right after it finds the command
            # by its keeper's exit file (proc.keepers_of) instead of starting a second one
            self.journal.set_state(child_starting=dict(rec, exit_file=exit_file, log_start=log_start))
            die_here(f"{phase}_starting:{extra.get('profile')}")
            proc = Phase.start(argv, env=env, cwd=cwd, log_path=log_path, exit_file=exit_file)
            die_here(f"{phase}_started:{extra.get('profile')}")
        self.spawned_at = now()  # (a standby's: when it took the argv)
        self.proc = proc
        rec = dict(proc.record(), log_start=log_start, **rec)
        self.journal.set_state(child=rec, child_pid=proc.pgid, child_pgid=proc.pgid, child_starting=None)
        self.log_relay().follow(logname, log_start)
        return proc

    def log_relay(self) -> Relay:
        """The relay into job.log: Supervisor.main opens it before any phase starts."""
        assert self.relay is not None, "a phase started before Supervisor.main opened the relay"
        return self.relay

    def end_phase(self, durable: bool = True) -> None:
        """The phase command is gone. From the watch not fsynced: the supervisor's
        ``handle`` makes it durable before it acts (a rollback: its spawn's write)."""
        self.proc = None
        self.journal.set_state(child=None, child_pid=None, ending=None, durable=durable)

    @staticmethod
    def nap(proc: Phase, seconds: float) -> None:
        """Wait ``seconds``, or less if the command exits meanwhile."""
        fd = proc.wait_fd()
        if fd is not None:
            select.select([fd], [], [], seconds)
        else:
            time.sleep(seconds)
