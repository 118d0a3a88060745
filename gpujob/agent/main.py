"""The agent's command line, run in the container by the controller (stdlib only):

    python3 agent.pyz --home H <command> ...

Every command prints JSON (or raw log bytes for ``tail``) and exits 0, or prints
one ``{"error": ...}`` line and exits non-zero. Exit 5 = refused (busy, unknown job).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time

from gpujob.agent import boothook, envs, gc
from gpujob.agent.journal import ENDED, FINAL_STATES, Home, Journal, Ledger, now, read_json, write_json
from gpujob.agent.lock import Held, Lock
from gpujob.agent.proc import group_pids, kill_group
from gpujob.agent.trim import Trimmer

REFUSED = 5


class Refused(Exception):
    pass


def emit(obj) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def expand(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


# ---- probing and files -----------------------------------------------------

def cmd_probe(home: Home, args) -> None:
    info = {"python": platform.python_version(), "machine": platform.machine(),
            "system": platform.system(), "home": home.root, "pid": os.getpid()}
    try:
        import ensurepip  # noqa: F401  (Debian ships it in python3-venv)
        import venv  # noqa: F401
        info["venv"] = True
    except ImportError:
        info["venv"] = False
    uv = home.path("bin", "uv")
    info["uv"] = uv if os.access(uv, os.X_OK) else shutil.which("uv")
    probe_dir = expand(args.workdir) if args.workdir else home.root
    while not os.path.exists(probe_dir):
        probe_dir = os.path.dirname(probe_dir)
    st = os.statvfs(probe_dir)
    info["disk_free"] = st.f_bavail * st.f_frsize
    info["disk_path"] = probe_dir
    info["uvm"] = os.path.exists("/dev/nvidia-uvm")
    try:
        with open("/proc/driver/nvidia/version") as f:
            info["proc_driver"] = f.read().strip()
    except OSError:
        info["proc_driver"] = None
    smi = shutil.which("nvidia-smi")
    info["nvidia_smi"] = None
    if smi:
        try:
            p = subprocess.run([smi, "--query-gpu=index,name,driver_version,utilization.gpu",
                                "--format=csv,noheader,nounits"], capture_output=True, timeout=30)
            rows = [[c.strip() for c in ln.split(",")] for ln in p.stdout.decode().splitlines() if ln.strip()]
            info["nvidia_smi"] = {"ok": p.returncode == 0, "gpus": rows,
                                  "error": p.stderr.decode().strip()[-300:]}
        except (OSError, subprocess.TimeoutExpired) as e:
            info["nvidia_smi"] = {"ok": False, "gpus": [], "error": str(e)}
    emit(info)


def cmd_put(home: Home, args) -> None:
    dest = expand(args.dest)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = f"{dest}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
    os.chmod(tmp, int(args.mode, 8))
    os.replace(tmp, dest)
    emit({"written": dest, "size": os.path.getsize(dest)})


def manifest(root: str) -> dict:
    """{relative path: [size, mtime seconds]} of the files under ``root``."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            out[os.path.relpath(p, root)] = [st.st_size, int(st.st_mtime)]
    return out


def cmd_manifest(home: Home, args) -> None:
    workdir = home.workdir({"name": args.name, "workdir": args.workdir})
    emit({d: manifest(os.path.join(workdir, d)) for d in args.dests})


