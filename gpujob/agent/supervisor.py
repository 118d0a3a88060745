"""The supervisor: owns one job inside the container, needing no laptop (stdlib only).

prepare env (venv per wheel profile) → warmup → train, while it watches tokens/s
and failure signals and rolls back to the last known-good profile by itself.
Everything it does goes to the job's journal (see journal.py).
"""

from __future__ import annotations

import collections
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time

from gpujob.agent import envs, throughput
from gpujob.agent.journal import Home, Journal, Ledger, Lock, group_pids, now, read_json, write_json

POLL = 0.05            # seconds between looks at a quiet child
COALESCE = 0.05        # after a small read, let output gather this long: one wakeup per
                       # 50 lines of a trainer printing 1000 lines/s instead of one per line
                       # (CPU); job.log lags the trainer by 50 ms at most
COALESCE_BELOW = 16384  # a read this big means a fast writer: read on at once, never throttle
STATE_EVERY = 1.0      # state.json rewrite period while samples stream in
TAIL_LINES = 200
SIGNATURE_GRACE = 10.0  # a trainer still running this long after an error signature is stuck


class EnvError(Exception):
    """Building or verifying a profile's venv failed (one line)."""


class Stop(Exception):
    """A stop was asked for (request or SIGTERM)."""


class Outcome:
    """How a phase run ended: ``done`` (exit 0), ``signal`` (a failure signal with
    its reason), ``stop``, or ``rollback`` (asked for by the user)."""

    def __init__(self, kind: str, signal_name: str = "", reason: str = "", evidence=None,
                 to: str | None = None, exit_code=None):
        self.kind, self.signal_name, self.reason = kind, signal_name, reason
        self.evidence, self.to, self.exit_code = evidence or {}, to, exit_code
        self.at = now()  # when it was decided: a rollback's clock starts here


def idle_for(history: list, below: float) -> float:
    """How long a GPU group has stayed under ``below`` percent: ``history`` holds
    (time, busiest GPU's utilisation) pairs, oldest first."""
    since = None
    for t, util in reversed(history):
        if util >= below:
            break
        since = t
    return history[-1][0] - since if since is not None else 0.0


