"""A standby interpreter of the rollback target (stdlib only).

Restarting a torch trainer costs seconds before its first step: ``import torch``
(~3 s) and the dynamo/inductor imports (~6 s more on an H200 box), all before the
warm compile cache can help. While a job trains on a profile that may be rolled
back, the supervisor keeps one interpreter of the profile it would roll back to
(``train.standby``): started in that profile's venv with the job's environment for
that profile, it imports ``preload`` (no CUDA is initialised: importing torch
touches no GPU) and waits on a FIFO. At a rollback onto that profile the
supervisor writes the trainer's argv to the FIFO; the standby moves its output
onto train.log, changes into the workdir and runs the script as ``__main__``, as
``python SCRIPT ARGS`` would. It runs under the same keeper as any phase command,
so it is watched, stopped and re-adopted like one.

Only ``python SCRIPT …`` and ``python -m MODULE …`` commands can be run this way.
"""

from __future__ import annotations

import errno
import json
import os
import shlex

from gpujob.agent.base import envs
from gpujob.agent.judge.decide import pick
from gpujob.agent.base.placeholders import command_script, script_argv, substitute
from gpujob.agent.base.fsio import now
from gpujob.agent.base.proc import Phase

STANDBY = r"""
import importlib, json, os, runpy, sys, tempfile, time
fifo, ready = sys.argv[1], sys.argv[2]
t0 = time.time()
for name in sys.argv[3:]:
    importlib.import_module(name)
# a fresh name, so no planted link is written through
fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(ready)), prefix=".ready-")
with os.fdopen(fd, "w") as f:
    json.dump({"pid": os.getpid(), "preloaded": sys.argv[3:], "seconds": round(time.time() - t0, 3)}, f)
os.replace(tmp, ready)
with open(fifo) as f:               # blocks until the supervisor writes the go message
    line = f.readline()
if not line:
    sys.exit(0)                     # released without a go: nothing to run
msg = json.loads(line)
log = os.open(msg["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
sys.stdout.flush(); sys.stderr.flush()
os.dup2(log, 1); os.dup2(log, 2); os.close(log)
os.chdir(msg["cwd"])
os.environ.update(msg.get("env") or {})
argv = msg["argv"]
if argv[0] == "-m":
    sys.argv = argv[1:]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
else:
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    runpy.run_path(argv[0], run_name="__main__")
"""

def standby_argv(venv_python: str, fifo: str, ready: str, preload: list) -> list:
    return [venv_python, "-c", STANDBY, fifo, ready, *preload]


def make_fifo(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
    os.mkfifo(path, 0o600)


def is_ready(ready: str) -> bool:
    return os.path.exists(ready)


def go(fifo: str, message: dict) -> bool:
    """Hand the standby its trainer; False when no standby waits on the FIFO."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.ENOENT):  # nobody reads it: the standby is gone
            return False
        raise
    try:
        os.set_blocking(fd, True)
        data = (json.dumps(message) + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:
        return False
    finally:
        os.close(fd)
    return True


class Standby:
    """The supervisor's role that keeps, hands over and ends the standby interpreter;
    built with the job (``parts.Job``), the journal, the ledger, the envs (the env
    keys), the child env and the report. It owns the standby's process (``proc``)."""

    def __init__(self, job, journal, ledger, envs, child_env, report):
        self.job, self.journal, self.ledger, self.envs, self.child_env = job, journal, ledger, envs, child_env
        self.env_key, self.say = envs.env_key, report.say
        self.proc: Phase | None = None  # an interpreter of the rollback target, preloaded

    # ---- the standby interpreter (train.standby) ----------------------------
    def keep_standby(self, profile: str) -> None:
        """While training on ``profile``, keep an interpreter of the profile a
        rollback would go to (known-good, installed) preloaded and waiting."""
        cfg = self.job.spec["train"].get("standby")
        if not cfg or command_script(self.job.spec["train"]["command"]) is None:
            return
        target = pick(self.ledger.read(), profile, self.job.profiles, self.job.rb.get("fallback"))
        if target is None or self.ledger.status(target) != "good" or \
                not envs.is_installed(self.job.home.root, self.env_key(target)):
            self.drop_standby()
            return
        rec = self.journal.state().get("standby") or {}
        if rec.get("profile") == target and self.proc is not None and self.proc.running():
            return
        self.drop_standby()
        fifo, ready = self.journal.path("standby.fifo"), self.journal.path("standby.ready")
        for stale in (ready,):
            if os.path.exists(stale):
                os.unlink(stale)
        make_fifo(fifo)
        vpy = os.path.join(envs.env_dir(self.job.home.root, self.env_key(target)), "bin", "python")
        proc = Phase.start(standby_argv(vpy, fifo, ready, list(cfg.get("preload") or [])),
                           env=self.child_env.child_env(target), cwd=self.job.workdir,
                           log_path=self.journal.path("standby.log"),
                           exit_file=self.journal.path("standby.exit"))
        self.proc = proc
        self.journal.set_state(standby=dict(proc.record(), profile=target, env_key=self.env_key(target),
                                            fifo=fifo, ready=ready, started_at=now()))
        self.journal.event("standby_started", profile=target, pgid=proc.pgid,
                           preload=list(cfg.get("preload") or []))

    def take_standby(self, profile: str, extra: list):
        """(the standby, where its output starts in train.log) when a standby of
        ``profile`` is ready and took the trainer's argv; else None."""
        rec = self.journal.state().get("standby") or {}
        if self.proc is None or rec.get("profile") != profile or rec.get("env_key") != self.env_key(profile):
            return None
        if not (self.proc.running() and is_ready(rec["ready"])):
            self.journal.event("standby_not_ready", profile=profile)
            self.drop_standby()
            return None
        command = self.job.spec["train"]["command"]
        if isinstance(command, str):  # quoted as for bash -c, then split as bash would
            command = shlex.split(substitute(command, self.child_env.values(profile), shlex.quote))
        else:
            command = [substitute(str(a), self.child_env.values(profile)) for a in command]
        script = script_argv(command)
        log = self.journal.path("train.log")
        log_start = os.path.getsize(log) if os.path.exists(log) else 0
        self.journal.sync()  # a durable state before the trainer starts in the standby
        if script is None or not go(rec["fifo"], {"argv": script + list(extra), "cwd": self.job.workdir,
                                                          "log": log}):
            self.drop_standby()
            return None
        proc, self.proc = self.proc, None
        self.journal.set_state(standby=None)
        self.journal.event("standby_used", profile=profile, pgid=proc.pgid)
        self.say(f"train on {profile} started in its standby interpreter (preloaded: "
                 f"{', '.join(self.job.spec['train']['standby'].get('preload') or []) or 'nothing'})")
        return proc, log_start

    def drop_standby(self) -> None:
        if self.proc is not None:
            if self.proc.running():
                self.journal.sync()
                self.proc.kill(2)
            self.proc = None
            self.journal.event("standby_dropped")
        if self.journal.state().get("standby"):
            self.journal.set_state(standby=None)

