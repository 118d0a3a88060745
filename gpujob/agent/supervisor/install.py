"""The supervisor's half that builds and activates profile venvs (stdlib only).

``Envs``: built by the Supervisor with the job (``parts.Job``), the journal, the
report, the runner (which starts and ends the install steps, and relays their
output) and the stop flag. An install step runs under the same keeper as any phase command, so a supervisor
that dies mid-install leaves a recorded process group that the next one ends
before installing again.
"""

from __future__ import annotations

import collections
import json
import os
import shlex
import subprocess
import sys

from gpujob.agent.home import gc
from gpujob.agent.judge import throughput
from gpujob.agent.base import envs, planshare
from gpujob.agent.base.fsio import now, write_bytes, write_json
from gpujob.agent.judge.outcome import EnvError
from gpujob.agent.supervisor.parts import Job, Report, Runner, StopFlag
from gpujob.agent.supervisor.watch import POLL
from gpujob.agent.judge.outcome import Stop


class Envs:
    """The job's profile venvs: built, verified, pointed at; their caches cleared."""

    def __init__(self, job: Job, journal, report: Report, runner: Runner, stop: StopFlag):
        self.job, self.journal, self.report, self.runner, self.stop = job, journal, report, runner, stop
        self.env_key, self.cache_key = job.env_key, job.cache_key
        self.say = report.say

    def activate(self, profile: str, durable: bool | None = True, **then) -> None:
        """Make sure the profile's venv exists, then point the job at it atomically
        (``durable``: as Journal.set_state's; a build makes the state durable first;
        ``then``: more state, written with the profile)."""
        self.ensure_env(profile)
        link = self.journal.path("venv")
        tmp = f"{link}.tmp{os.getpid()}"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(envs.env_dir(self.job.home.root, self.env_key(profile)), tmp)
        os.replace(tmp, link)
        gc.touch_used(envs.env_dir(self.job.home.root, self.env_key(profile)))  # for `gpujob gc`
        self.journal.set_state(profile=profile, env_key=self.env_key(profile), durable=durable, **then)
        self.journal.event("profile_active", profile=profile, env_key=self.env_key(profile))
    def ensure_env(self, profile: str) -> None:
        key = self.env_key(profile)
        if envs.is_installed(self.job.home.root, key):
            self.journal.event("env_reused", profile=profile, env_key=key)
            self.say(f"profile {profile}: venv {key} already installed, reusing it")
            return
        self.journal.sync()  # a durable state before the build's acts
        prof = self.job.profiles[profile]
        venv = envs.env_dir(self.job.home.root, key)
        envs.remove_tree(venv)  # an interrupted build left no marker: start over
        os.makedirs(os.path.dirname(venv), exist_ok=True)
        uv = self.job.job.get("uv")
        if not uv:
            self.journal.event("warning", message="uv not available in the container; using pip (slower)")
            self.say("warning: no uv in the container, installing with pip (slower)")
        t0 = now()
        self.journal.event("env_build", profile=profile, env_key=key, installer="uv" if uv else "pip")
        self.say(f"profile {profile}: building venv {key} with {'uv' if uv else 'pip'}")
        os.makedirs(venv, exist_ok=True)  # so the side files below have a place; uv venv reuses it
        constraints, req_file = planshare.side_files(venv, prof)
        cmds = planshare.env_build_commands(prof, venv, sys.executable, uv=uv, home=self.job.home.root,
                                            spec=self.job.spec)
        try:
            for i, argv in enumerate(cmds):
                if i == 1:  # the venv exists now; side files go in
                    if req_file:
                        write_bytes(req_file, prof["requirements_text"].encode(), durable=False)
                    write_bytes(constraints, ("\n".join(prof["packages"]) + "\n").encode(), durable=False)
                self.journal.event("prepare", profile=profile, argv=argv)  # the plan's env steps, as run
                code, tail = self.run_logged(argv, "prepare.log", timeout=3600)
                if code != 0:
                    raise EnvError(f"installing profile {profile} failed ({os.path.basename(argv[0])} "
                                   f"exit {code}): {tail}")
            code, out = self.capture(envs.verify_command(venv, prof))
            try:
                report = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                raise EnvError(f"verifying profile {profile} failed: {out.strip()[-300:]}") from None
            problems = envs.check_verify(prof, report)
            if problems:
                raise EnvError(f"profile {profile} does not hold its pins: {'; '.join(problems)}")
        except BaseException:
            envs.remove_tree(venv)
            raise
        report.update(profile=profile, env_key=key, built_at=now(), seconds=round(now() - t0, 2),
                      installer="uv" if uv else "pip")
        write_json(os.path.join(venv, envs.OK_MARKER), report)
        self.journal.event("env_ready", **report)
        self.say(f"profile {profile}: venv ready in {now() - t0:.1f}s "
                 f"({', '.join(f'{k}=={v}' for k, v in report['packages'].items())})")

    def clear_caches(self, profile: str) -> None:
        envs.remove_tree(envs.cache_dir(self.job.home.root, self.cache_key(profile)))
        self.journal.event("cache_cleared", profile=profile)
        self.say(f"profile {profile}: compile caches cleared")


    # ---- running children -------------------------------------------------
    def capture(self, argv: list) -> tuple:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=600)
        return p.returncode, p.stdout.decode("utf-8", "replace")

    def run_logged(self, argv: list, logname: str, timeout: float) -> tuple:
        """Run a preparation step with its output in ``logname`` and job.log. A stop
        ends it at once (its whole process group); so does its timeout."""
        self.say("$ " + shlex.join(argv))
        tail: collections.deque = collections.deque(maxlen=5)
        split = throughput.LineSplitter()
        proc = self.runner.start_phase(argv, None, None, logname, {"profile": None})
        deadline = now() + timeout
        last_check = 0.0
        while True:
            chunk = self.runner.log_relay().poll()
            tail.extend(ln.strip() for ln in split.feed(chunk) if ln.strip())
            if not chunk:
                if not proc.running():
                    for chunk in self.runner.log_relay().drain():
                        tail.extend(ln.strip() for ln in split.feed(chunk) if ln.strip())
                    break
                self.runner.nap(proc, POLL)
            t = now()
            if t > deadline:
                self.say(f"{os.path.basename(argv[0])} timed out after {timeout:g}s")
                proc.kill(5)
            elif t - last_check > 0.2:  # a stop need not wait for a 10-minute install
                last_check = t
                if self.requests_stop():
                    proc.kill(5)
        tail.extend(ln.strip() for ln in split.flush() if ln.strip())
        self.runner.end_phase()
        if self.stop.asked:
            raise Stop()
        code = proc.returncode
        return (code if code is not None else -1), " | ".join(tail)

    def requests_stop(self) -> bool:
        if not self.stop.asked and any(req["kind"] == "stop" for _n, req in self.journal.pending()):
            self.stop.asked = True
        return self.stop.asked