def untar(stream, size: int, dest: str) -> int:
    """Unpack ``size`` bytes of tar from ``stream`` into ``dest``; refuses members that
    would land outside it."""
    os.makedirs(dest, exist_ok=True)
    body = _Limited(stream, size)
    count = 0
    with tarfile.open(fileobj=body, mode="r|") as tar:
        for member in tar:
            target = os.path.realpath(os.path.join(dest, member.name))
            if not (target == os.path.realpath(dest) or target.startswith(os.path.realpath(dest) + os.sep)) \
                    or member.issym() or member.islnk() or member.isdev():
                raise ValueError(f"refusing tar member {member.name!r}")
            member.mode &= 0o777  # never setuid, setgid or sticky, whatever the laptop had
            tar.extract(member, dest, set_attrs=True, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
            count += 1
    body.drain()
    return count


class _Limited:
    def __init__(self, stream, size):
        self.stream, self.left = stream, size

    def read(self, n=-1):
        if self.left <= 0:
            return b""
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.stream.read(n)
        self.left -= len(data)
        return data

    def drain(self):
        while self.read(1 << 16):
            pass


# ---- jobs ------------------------------------------------------------------

def spawn_supervisor(home: Home, job_id: str, held: Held) -> int:
    """Start the job's supervisor detached; it inherits the lock ``held`` (our copy
    of the descriptor is closed: from now on the lock lives as long as it does)."""
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
    a phase command running (never two trainers on the same GPUs)."""
    lock = Lock(home.root)
    held = lock.try_acquire(job_id, by=by)
    if held is None:
        h = lock.holder() or {}
        raise Refused(f"container busy: {holder_text(h.get('job_id'), h.get('by'), h.get('since'))} "
                      f"holds it (supervisor pid {h.get('pid') or '?'})")
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
            raise Refused(f"container busy: job {other}'s supervisor (pid {st.get('supervisor_pid')}) runs")
        left = live_processes(st)
        if left:
            held.release()
            by = oj.job().get("by")
            raise Refused(f"job {other}{f' of {by}' if by else ''} has no supervisor but its {(st.get('child') or {}).get('phase') or 'phase'} "
                          f"command still runs (pids {', '.join(map(str, left[:5]))}); `gpujob status {other}` "
                          f"restarts its supervisor, `gpujob stop {other}` ends it")
        # nothing of it runs and nobody holds the lock: that job is over, as lost
        Journal(home, other, held.generation).set_state(
            state="lost", phase="done", finished_at=now(), child=None,
            reason=f"its supervisor died; the container was taken over by job {job_id}")
        taken_over = {"job_id": other, "pid": st.get("supervisor_pid")}
    return held, taken_over


def revive(home: Home, job_id: str) -> dict | None:
    """Restart the supervisor of a job whose supervisor died before the job ended,
    at most 3 times in 10 minutes; it re-adopts what still runs. Returns what was
    done (None: nothing needed or allowed)."""
    j = Journal(home, job_id)
    st = j.state()
    if not st or st.get("state") in ENDED or j.supervisor_alive(st):
        return None
    if "step" not in st:  # written by an older agent, whose trainer hung on its supervisor's pipe:
        return None       # nothing to re-adopt; `gpujob stop` or `rollback` finishes it
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
        if st.get("state") in ENDED or j.supervisor_alive(st, starting=False):
            held.release()
            return None
        Journal(home, job_id, held.generation).set_state(revivals=recent + [t])
        j.event("supervisor_revived", previous_pid=st.get("supervisor_pid"), step=st.get("step"),
                child_running=bool(live_processes(st)))
        pid = spawn_supervisor(home, job_id, held)
    except BaseException:
        held.release()
        raise
    return {"revived": True, "previous_pid": st.get("supervisor_pid"), "supervisor_pid": pid,
            "readopted": bool(live_processes(st))}


def cmd_submit(home: Home, args) -> None:
    """stdin: one JSON line (the job), then the tar streams of the sync entries."""
    stdin = sys.stdin.buffer
    job = json.loads(stdin.readline())
    job_id = job["job_id"]
    secrets = job.pop("secrets", None)  # kept out of job.json, the job's record
    j = Journal(home, job_id)
    if os.path.exists(j.dir):
        raise Refused(f"job id {job_id} already exists in this container; nothing was changed")
    held, stale = acquire(home, job_id, job.get("by"))
    try:
        j = Journal(home, job_id, held.generation)
        workdir = home.workdir(job["spec"])
        for entry in job.get("sync_streams", []):  # checked again here, before anything is written
            inside = os.path.abspath(os.path.join(workdir, entry["dest"])) + os.sep
            if not (os.path.isabs(entry["dest"]) or inside.startswith(os.path.abspath(workdir) + os.sep)):
                raise ValueError(f"sync dest {entry['dest']!r} resolves outside the workdir")
        os.makedirs(j.dir, exist_ok=False)
        synced = {}
        for entry in job.pop("sync_streams", []):
            dest = entry["dest"] if os.path.isabs(entry["dest"]) else os.path.join(workdir, entry["dest"])
            synced[entry["dest"]] = untar(stdin, entry["size"], dest)
        job["submitted_at"] = now()
        if secrets:
            write_json(j.path("secrets.json"), secrets, mode=0o600)
        write_json(j.path("job.json"), job, mode=0o600)
        j.set_state(job_id=job_id, name=job["spec"]["name"], state="preparing", phase="start",
                    step="env", profile=job["profile"], resume=False, started_at=now())
        j.event("submitted", profile=job["profile"], synced=synced,
                stale_lock=stale.get("job_id") if stale else None)
        if job.get("boot_hook"):
            line = boothook.install(sys.executable, os.path.abspath(sys.argv[0]), home.root)
            j.event("boot_hook", path=boothook.RC_LOCAL, line=line)
        pid = spawn_supervisor(home, job_id, held)
    except BaseException:
        held.release()
        if os.path.exists(Journal(home, job_id).path("secrets.json")):  # no supervisor will use them
            os.unlink(Journal(home, job_id).path("secrets.json"))
        raise
    emit({"job_id": job_id, "supervisor_pid": pid, "synced": synced, "stale_lock": stale})


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
    st["ledger"] = Ledger(home, st["name"]).read() if st["name"] else {}
    t = now()  # durations on the container's own clock: the laptop's may be off
    st["now"] = t
    st["uptime_s"] = max(0.0, (st.get("finished_at") or t) - st["started_at"]) if st.get("started_at") else None
    return st


def job_or_refuse(home: Home, job_id: str) -> Journal:
    j = Journal(home, job_id)
    if not os.path.exists(j.path("job.json")):
        raise Refused(f"no job {job_id} in this container")
    return j


def cmd_status(home: Home, args) -> None:
    """The jobs' states; a job whose supervisor died is given a new one (which
    re-adopts what still runs), and its entry says so under ``revived``."""
    ids = args.jobs or home.job_ids()
    missing = [i for i in ids if not os.path.exists(Journal(home, i).path("job.json"))]
    if missing and not args.missing_ok:
        job_or_refuse(home, missing[0])
    ids = [i for i in ids if i not in missing]
    revived = {}
    if not args.no_revive:
        for i in ids:
            r = revive(home, i)
            if r:
                revived[i] = r
    jobs = []
    for i in ids:
        st = summary(home, i)
        if i in revived:
            st["revived"] = revived[i]
        jobs.append(st)
    jobs += [{"job_id": i, "state": "not_found", "reason": "no such job in this container (its submit "
              "never got there)"} for i in missing]
    emit({"jobs": jobs, "lock": Lock(home.root).holder()})


def cmd_tail(home: Home, args) -> None:
    """Raw bytes of a job's log from ``--offset``; with ``--follow`` until the job is
    final (or its supervisor gone) and the file fully sent."""
    j = job_or_refuse(home, args.job)
    path = j.path(args.file)
    out = sys.stdout.buffer
    offset = args.offset
    if args.last is not None:
        offset = last_lines_offset(path, args.last)
    begins = Trimmer(j.dir).start_of(args.file)  # the part before was trimmed (journal.keep_log)
    skipped = max(0, begins - offset) if args.last is None else 0
    offset = max(offset, begins)
    sys.stderr.write(json.dumps({"offset": offset, "skipped": skipped}) + "\n")
    sys.stderr.flush()
    reader_gone = stdout_watch()
    f = None
    idle = 0.0
    revive_tried = False
    while True:
        if f is None and os.path.exists(path):
            f = open(path, "rb")
            f.seek(offset)
        data = f.read(1 << 20) if f else b""
        if data:
            out.write(data)
            out.flush()
            idle = 0.0
            continue
        if not args.follow:
            return
        # quiet: is the job over? read state only now and then
        if idle == 0.0 or idle >= 0.5:
            if reader_gone():  # the connection that asked is gone: do not linger for weeks
                return
            st = j.effective_state()
            if st.get("state") == "lost" and not revive_tried:
                revive_tried = True
                if (revive(home, args.job) or {}).get("revived"):
                    idle = 0.0
                    continue
            if st.get("state") in ENDED:
                data = f.read() if f else b""
                if data:
                    out.write(data)
                    out.flush()
                return
            idle = 0.0 if idle >= 0.5 else idle
        time.sleep(args.poll)
        idle += args.poll


def stdout_watch():
    """A check that says when nobody reads our stdout any more (its pipe or socket
    was closed: a dropped SSH connection), without having to write to it."""
    import select
    poller = select.poll()
    poller.register(sys.stdout.fileno(), 0)  # POLLERR and POLLHUP are always reported
    bad = select.POLLERR | select.POLLHUP | select.POLLNVAL
    return lambda: any(ev & bad for _fd, ev in poller.poll(0))


def last_lines_offset(path: str, n: int) -> int:
    """The byte offset where the last ``n`` lines of ``path`` start."""
    try:
        f = open(path, "rb")
    except OSError:
        return 0
    with f:
        end = f.seek(0, os.SEEK_END)
        pos, seen = end, 0
        if n <= 0:
            return end
        while pos > 0:
            step = min(pos, 1 << 16)
            pos -= step
            f.seek(pos)
            block = f.read(step)
            if pos + step == end and block.endswith(b"\n"):
                block = block[:-1]  # the final newline ends the last line, it starts none
            for i in range(len(block) - 1, -1, -1):
                if block[i] == 10:
                    seen += 1
                    if seen == n:
                        return pos + i + 1
        return 0


def wait_final(j: Journal, timeout: float) -> dict:
    end = time.time() + timeout
    while time.time() < end:
        st = j.effective_state()
        if st.get("state") in ENDED:
            return st
        time.sleep(0.1)
    return j.effective_state()


def end_leftovers(home: Home, job_id: str, final: dict) -> tuple:
    """A job with no supervisor: end what it left running (its phase command's
    whole process group) and write its final state. Returns (state, survivors)."""
    held = Lock(home.root).try_acquire(job_id)  # so that nobody revives it meanwhile
    try:
        j = Journal(home, job_id, held.generation if held else None)
        st = j.state()
        child = st.get("child") or {}
        pgid = child.get("pgid") or st.get("child_pgid")
        left = kill_group(int(pgid), 10) if pgid else []
        j.set_state(child=None, finished_at=now(), **final)
        j.event("state", state=final.get("state"), reason=final.get("reason"))
        return j.effective_state(), left
    finally:
        if held:
            held.release()


def cmd_stop(home: Home, args) -> None:
    j = job_or_refuse(home, args.job)
    st = j.effective_state()
    if st.get("state") in FINAL_STATES:
        emit({"job_id": args.job, "state": st["state"], "already": True})
        return
    if st.get("state") != "lost":
        j.request("stop")  # stays queued until the job has ended: a stop always wins
        st = wait_final(j, args.wait)
    left = []
    if st.get("state") == "lost":  # no supervisor to ask: stop what it left ourselves
        st, left = end_leftovers(home, args.job, {"state": "stopped", "phase": "done",
                                                  "reason": "stopped by hand after its supervisor was lost"})
    emit({"job_id": args.job, "state": st.get("state"), "left": left or live_processes(st)})


def cmd_rollback(home: Home, args) -> None:
    j = job_or_refuse(home, args.job)
    st = j.effective_state()
    job = j.job()
    profiles = [p["name"] for p in job["spec"]["profiles"]]
    if args.to and args.to not in profiles:
        raise Refused(f"no profile {args.to!r} in job {args.job}; profiles: {', '.join(profiles)}")
    pending = st.get("pending_rollback")
    current = st.get("profile") or job["profile"]  # the profile that ran last (a switch not done: its 'from')
    if pending and args.to in (None, pending["to"]) and st.get("state") not in ENDED:
        emit({"job_id": args.job, "requested": True, "from": pending["from"], "to": pending["to"],
              "already": True})
        return
    if args.to == current and not pending:
        raise Refused(f"job {args.job} already runs on profile {current}")
    reason = args.reason or "rolled back by hand"
    target = args.to or Ledger(home, job["spec"]["name"]).pick(
        current, profiles, (job["spec"].get("rollback") or {}).get("fallback"))
    if target is None:
        raise Refused(f"no known-good profile other than {current}; name one with --to")
    if st.get("state") == "lost" and st.get("lost_reason") is None:
        revive(home, args.job)  # a supervisor again, which finishes what the last one began
        st = j.effective_state()
    if st.get("state") not in ENDED:
        j.request("rollback", to=target, reason=reason, mark_bad=bool(args.mark_bad))
        emit({"job_id": args.job, "requested": True, "from": current, "to": target})
        return
    held, _stale = acquire(home, args.job)
    try:
        jj = Journal(home, args.job, held.generation)
        pgid = (st.get("child") or {}).get("pgid") or st.get("child_pgid")
        if pgid:
            kill_group(int(pgid), 10)  # never two trainers on the same GPUs
        jj.set_state(state="rolling_back", phase="env", step="rollback", reason=reason, finished_at=None,
                     child=None, lost_reason=None, revivals=[],
                     pending_rollback={"from": current, "to": target, "reason": reason, "signal": "manual",
                                       "decided_at": now(), "mark_bad": bool(args.mark_bad), "request": None})
        pid = spawn_supervisor(home, args.job, held)
    except BaseException:
        held.release()
        raise
    emit({"job_id": args.job, "restarted": True, "from": current, "to": target, "supervisor_pid": pid})


LEDGER_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")  # the spec's rules for a job name, a profile name
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def cmd_ledger(home: Home, args) -> None:
    """``ledger show NAME`` (a job name's ledger) or ``ledger set NAME PROFILE STATUS``
    (by hand: good, bad, or untried, which removes the entry)."""
    if not LEDGER_NAME.fullmatch(args.name):
        raise Refused(f"job name {args.name!r}: expected lowercase letters, digits and '-' (at most 40)")
    led = Ledger(home, args.name)
    if args.action == "show":
        emit({"name": args.name, "ledger": led.read()})
        return
    if not args.profile or not args.status:
        raise Refused("ledger set needs a profile and a status (good, bad or untried)")
    if not PROFILE_NAME.fullmatch(args.profile):
        raise Refused(f"profile {args.profile!r}: expected letters, digits, '_', '.' and '-'")
    before = led.status(args.profile)
    reason = args.reason or "set by hand"
    if args.status == "untried":
        led.forget(args.profile)
    else:
        led.mark(args.profile, args.status, reason=reason, by_hand=True)
    emit({"name": args.name, "profile": args.profile, "before": before, "status": args.status,
          "reason": None if args.status == "untried" else reason, "ledger": led.read()})


def cmd_profiles(home: Home, args) -> None:
    installed = []
    root = home.path("envs")
    for key in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        if key.startswith("."):
            continue
        marker = envs.read_marker(home.root, key)
        du = gc.disk_usage([os.path.join(root, key)])
        installed.append({"env_key": key, "installed": bool(marker), "profile": marker.get("profile"),
                          "packages": marker.get("packages"), "torch": marker.get("torch"),
                          "size": du["apparent"], "disk": du, "built_at": marker.get("built_at"),
                          "last_used": gc.last_used(os.path.join(root, key), marker)})
    ledgers = {}
    ldir = home.path("ledger")
    for name in sorted(os.listdir(ldir)) if os.path.isdir(ldir) else []:
        if name.endswith(".json"):
            ledgers[name[:-5]] = read_json(os.path.join(ldir, name), {})
    emit({"envs": installed, "ledgers": ledgers,
          "disk_total": gc.disk_usage([os.path.join(root, e["env_key"]) for e in installed])})


def cmd_gc(home: Home, args) -> None:
    """Remove venvs not used for --days days, never an active or known-good one; job
    directories ended --older-than days ago and all but the newest
    --keep-checkpoints checkpoints, never a live job's (agent/prune.py)."""
    from gpujob.agent import prune
    res = prune.prune(home, args.older_than, args.keep_checkpoints, args.dry_run, time.time())
    root = home.path("envs")
    items = []
    for key in (sorted(os.listdir(root)) if os.path.isdir(root) else []) if args.days is not None else []:
        if not key.startswith("."):
            marker = envs.read_marker(home.root, key)
            items.append({"env_key": key, "profile": marker.get("profile"),
                          "last_used": gc.last_used(os.path.join(root, key), marker)})
    good_keys, good_names = gc.protected_by_ledgers(gc.read_ledgers(home.path("ledger")))
    rows = []
    for e, why in gc.select(items, args.days, time.time(), active_keys(home), good_keys, good_names):
        du = gc.disk_usage([os.path.join(root, e["env_key"])])
        remove = why == "remove" and not args.dry_run
        if remove:  # through the trash: a venv cut halfway never stays where it was
            prune.remove_tree(home, os.path.join(root, e["env_key"]), "env")
        rows.append(dict(e, why=why, removed=remove, disk=du))
    emit(dict(res, envs=rows, dry_run=args.dry_run, days=args.days, older_than=args.older_than,
              keep_checkpoints=args.keep_checkpoints))


def active_keys(home: Home) -> set:
    keys = set()
    for i in home.job_ids():
        st = Journal(home, i).effective_state()
        if st.get("state") not in ENDED and st.get("env_key"):
            keys.add(st["env_key"])
    return keys


def cmd_cache(home: Home, args) -> None:
    from gpujob.agent import cachecmd
    try:
        if args.action == "ls":
            emit(cachecmd.ls(home))
        elif args.action == "clear":
            emit(cachecmd.clear(home, args.profile, force=args.force, with_snapshots=args.snapshots,
                                active=active_keys(home)))
        elif not args.profile:
            raise Refused(f"cache {args.action} needs --profile")
        elif args.action == "restore":
            emit(cachecmd.restore(home, args.profile, active=active_keys(home)))
        else:
            gpus = [int(g) for g in args.gpus.split(",") if g.strip()] if args.gpus else None
            emit(cachecmd.prove_cold(home, args.profile, gpus))
    except cachecmd.Refused as e:
        raise Refused(str(e)) from None


def cmd_boot(home: Home, args) -> None:
    """Run at container start by the boot hook: every job marked resume_after_reboot
    whose supervisor is gone gets a new one (which restarts its command)."""
    done = {}
    for job_id in home.job_ids():
        j = Journal(home, job_id)
        if not (j.job().get("spec") or {}).get("resume_after_reboot"):
            continue
        st = j.state()
        if st.get("state") in ENDED:
            continue
        j.event("container_booted")
        done[job_id] = revive(home, job_id) or {"revived": False, "why": "its supervisor runs"}
    emit({"booted": done})


def cmd_run(home: Home, args) -> None:
    from gpujob.agent.supervisor import run
    sys.exit(run(home.root, args.job, args.lock_fd, args.generation))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpujob-agent")
    p.add_argument("--home", required=True)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("probe")
    s.add_argument("--workdir")
    s = sub.add_parser("put")
    s.add_argument("dest")
    s.add_argument("--mode", default="644")
    s = sub.add_parser("manifest")
    s.add_argument("--name", required=True)
    s.add_argument("--workdir")
    s.add_argument("dests", nargs="*")
    sub.add_parser("submit")
    s = sub.add_parser("run")
    s.add_argument("job")
    s.add_argument("--lock-fd", type=int)
    s.add_argument("--generation", type=int)
    s = sub.add_parser("status")
    s.add_argument("jobs", nargs="*")
    s.add_argument("--no-revive", action="store_true", help="only look: restart no dead supervisor")
    s.add_argument("--missing-ok", action="store_true", help="list unknown ids as not_found")
    s = sub.add_parser("tail")
    s.add_argument("job")
    s.add_argument("--file", default="job.log")
    s.add_argument("--offset", type=int, default=0)
    s.add_argument("--last", type=int)
    s.add_argument("--follow", action="store_true")
    s.add_argument("--poll", type=float, default=0.05)
    s = sub.add_parser("stop")
    s.add_argument("job")
    s.add_argument("--wait", type=float, default=120.0)
    s = sub.add_parser("rollback")
    s.add_argument("job")
    s.add_argument("--to")
    s.add_argument("--reason")
    s.add_argument("--mark-bad", action="store_true", help="also record the profile left bad")
    s = sub.add_parser("ledger")
    s.add_argument("action", choices=["show", "set"])
    s.add_argument("name")
    s.add_argument("profile", nargs="?")
    s.add_argument("status", nargs="?", choices=["good", "bad", "untried"])
    s.add_argument("--reason")
    sub.add_parser("profiles")
    sub.add_parser("boot")
    s = sub.add_parser("gc")
    s.add_argument("--days", type=float)
    s.add_argument("--older-than", type=float)
    s.add_argument("--keep-checkpoints", type=int)
    s.add_argument("--dry-run", action="store_true")
    s = sub.add_parser("cache")
    s.add_argument("action", choices=["ls", "clear", "restore", "prove-cold"])
    s.add_argument("--profile")
    s.add_argument("--force", action="store_true")
    s.add_argument("--snapshots", action="store_true", help="clear: the snapshots go too")
    s.add_argument("--gpus", help="prove-cold: comma-separated GPU ids")
    return p


COMMANDS = {"probe": cmd_probe, "put": cmd_put, "manifest": cmd_manifest, "submit": cmd_submit,
            "run": cmd_run, "status": cmd_status, "tail": cmd_tail, "stop": cmd_stop,
            "rollback": cmd_rollback, "profiles": cmd_profiles, "boot": cmd_boot, "cache": cmd_cache, "gc": cmd_gc,
            "ledger": cmd_ledger}


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    home = Home(args.home)
    try:
        COMMANDS[args.cmd](home, args)
    except Refused as e:
        emit({"error": str(e), "refused": True})
        return REFUSED
    except BrokenPipeError:
        return 0
    except Exception as e:  # every failure is one JSON line, never a traceback
        emit({"error": f"{type(e).__name__}: {e}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