def gpu_utilisation(gpus: list) -> float | None:
    """The busiest of ``gpus`` (percent) from nvidia-smi, or None when it cannot tell."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu",
                            "--format=csv,noheader,nounits"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    util = {}
    for line in p.stdout.decode("utf-8", "replace").splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                util[int(parts[0])] = float(parts[1])
            except ValueError:
                pass
    seen = [util[g] for g in gpus if g in util]
    return max(seen) if seen and len(seen) == len(gpus) else None


PLACEHOLDER = re.compile(r"\{(gpus\.[a-z_][a-z0-9_]*|gpu|profile|job_id|workdir)\}")
SECRETS_FILE = "secrets.json"  # in the job dir, 0600: env values the spec marks as secrets


def substitute(text: str, values: dict, quote=None) -> str:
    """Replace ``{gpus.NAME}``, ``{gpu}``, ``{profile}``, ``{job_id}``, ``{workdir}``
    (each value passed through ``quote`` when given); any other braces (``${VAR}``,
    ``{}``) are left alone."""
    def one(m):
        if m.group(1) not in values:
            return m.group(0)
        return quote(values[m.group(1)]) if quote else values[m.group(1)]
    return PLACEHOLDER.sub(one, text)


def quoted_placeholders(text: str) -> list:
    """The placeholders of a shell command string that sit inside quotes (or after a
    backslash): gpujob quotes each value itself, so a quote around it would break it."""
    found, quote, i = [], None, 0
    while i < len(text):
        c = text[i]
        m = PLACEHOLDER.match(text, i)
        if m:
            if quote:
                found.append(m.group(0))
            i = m.end()
            continue
        if c == "\\" and quote != "'":
            i += 2
            continue
        if quote is None and c in "'\"":
            quote = c
        elif c == quote:
            quote = None
        i += 1
    return found


def command_argv(command, values: dict, extra_args=()) -> list:
    """A spec command (a shell string or an argv list) as an argv list. In a shell
    string each substituted value is quoted for that shell (``/root/a b`` stays one
    word, ``x;touch p`` runs nothing); an argv list gets the values as they are."""
    if isinstance(command, str):
        text = substitute(command, values, shlex.quote)
        if extra_args:
            text += " " + shlex.join(list(extra_args))
        shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        return [shell, "-c", text]
    argv = [substitute(str(a), values) for a in command]
    if is_shell_c(command):  # ["bash", "-c", "cd {workdir} && ..."]: that string is shell too
        argv[2] = substitute(command[2], values, shlex.quote)
    return argv + list(extra_args)


def is_shell_c(argv) -> bool:
    """An argv that hands its third element to a shell: [bash|sh|dash|zsh, -c, SCRIPT, ...]."""
    return (isinstance(argv, list) and len(argv) >= 3 and argv[1] == "-c"
            and os.path.basename(str(argv[0])) in ("bash", "sh", "dash", "zsh"))


def placeholder_env(values: dict) -> dict:
    """The substituted values again as variables: GPUJOB_WORKDIR, GPUJOB_GPU,
    GPUJOB_GPUS_<GROUP>, GPUJOB_PROFILE, GPUJOB_JOB_ID."""
    return {"GPUJOB_" + key.replace(".", "_").upper(): str(value) for key, value in values.items()}


class _Run:
    """What one run of a phase command knows while the supervisor watches it."""

    def __init__(self, sup: "Supervisor", logname: str, profile: str, timeout, watch_tps: bool):
        self.phase = logname[:-len(".log")]
        self.profile = profile
        self.timeout = timeout
        self.watch_tps = watch_tps
        self.start = now()
        self.samples: list = []
        self.baseline = sup.ledger.baseline(profile) or sup.ledger.baseline(sup.ledger.last_good() or "")
        self.good_known = sup.ledger.status(profile) == "good"
        self.tail = collections.deque(maxlen=TAIL_LINES)
        self.hits: list = []
        self.hit_at = None  # (when, signal) of the first error signature printed
        self.last_state = self.last_check = self.last_gpu = 0.0
        self.last_verdict = None
        self.idle_cfg = sup.rb.get("gpu_idle") if logname == "train.log" else None
        gpus = sup.spec.get("gpus") or {}
        self.idle_gpus: list = []
        if self.idle_cfg:
            self.idle_gpus = list(gpus[self.idle_cfg["group"]]) if self.idle_cfg.get("group") else \
                sorted({g for ids in gpus.values() for g in ids})
        self.idle_poll = min(10.0, max(0.5, self.idle_cfg["for"] / 5)) if self.idle_cfg else 0
        self.gpu_history: list = []


class Supervisor:
    def __init__(self, home: str, job_id: str):
        self.home = Home(home)
        self.journal = Journal(self.home, job_id)
        self.job_id = job_id
        self.job = self.journal.job()
        self.spec = self.job["spec"]
        self.ledger = Ledger(self.home, self.spec["name"])
        self.lock = Lock(self.home)
        self.profiles = {p["name"]: p for p in self.spec["profiles"]}
        self.workdir = self.home.workdir(self.spec)
        self.stop_asked = False
        self.child: subprocess.Popen | None = None
        self.rollbacks = list(self.journal.state().get("rollbacks") or [])
        self.logf = None
        self._secrets: dict | None = None
        tp = self.spec.get("throughput")
        self.parse_tps = self.parse_step = None
        if tp:
            gpus = self.spec.get("gpus") or {}
            scale = 1.0
            if tp.get("scope") == "per_gpu":
                group = tp.get("scope_group")
                scale = float(len(gpus[group]) if group else sum(len(v) for v in gpus.values()) or 1)
            self.parse_tps = throughput.make_parser(tp["format"], pattern=tp.get("pattern"),
                                                    tokens_per_step=tp.get("tokens_per_step"),
                                                    scale=scale)
            self.parse_step = throughput.make_step_parser(tp["format"])
            self.policy = throughput.PolicyConfig(
                min=tp.get("min"), min_ratio=tp.get("min_ratio"), window=tp.get("window", 5),
                failure_limit=tp.get("failure_limit", 3),
                initial_delay=tp.get("initial_delay", 0.0),
                initial_delay_samples=tp.get("initial_delay_samples", 0),
                no_data_timeout=tp.get("no_data_timeout", 600.0),
                good_after=tp.get("good_after", 600.0))
        self.rb = self.spec.get("rollback") or {}
        self.per_profile_caches = (self.spec.get("caches") or {}).get("per_profile", True)
        self.signatures = list(self.rb.get("error_signatures") or [])

    # ---- journal helpers -------------------------------------------------
    def say(self, text: str) -> None:
        """A gpujob banner line in job.log (the combined log `gpujob logs` follows)."""
        stamp = time.strftime("%H:%M:%S")
        self.logf.write(f"[gpujob {stamp}] {text}\n".encode())
        self.logf.flush()

    def set_state(self, state: str, **kw) -> None:
        self.journal.set_state(state=state, **kw)
        self.journal.event("state", state=state, **{k: v for k, v in kw.items()
                                                    if k in ("phase", "profile", "reason")})

    # ---- entry -------------------------------------------------------------
    def main(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        os.makedirs(self.journal.dir, exist_ok=True)
        self.logf = open(self.journal.path("job.log"), "ab")
        self.lock.update(self.job_id, os.getpid())
        mode = self.job.get("start", {})
        self.journal.set_state(supervisor_pid=os.getpid(), started_at=self.journal.state().get("started_at") or now())
        try:
            self.lifecycle(mode)
        except Stop:
            self.finish("stopped", "stopped on request")
        except EnvError as e:
            self.finish("failed", str(e))
        except Exception as e:  # never die silently: the journal says what happened
            self.journal.event("error", error=f"{type(e).__name__}: {e}")
            self.finish("failed", f"supervisor error: {type(e).__name__}: {e}")
            raise
        finally:
            self.lock.release(self.job_id)
        return 0

    def _on_sigterm(self, *_):
        self.stop_asked = True

    def finish(self, state: str, reason: str, **kw) -> None:
        self.drop_secrets()
        self.say(f"job {state}: {reason}")
        self.set_state(state, phase="done", reason=reason, finished_at=now(), **kw)

    # ---- the job -----------------------------------------------------------
    def lifecycle(self, mode: dict) -> None:
        profile = mode.get("profile") or self.job["profile"]
        resume = bool(mode.get("resume"))
        if mode.get("rollback_from"):
            self.ledger.mark(mode["rollback_from"], "bad", reason=mode.get("reason", "rolled back by hand"),
                             job=self.job_id)
            self.record_rollback(mode["rollback_from"], profile, mode.get("reason", "rolled back by hand"),
                                 "manual", {})
        self.set_state("preparing", phase="env", profile=profile)
        self.activate(profile)
        if self.job.get("clear_caches") and not resume:
            self.clear_caches(profile)
        while True:
            out = self.requests() or self.warmup(profile)
            if out.kind == "done":
                out = self.train(profile, resume)
            if out.kind == "done":
                if self.parse_tps is None and self.ledger.status(profile) != "good":
                    self.ledger.mark(profile, "good", job=self.job_id, reason="job succeeded")
                self.finish("succeeded", "train exited 0", exit_code=0)
                return
            if out.kind == "stop":
                raise Stop()
            if out.kind == "rollback":  # asked for by the user, who named the target
                self.ledger.mark(profile, "bad", reason=out.reason, job=self.job_id)
                profile = self.rollback(profile, out.to, out, "manual")
                resume = True
                continue
            # a failure signal
            sig, reason = out.signal_name, out.reason
            on = self.rb.get("on") or []
            if not self.rb.get("enabled", True) or sig not in on:
                self.finish("failed", reason, signal=sig, exit_code=out.exit_code)
                return
            self.ledger.mark(profile, "bad", reason=reason, evidence=out.evidence, job=self.job_id)
            if len(self.auto_rollbacks()) >= int(self.rb.get("max_rollbacks", 2)):
                self.finish("failed", f"max_rollbacks ({self.rb.get('max_rollbacks', 2)}) reached; "
                                      f"last: {reason}", signal=sig, exit_code=out.exit_code)
                return
            target = self.pick_known_good(profile)
            if target is None:
                self.finish("failed", f"no known-good profile to roll back to; {profile}: {reason}",
                            signal=sig, exit_code=out.exit_code)
                return
            profile = self.rollback(profile, target, out, sig)
            resume = True

    def auto_rollbacks(self) -> list:
        return [r for r in self.rollbacks if r.get("signal") != "manual"]

    def pick_known_good(self, current: str):
        return self.ledger.pick(current, self.profiles, self.rb.get("fallback"))

    def record_rollback(self, frm, to, reason, sig, evidence, decided_at=None) -> dict:
        rec = {"from": frm, "to": to, "reason": reason, "signal": sig,
               "decided_at": decided_at or now()}
        self.rollbacks.append(rec)
        self.journal.event("rollback", evidence=evidence, **rec)
        self.journal.set_state(rollbacks=self.rollbacks)
        return rec

    def rollback(self, frm: str, to: str, out: Outcome, sig: str) -> str:
        self.say(f"ROLLBACK {frm} -> {to}: {out.reason}")
        self.record_rollback(frm, to, out.reason, sig, out.evidence, out.at)
        self.set_state("rolling_back", phase="env", profile=to, reason=out.reason)
        self.activate(to)
        return to

    # ---- environments ------------------------------------------------------
    def env_key(self, profile: str) -> str:
        return self.job["env_keys"][profile]

    def cache_key(self, profile: str) -> str:
        """Caches are per profile (the venv's key) unless the spec shares them."""
        return self.env_key(profile) if self.per_profile_caches else "shared"

    def activate(self, profile: str) -> None:
        """Make sure the profile's venv exists, then point the job at it atomically."""
        self.ensure_env(profile)
        link = self.journal.path("venv")
        tmp = f"{link}.tmp{os.getpid()}"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(envs.env_dir(self.home.root, self.env_key(profile)), tmp)
        os.replace(tmp, link)
        self.journal.set_state(profile=profile, env_key=self.env_key(profile))
        self.journal.event("profile_active", profile=profile, env_key=self.env_key(profile))

    def ensure_env(self, profile: str) -> None:
        key = self.env_key(profile)
        if envs.is_installed(self.home.root, key):
            self.journal.event("env_reused", profile=profile, env_key=key)
            self.say(f"profile {profile}: venv {key} already installed, reusing it")
            return
        prof = self.profiles[profile]
        venv = envs.env_dir(self.home.root, key)
        envs.remove_tree(venv)  # an interrupted build left no marker: start over
        os.makedirs(os.path.dirname(venv), exist_ok=True)
        uv = self.job.get("uv")
        if not uv:
            self.journal.event("warning", message="uv not available in the container; using pip (slower)")
            self.say("warning: no uv in the container, installing with pip (slower)")
        t0 = now()
        self.journal.event("env_build", profile=profile, env_key=key, installer="uv" if uv else "pip")
        self.say(f"profile {profile}: building venv {key} with {'uv' if uv else 'pip'}")
        os.makedirs(venv, exist_ok=True)  # so the side files below have a place; uv venv reuses it
        req_file = None
        if prof.get("requirements_text"):
            req_file = os.path.join(venv, ".gpujob-requirements.txt")
        constraints = os.path.join(venv, ".gpujob-constraints.txt")
        cmds = envs.build_commands(prof, venv, sys.executable, uv=uv,
                                   uv_cache=self.home.path("uv-cache"),
                                   common_requirements=self.spec.get("requirements") or [],
                                   constraints_file=constraints,
                                   profile_requirements_file=req_file)
        try:
            for i, argv in enumerate(cmds):
                if i == 1:  # the venv exists now; side files go in
                    if req_file:
                        with open(req_file, "w") as f:
                            f.write(prof["requirements_text"])
                    with open(constraints, "w") as f:
                        f.write("\n".join(prof["packages"]) + "\n")
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
        envs.remove_tree(envs.cache_dir(self.home.root, self.cache_key(profile)))
        self.journal.event("cache_cleared", profile=profile)
        self.say(f"profile {profile}: compile caches cleared")

    def child_env(self, profile: str, extra: dict | None = None) -> dict:
        env = dict(os.environ)
        secrets = self.secrets()
        env.update({k: str(v) for k, v in (self.spec.get("env") or {}).items()})
        env.update(secrets.get("env") or {})
        env.update({k: str(v) for k, v in (self.profiles[profile].get("env") or {}).items()})
        env.update((secrets.get("profiles") or {}).get(profile) or {})
        env.update(envs.cache_env(self.home.root, self.cache_key(profile)))
        for group, ids in (self.spec.get("gpus") or {}).items():
            env[f"GPUJOB_GPUS_{group.upper()}"] = ",".join(str(i) for i in ids)
        venv = self.journal.path("venv")
        env.update(VIRTUAL_ENV=venv, PATH=os.path.join(venv, "bin") + os.pathsep + env.get("PATH", ""),
                   PYTHONUNBUFFERED="1", GPUJOB_JOB_ID=self.job_id, GPUJOB_PROFILE=profile,
                   GPUJOB_HOME=self.home.root)
        env.pop("PYTHONHOME", None)
        env.update(placeholder_env(self.values(profile)))
        env.update(extra or {})
        return env

    def secrets(self) -> dict:
        """The secret env values of the job (secrets.json, 0600), read once; {} without."""
        if self._secrets is None:
            self._secrets = read_json(self.journal.path(SECRETS_FILE), {}) or {}
            if not self._secrets and self.job.get("secret_names"):
                raise EnvError("the job's secrets were removed from the container when it ended; "
                               "submit it again to run it")
        return self._secrets

    def drop_secrets(self) -> None:
        """The job has ended: its secrets leave the container."""
        try:
            os.unlink(self.journal.path(SECRETS_FILE))
        except FileNotFoundError:
            pass

    def values(self, profile: str, gpu=None) -> dict:
        vals = {f"gpus.{g}": ",".join(str(i) for i in ids) for g, ids in (self.spec.get("gpus") or {}).items()}
        vals.update(profile=profile, job_id=self.job_id, workdir=self.workdir)
        if gpu is not None:
            vals["gpu"] = str(gpu)
        return vals

    # ---- running children -------------------------------------------------
    def spawn(self, argv: list, env: dict | None, cwd: str | None) -> subprocess.Popen:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=cwd)

    def capture(self, argv: list) -> tuple:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=600)
        return p.returncode, p.stdout.decode("utf-8", "replace")

    def run_logged(self, argv: list, logname: str, timeout: float) -> tuple:
        """Run a preparation step with its output in ``logname`` and job.log."""
        self.say("$ " + shlex.join(argv))
        tail = collections.deque(maxlen=5)
        with open(self.journal.path(logname), "ab") as log:
            child = self.spawn(argv, None, None)
            self.child = child
            deadline = now() + timeout
            split = throughput.LineSplitter()
            last_check = 0.0
            for chunk in self.pump(child, log):
                tail.extend(ln.strip() for ln in split.feed(chunk) if ln.strip())
                t = now()
                if t > deadline:
                    self.kill_group(child, 5)
                elif t - last_check > 0.2:  # a stop need not wait for a 10-minute install
                    last_check = t
                    if self.stop_asked or self.journal.take_requests("stop"):
                        self.stop_asked = True
                        self.kill_group(child, 5)
            tail.extend(ln.strip() for ln in split.flush() if ln.strip())
        self.child = None
        if self.stop_asked:
            raise Stop()
        return child.returncode, " | ".join(tail)

    def pump(self, child: subprocess.Popen, log, coalesce: float = COALESCE):
        """Copy the child's output to its log and job.log as it comes; yield each chunk
        (and b"" when quiet, so callers can look at the clock and the control dir).
        After a small chunk it waits ``coalesce`` seconds before reading again, so a
        trainer flushing every line does not wake the supervisor for every line; the
        child's exit ends that wait at once (a pidfd), so a phase's end is not delayed."""
        fd = child.stdout.fileno()
        os.set_blocking(fd, False)
        try:
            exited = [os.pidfd_open(child.pid)] if coalesce and hasattr(os, "pidfd_open") else []
        except OSError:
            exited = []
        try:
            yield from self._pump(child, log, fd, coalesce, exited)
        finally:
            for pidfd in exited:
                os.close(pidfd)

    def _pump(self, child: subprocess.Popen, log, fd: int, coalesce: float, exited: list):
        while True:
            ready, _, _ = select.select([fd], [], [], POLL)
            if ready:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    chunk = None
                if chunk == b"":
                    break
                if chunk:
                    log.write(chunk)
                    log.flush()
                    self.logf.write(chunk)
                    self.logf.flush()
                    yield chunk
                    if coalesce and len(chunk) < COALESCE_BELOW:
                        if exited:
                            select.select(exited, [], [], coalesce)
                        else:
                            time.sleep(coalesce)
                    continue
            yield b""
        child.stdout.close()
        child.wait()

    def kill_group(self, child: subprocess.Popen, grace: float) -> list:
        """SIGTERM the child's process group, SIGKILL after ``grace``; return what survived
        (nothing, unless a process escaped to another group)."""
        pgid = child.pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            end = now() + (grace if sig == signal.SIGTERM else 10)
            wait = 0.002  # most trainers are gone within milliseconds: look again soon, then less often
            while now() < end:
                child.poll()
                if not group_pids(pgid):
                    break
                time.sleep(wait)
                wait = min(wait * 2, 0.05)
            if not group_pids(pgid):
                break
        try:
            child.wait(5)
        except subprocess.TimeoutExpired:
            pass
        left = group_pids(pgid)
        self.journal.event("group_stopped", pgid=pgid, left=left)
        return left

    def requests(self):
        """Stop / rollback requests while a child runs: returns an Outcome or None."""
        for req in self.journal.take_requests():
            if req["kind"] == "stop":
                self.stop_asked = True
            elif req["kind"] == "rollback":
                return Outcome("rollback", reason=req.get("reason") or "rolled back by hand", to=req.get("to"))
        if self.stop_asked:
            return Outcome("stop")
        return None

    # ---- phases ------------------------------------------------------------
    def warmup(self, profile: str) -> Outcome:
        w = self.spec.get("warmup")
        if not w:
            return Outcome("done")
        when = w.get("when", "cold")
        cold = envs.cache_is_cold(self.home.root, self.cache_key(profile))
        if when == "never" or (when == "cold" and not cold):
            self.journal.event("warmup_skipped", profile=profile, cache="warm" if not cold else "cold", when=when)
            self.say(f"warmup skipped: profile {profile}'s compile cache is warm")
            return Outcome("done")
        gpus = [None]
        if w.get("per_gpu"):
            gpus = list((self.spec.get("gpus") or {}).get(w["per_gpu"], []))
        self.set_state("warmup", phase="warmup", profile=profile)
        for gpu in gpus:
            extra = {"CUDA_VISIBLE_DEVICES": str(gpu), "GPUJOB_GPU": str(gpu)} if gpu is not None else {}
            argv = command_argv(w["command"], self.values(profile, gpu))
            where = f" on GPU {gpu}" if gpu is not None else ""
            self.say(f"warmup{where} (profile {profile}): {shlex.join(argv)}")
            self.journal.event("phase", phase="warmup", gpu=gpu, profile=profile, argv=argv)
            out = self.watch(argv, self.child_env(profile, extra), "warmup.log", profile,
                             timeout=w.get("timeout", 3600.0), watch_tps=False)
            if out.kind != "done":
                return out
        return Outcome("done")

    def train(self, profile: str, resume: bool) -> Outcome:
        t = self.spec["train"]
        extra = list(t.get("resume_args") or []) if resume else []
        argv = command_argv(t["command"], self.values(profile), extra)
        self.set_state("training", phase="train", profile=profile, restarts=len(self.rollbacks))
        self.say(f"train (profile {profile}){' resuming' if resume else ''}: {shlex.join(argv)}")
        self.journal.event("phase", phase="train", profile=profile, argv=argv, resume=resume)
        if self.rollbacks and "running_at" not in self.rollbacks[-1]:
            rec = self.rollbacks[-1]
            rec["running_at"] = now()
            rec["took"] = round(rec["running_at"] - rec["decided_at"], 3)
            self.journal.event("rollback_done", **rec)
            self.journal.set_state(rollbacks=self.rollbacks)
        return self.watch(argv, self.child_env(profile), "train.log", profile,
                          timeout=t.get("timeout"), watch_tps=self.parse_tps is not None,
                          grace=t.get("grace", 30.0))

    def watch(self, argv, env, logname, profile, *, timeout, watch_tps, grace=30.0) -> Outcome:
        """Run one phase command; parse its output; act on signals and requests."""
        os.makedirs(self.workdir, exist_ok=True)
        run = _Run(self, logname, profile, timeout, watch_tps)
        split = throughput.LineSplitter()
        outcome = None
        with open(self.journal.path(logname), "ab") as log:
            child = self.spawn(argv, env, self.workdir)
            self.child = child
            self.journal.set_state(child_pid=child.pid, child_pgid=child.pid, phase_started_at=run.start)
            for chunk in self.pump(child, log):
                t = now()
                for line in split.feed(chunk) if chunk else ():
                    outcome = self.on_line(run, line, t)
                    if outcome:
                        break
                if not outcome and t - run.last_check >= 0.2:
                    run.last_check = t
                    outcome = self.check(run, t)
                if outcome:
                    break
            if outcome is not None:
                self.say(f"stopping {run.phase}: {outcome.reason or outcome.kind}")
                if outcome.kind == "stop":
                    self.set_state("stopping", phase=run.phase)
                self.kill_group(child, grace)
                for _ in self.pump(child, log, coalesce=0):  # drain what it printed while dying
                    pass
            self.child = None
        if run.samples and outcome is None:  # the last word on this run's throughput
            self.publish(run.samples, throughput.decide(self.policy, run.samples, now(), run.start,
                                                        run.baseline), run.baseline)
        code = child.returncode
        self.journal.event("exit", phase=run.phase, returncode=code, profile=profile)
        if outcome is not None:
            return outcome
        if code == 0:
            return Outcome("done", exit_code=0)
        sig = -code if code < 0 else None
        name, reason = throughput.classify_exit(code if code >= 0 else None, sig,
                                                run.hits + list(run.tail), self.signatures)
        self.say(f"{run.phase} failed: {reason}")
        return Outcome("signal", name, reason, {"returncode": code, "tail": list(run.tail)[-10:]},
                       exit_code=code)

    def on_line(self, run: "_Run", line: str, t: float):
        """One line of output: error signatures, then (in training) a throughput sample."""
        run.tail.append(line)
        hit = throughput.scan_line(line, self.signatures)
        if hit:
            run.hits.append(line)
            run.hit_at = run.hit_at or (t, hit)
        if not run.watch_tps:
            return None
        value = self.parse_tps(line)
        if value is None:
            return None
        step = self.parse_step(line) if self.parse_step else None
        run.samples.append(throughput.Sample(t, value, step))
        if len(run.samples) > 50000:
            del run.samples[:25000]
        d = throughput.decide(self.policy, run.samples, t, run.start, run.baseline)
        self.journal.event("sample", value=value, step=step, verdict=d.verdict,
                           median=d.evidence.get("median"))
        if d.verdict != run.last_verdict or d.verdict in ("breach", "rollback"):
            self.journal.event("decision", verdict=d.verdict, reason=d.reason, evidence=d.evidence)
            run.last_verdict = d.verdict
        if t - run.last_state > STATE_EVERY or d.verdict == "rollback":
            self.publish(run.samples, d, run.baseline)
            run.last_state = t
        if d.verdict == "rollback":
            return Outcome("signal", "low_throughput", d.reason, d.evidence)
        if not run.good_known:
            base = throughput.known_good(self.policy, run.samples, t, run.start, run.baseline)
            if base is not None:
                run.good_known = True
                self.ledger.mark(run.profile, "good", baseline=base, job=self.job_id,
                                 reason=f"held {throughput.fmt_rate(base)} tok/s for "
                                        f"{self.policy.good_after:g}s")
                self.journal.event("known_good", profile=run.profile, baseline=base)
                self.say(f"profile {run.profile} is now known-good "
                         f"(baseline {throughput.fmt_rate(base)} tok/s)")
                run.baseline = run.baseline or base
        return None

    def check(self, run: "_Run", t: float):
        """The checks made every 0.2 s whether or not output came: requests, a hung
        trainer after an error signature, the phase timeout, idle GPUs, a stall."""
        outcome = self.requests()
        if outcome:
            return outcome
        if run.hit_at and t - run.hit_at[0] > SIGNATURE_GRACE and run.hit_at[1] in (self.rb.get("on") or []):
            _name, reason = throughput.classify_exit(1, None, run.hits, self.signatures)
            return Outcome("signal", run.hit_at[1], f"{reason} (the process kept running "
                           f"{SIGNATURE_GRACE:g}s after it)", {"lines": run.hits[-5:]})
        if run.timeout and t - run.start > run.timeout:
            return Outcome("signal", "crash", f"{run.phase} timed out after {run.timeout:g}s")
        if run.idle_gpus and t - run.last_gpu >= run.idle_poll and \
                t >= run.start + (self.policy.initial_delay if self.parse_tps else 0):
            run.last_gpu = t
            outcome = self.check_gpu_idle(run, t)
            if outcome:
                return outcome
        if run.watch_tps:
            d = throughput.decide(self.policy, run.samples, t, run.start, run.baseline)
            if d.verdict == "stall":
                self.journal.event("decision", verdict=d.verdict, reason=d.reason, evidence=d.evidence)
                return Outcome("signal", "stall", d.reason, d.evidence)
        return None

    def check_gpu_idle(self, run: "_Run", t: float):
        cfg = run.idle_cfg
        util = gpu_utilisation(run.idle_gpus)
        if util is None:
            return None
        run.gpu_history.append((t, util))
        del run.gpu_history[:-1000]
        self.journal.event("gpu_util", group=cfg["group"], max=util)
        idle = idle_for(run.gpu_history, cfg["below"])
        if idle < cfg["for"]:
            return None
        return Outcome("signal", "gpu_idle",
                       f"GPUs {cfg.get('group') or 'all'} ({','.join(map(str, run.idle_gpus))}) "
                       f"under {cfg['below']:g}% for {idle:.0f}s",
                       {"group": cfg["group"], "below": cfg["below"], "idle_for": round(idle, 1),
                        "history": run.gpu_history[-10:]})

    def publish(self, samples: list, d, baseline) -> None:
        values = [s.value for s in samples[-120:]]
        self.journal.set_state(tps=values[-1] if values else None, tps_recent=values,
                               window=d.evidence, verdict=d.verdict, verdict_reason=d.reason,
                               baseline=baseline)


def run(home: str, job_id: str) -> int:
    try:
        sup = Supervisor(home, job_id)
    except Exception as e:  # a job it cannot even read must not look merely "lost"
        journal = Journal(Home(home), job_id)
        journal.set_state(state="failed", phase="done", finished_at=now(),
                          reason=f"supervisor could not start: {type(e).__name__}: {e}")
        Lock(Home(home)).release(job_id)
        raise
    return sup.main()
