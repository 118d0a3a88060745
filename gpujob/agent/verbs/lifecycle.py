"""Jobs' lives in the container, shared by the agent's commands (stdlib only): the
one-line answers (``emit``; a refusal is ``base/wire.Refused`` with its code), starting a
detached supervisor under the container's lock (``acquire``, ``spawn_supervisor``), giving a
job whose supervisor died a new one (``revive``), and a job's summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from gpujob.agent.supervisor import metrics, notify
from gpujob.agent.base import answers
from gpujob.agent.base.protocol import ENDED
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.home.ledger import Ledger
from gpujob.agent.home.ledgerfile import LedgerError
from gpujob.agent.base.fsio import now
from gpujob.agent.home.lock import Held, Lock
from gpujob.agent.base.protocol import JobState
from gpujob.agent.base.proc import group_pids
from gpujob.agent.base.wire import Code, Record, Refused


def emit(obj) -> None:
    """One answer line: a declared record (base/wire.py), or a verb's plain dict."""
    if isinstance(obj, Record):
        obj = obj.to_dict()
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def expand(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def spawn_supervisor(home: Home, job_id: str, held: Held) -> int:
    """Start the job's supervisor detached; it inherits the lock ``held`` (our copy
    of the descriptor is closed: from now on the lock lives as long as it does)."""
    assert held.fd is not None, "the lock was let go before its supervisor started"
    j = Journal(home, job_id)
    log = open(j.path("supervisor.log"), "ab")
    p = subprocess.Popen([sys.executable, os.path.abspath(sys.argv[0]), "--home", home.root,
                          "run", job_id, "--lock-fd", str(held.fd), "--generation", str(held.generation)],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(held.fd,),
                         start_new_session=True, close_fds=True, cwd=home.root)
    log.close()
    held.set_pid(p.pid)
    held.close_quietly()
    return p.pid


def live_processes(st: dict) -> list:
    """Pids of a job's phase command (trainer, warmup, install) still alive."""
    child = st.get("child") or {}
    pgid = child.get("pgid") or st.get("child_pgid")
    return group_pids(int(pgid)) if pgid else []


def holder_text(job_id: str | None, by: str | None, since: float | None) -> str:
    """'job X of alice@laptop, since 2026-11-30 14:10:29 UTC (2h13m ago)': who holds a container."""
    text = f"job {job_id or '?'}" + (f" of {by}" if by else "")
    if since:
        ago = max(0, int(now() - since))
        age = f"{ago // 3600}h{ago % 3600 // 60:02d}m" if ago >= 3600 else f"{ago // 60}m{ago % 60:02d}s"
        text += f", since {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(since))} ({age} ago)"
    return text


def acquire(home: Home, job_id: str, by: str | None = None) -> tuple:
    """(the container lock, the job it was taken over from or None); refuses while
    another job's supervisor lives, or while a job whose supervisor died still has
    a phase command running (never two trainers on the same GPUs). ``by``: the
    user@laptop submitting, recorded in lock.json and shown to the next one."""
    lock = Lock(home.root)
    held = lock.try_acquire(job_id, by=by)
    if held is None:
        h = lock.holder() or {}
        other = h.get("job_id")
        raise Refused(f"container busy: {holder_text(other, h.get('by'), h.get('since'))} "
                      f"holds it (supervisor pid {h.get('pid') or '?'})"
                      + (f"; `gpujob stop {other}` ends it, `gpujob logs -f {other}` waits for its end"
                         if other else ""), Code.BUSY)
    taken_over = None
    for other in home.job_ids():
        if other == job_id:
            continue
        oj = Journal(home, other)
        st = oj.state()
        if not st or st.get("state") in ENDED:
            continue
        if oj.supervisor_alive(st):  # a supervisor of an older agent, which knew no flock
            held.release()
            raise Refused(f"container busy: job {other}'s supervisor (pid {st.get('supervisor_pid')}) runs; "
                          f"`gpujob stop {other}` ends it", Code.BUSY)
        left = live_processes(st)
        if left:
            held.release()
            who = oj.job().get("by")
            raise Refused(f"job {other}{f' of {who}' if who else ''} has no supervisor but its "
                          f"{(st.get('child') or {}).get('phase') or 'phase'} "
                          f"command still runs (pids {', '.join(map(str, left[:5]))}); `gpujob status "
                          f"{other}` restarts its supervisor, `gpujob stop {other}` ends it", Code.BUSY)
        # nothing of it runs and nobody holds the lock: that job is over, as its trainer's
        # recorded exit says (else lost); its log's last bytes reach its job.log first
        settle_orphan(Journal(home, other, held.generation), st, job_id)
        taken_over = {"job_id": other, "pid": st.get("supervisor_pid")}
    return held, taken_over


def settle_orphan(j: Journal, st: dict, by_job: str) -> None:
    """A job whose supervisor died and whose command has ended, taken over by ``by_job``:
    the relay's last bytes go to its job.log, and its state follows the exit its
    trainer's keeper recorded (exit 0: succeeded), else it is lost."""
    from gpujob.agent.base.proc import read_exit
    from gpujob.agent.home.relay import JobLog, Relay
    from gpujob.agent.base.stages import Stage
    child = st.get("child") or {}
    try:  # whatever the dead supervisor had not copied yet
        joblog = JobLog(j.path("job.log"))
        relay = Relay(j.dir, joblog)
        relay.recover()
        if child.get("log"):
            relay.follow(child["log"], int(child.get("log_start") or 0))
            for _ in relay.drain():
                pass
        relay.close()
        os.close(joblog.fd)
    except OSError as e:
        j.event("relay_error", error=f"{type(e).__name__}: {e}")
    code = read_exit(child["exit_file"]) if child.get("exit_file") else None
    trained = child.get("phase") == "train"
    if (trained and code == 0) or (not child and st.get("step") == Stage.SUCCEEDED):
        j.event("exit", phase="train", returncode=0, profile=st.get("profile"), recorded_by="keeper")
        j.set_state(state=JobState.SUCCEEDED, step=Stage.SUCCEEDED, phase="done", finished_at=now(),
                    child=None,
                    exit_code=0, reason=f"train exited 0 (recorded by its keeper after its supervisor died; "
                                        f"settled when job {by_job} took the container)")
        return
    if trained and code is not None:
        j.event("exit", phase="train", returncode=code, profile=st.get("profile"), recorded_by="keeper")
        j.set_state(state=JobState.FAILED, phase="done", finished_at=now(), child=None, exit_code=code,
                    reason=f"train exited {code} after its supervisor died (recorded by its keeper; "
                           f"settled when job {by_job} took the container)")
        return
    j.set_state(state=JobState.LOST, phase="done", finished_at=now(), child=None,
                reason=f"its supervisor died; the container was taken over by job {by_job}")


def _may_revive(j: Journal, st: dict) -> bool:
    """Whether ``revive`` acts on this job (restarts its supervisor, or records that it may not)."""
    over = st.get("state") in ENDED and not notify.waiting(j.dir)  # else: revived to send its messages
    if not st or over or j.supervisor_alive(st):
        return False
    # a state without "step" was written by an older agent, whose trainer hung on its
    # supervisor's pipe: nothing to re-adopt; `gpujob stop` or `rollback` finishes it
    return "step" in st


def would_revive(home: Home, job_id: str) -> bool:
    """What ``revive`` would decide, only read (``status`` answered without a fork asks this
    first: a job that needs its supervisor restarted goes the forked way)."""
    j = Journal(home, job_id)
    return _may_revive(j, j.state())


def revive(home: Home, job_id: str, before=None) -> dict | None:
    """Restart the supervisor of a job whose supervisor died before the job ended,
    at most 3 times in 10 minutes; it re-adopts what still runs. Returns what was
    done (None: nothing needed or allowed). ``before(journal)``: called under the lock,
    with its fenced journal, before the new supervisor starts."""
    j = Journal(home, job_id)
    st = j.state()
    if not _may_revive(j, st):
        return None
    t = now()
    recent = [r for r in st.get("revivals") or [] if t - r < 600]
    if len(recent) >= 3:
        if not st.get("lost_reason"):
            Journal(home, job_id).set_state(lost_reason="its supervisor died 3 times within 10 minutes; "
                                            "not restarted again (gpujob stop or rollback finishes it)")
        return {"revived": False, "why": "its supervisor died 3 times within 10 minutes"}
    held = Lock(home.root).try_acquire(job_id)
    if held is None:
        return None  # another process holds the lock: a supervisor is (re)starting
    try:
        st = j.state()
        if (st.get("state") in ENDED and not notify.waiting(j.dir)) or j.supervisor_alive(st, starting=False):
            held.release()
            return None
        fenced = Journal(home, job_id, held.generation)
        fenced.set_state(revivals=recent + [t])
        if before is not None:
            before(fenced)
        j.event("supervisor_revived", previous_pid=st.get("supervisor_pid"), step=st.get("step"),
                child_running=bool(live_processes(st)))
        pid = spawn_supervisor(home, job_id, held)
    except BaseException:
        held.release()
        raise
    return {"revived": True, "previous_pid": st.get("supervisor_pid"), "supervisor_pid": pid,
            "readopted": bool(live_processes(st))}


def summary(home: Home, job_id: str) -> dict:
    j = Journal(home, job_id)
    st = j.effective_state()
    job = j.job()
    st.setdefault("job_id", job_id)
    st["name"] = job.get("spec", {}).get("name")
    st["submitted_at"] = job.get("submitted_at")
    st["initial_profile"] = job.get("profile")
    st["by"] = job.get("by")  # user@laptop that submitted it
    if job.get("spec", {}).get("throughput"):
        tp = job["spec"]["throughput"]
        st["policy"] = {k: tp.get(k) for k in ("min", "min_ratio", "window", "failure_limit")}
    try:
        st["ledger"] = answers.ledger_view(Ledger(home, st["name"]).read()) if st["name"] else {}
    except LedgerError as e:  # the status still answers; the ledger's line says what is wrong
        st["ledger"] = {"error": str(e)}
    st["metrics"] = metrics.gauges(st, job_id, st["name"])  # what the metrics textfile says
    st["notify"] = notify.outbox_summary(j.dir)
    t = now()  # durations on the container's own clock: the laptop's may be off
    st["now"] = t
    st["uptime_s"] = (max(0.0, (st.get("finished_at") or t) - st["started_at"]) if st.get("started_at")
                      else None)
    return st


def job_or_refuse(home: Home, job_id: str) -> Journal:
    j = Journal(home, job_id)
    if not os.path.exists(j.path("job.json")):
        raise Refused(f"no job {job_id} in this container", Code.UNKNOWN_JOB)
    j.state()  # NewerFormat (refused in one line) when a newer agent wrote it
    return j


def active_keys(home: Home) -> set:
    keys = set()
    for i in home.job_ids():
        st = Journal(home, i).effective_state()
        if st.get("state") not in ENDED and st.get("env_key"):
            keys.add(st["env_key"])
    return keys
