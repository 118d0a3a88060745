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
import shutil
import signal
import subprocess
import sys
import tarfile
import time

from gpujob.agent import envs
from gpujob.agent.journal import (ENDED, FINAL_STATES, Home, Journal, Ledger, Lock, group_pids, now,
                                  read_json, write_json)

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

def spawn_supervisor(home: Home, job_id: str) -> int:
    j = Journal(home, job_id)
    log = open(j.path("supervisor.log"), "ab")
    p = subprocess.Popen([sys.executable, os.path.abspath(sys.argv[0]), "--home", home.root,
                          "run", job_id], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         start_new_session=True, close_fds=True, cwd=home.root)
    log.close()
    return p.pid


def acquire(home: Home, job_id: str) -> dict | None:
    ok, holder = Lock(home).acquire(job_id, os.getpid())
    if not ok:
        raise Refused(f"container busy: job {holder.get('job_id')} holds the lock "
                      f"(supervisor pid {holder.get('pid')}, since "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(holder.get('since', 0)))})")
    return holder


def cmd_submit(home: Home, args) -> None:
    """stdin: one JSON line (the job), then the tar streams of the sync entries."""
    stdin = sys.stdin.buffer
    job = json.loads(stdin.readline())
    job_id = job["job_id"]
    secrets = job.pop("secrets", None)  # kept out of job.json, the job's record
    stale = acquire(home, job_id)
    try:
        j = Journal(home, job_id)
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
        write_json(j.path("state.json"), {"job_id": job_id, "name": job["spec"]["name"],
                                          "state": "preparing", "phase": "start",
                                          "profile": job["profile"], "started_at": now()})
        j.event("submitted", profile=job["profile"], synced=synced,
                stale_lock=stale.get("job_id") if stale else None)
        pid = spawn_supervisor(home, job_id)
        Lock(home).update(job_id, pid)
        j.set_state(supervisor_pid=pid)
    except BaseException:
        Lock(home).release(job_id)
        if os.path.exists(Journal(home, job_id).path("secrets.json")):  # no supervisor will use them
            os.unlink(Journal(home, job_id).path("secrets.json"))
        raise
    emit({"job_id": job_id, "supervisor_pid": pid, "synced": synced,
          "stale_lock": stale})


def summary(home: Home, job_id: str) -> dict:
    j = Journal(home, job_id)
    st = j.effective_state()
    job = j.job()
    st.setdefault("job_id", job_id)
    st["name"] = job.get("spec", {}).get("name")
    st["submitted_at"] = job.get("submitted_at")
    st["initial_profile"] = job.get("profile")
    if job.get("spec", {}).get("throughput"):
        tp = job["spec"]["throughput"]
        st["policy"] = {k: tp.get(k) for k in ("min", "min_ratio", "window", "failure_limit")}
    st["ledger"] = Ledger(home, st["name"]).read() if st["name"] else {}
    return st


def job_or_refuse(home: Home, job_id: str) -> Journal:
    j = Journal(home, job_id)
    if not os.path.exists(j.path("job.json")):
        raise Refused(f"no job {job_id} in this container")
    return j


def cmd_status(home: Home, args) -> None:
    ids = args.jobs or home.job_ids()
    for i in ids:
        job_or_refuse(home, i)
    emit({"jobs": [summary(home, i) for i in ids], "lock": Lock(home).holder()})


def cmd_tail(home: Home, args) -> None:
    """Raw bytes of a job's log from ``--offset``; with ``--follow`` until the job is
    final (or its supervisor gone) and the file fully sent."""
    j = job_or_refuse(home, args.job)
    path = j.path(args.file)
    out = sys.stdout.buffer
    offset = args.offset
    if args.last is not None:
        offset = last_lines_offset(path, args.last)
    sys.stderr.write(json.dumps({"offset": offset}) + "\n")
    sys.stderr.flush()
    reader_gone = stdout_watch()
    f = None
    idle = 0.0
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


def kill_leftovers(st: dict) -> None:
    """End what a lost supervisor left running (its trainer's process group)."""
    pgid = st.get("child_pgid")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not pgid or not group_pids(pgid):
            return
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        end = time.time() + 10
        while time.time() < end and group_pids(pgid):
            time.sleep(0.1)


def cmd_stop(home: Home, args) -> None:
    j = job_or_refuse(home, args.job)
    st = j.effective_state()
    if st.get("state") in FINAL_STATES:
        emit({"job_id": args.job, "state": st["state"], "already": True})
        return
    if st.get("state") != "lost":
        j.request("stop")
        st = wait_final(j, args.wait)
    if st.get("state") == "lost":  # no supervisor to ask: stop what it left ourselves
        kill_leftovers(st)
        j.set_state(state="stopped", phase="done", reason="stopped by hand after its supervisor was lost",
                    finished_at=now())
        Lock(home).release(args.job)
        st = j.effective_state()
    left = group_pids(st["child_pgid"]) if st.get("child_pgid") else []
    emit({"job_id": args.job, "state": st.get("state"), "left": left})


def cmd_rollback(home: Home, args) -> None:
    j = job_or_refuse(home, args.job)
    st = j.effective_state()
    job = j.job()
    profiles = [p["name"] for p in job["spec"]["profiles"]]
    if args.to and args.to not in profiles:
        raise Refused(f"no profile {args.to!r} in job {args.job}; profiles: {', '.join(profiles)}")
    current = st.get("profile") or job["profile"]
    if args.to == current:
        raise Refused(f"job {args.job} already runs on profile {current}")
    reason = args.reason or "rolled back by hand"
    target = args.to or Ledger(home, job["spec"]["name"]).pick(
        current, profiles, (job["spec"].get("rollback") or {}).get("fallback"))
    if target is None:
        raise Refused(f"no known-good profile other than {current}; name one with --to")
    if st.get("state") not in ENDED:
        j.request("rollback", to=target, reason=reason)
        emit({"job_id": args.job, "requested": True, "from": current, "to": target})
        return
    if st.get("state") == "lost":
        kill_leftovers(st)  # never two trainers on the same GPUs
    acquire(home, args.job)
    try:
        job["start"] = {"profile": target, "resume": True, "rollback_from": current, "reason": reason}
        write_json(j.path("job.json"), job, mode=0o600)
        j.set_state(state="rolling_back", phase="env", profile=target, reason=reason,
                    finished_at=None)
        pid = spawn_supervisor(home, args.job)
        Lock(home).update(args.job, pid)
        j.set_state(supervisor_pid=pid)
    except BaseException:
        Lock(home).release(args.job)
        raise
    emit({"job_id": args.job, "restarted": True, "from": current, "to": target, "supervisor_pid": pid})


def cmd_profiles(home: Home, args) -> None:
    installed = []
    root = home.path("envs")
    for key in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        if key.startswith("."):
            continue
        marker = envs.read_marker(home.root, key)
        installed.append({"env_key": key, "installed": bool(marker), "profile": marker.get("profile"),
                          "packages": marker.get("packages"), "torch": marker.get("torch"),
                          "size": envs.dir_size(os.path.join(root, key)),
                          "built_at": marker.get("built_at")})
    ledgers = {}
    ldir = home.path("ledger")
    for name in sorted(os.listdir(ldir)) if os.path.isdir(ldir) else []:
        if name.endswith(".json"):
            ledgers[name[:-5]] = read_json(os.path.join(ldir, name), {})
    emit({"envs": installed, "ledgers": ledgers})


def active_keys(home: Home) -> set:
    keys = set()
    for i in home.job_ids():
        st = Journal(home, i).effective_state()
        if st.get("state") not in ENDED and st.get("env_key"):
            keys.add(st["env_key"])
    return keys


def cmd_cache(home: Home, args) -> None:
    root = home.path("caches")
    keys = sorted(os.listdir(root)) if os.path.isdir(root) else []
    if args.profile:
        keys = [k for k in keys if k.rsplit("-", 1)[0] == args.profile or k == args.profile]
    if args.action == "ls":
        emit({"caches": [{"env_key": k, "size": envs.dir_size(os.path.join(root, k)),
                          "parts": {sub: envs.dir_size(os.path.join(root, k, sub))
                                    for sub in envs.CACHE_VARS.values()}} for k in keys],
              "uv_cache": envs.dir_size(home.path("uv-cache"))})
        return
    busy = active_keys(home) & set(keys)
    if busy and not args.force:
        raise Refused(f"a running job uses the cache of {', '.join(sorted(busy))}; stop it first or pass --force")
    for k in keys:
        envs.remove_tree(os.path.join(root, k))
    emit({"cleared": keys})


def cmd_run(home: Home, args) -> None:
    from gpujob.agent.supervisor import run
    sys.exit(run(home.root, args.job))


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
    s = sub.add_parser("status")
    s.add_argument("jobs", nargs="*")
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
    sub.add_parser("profiles")
    s = sub.add_parser("cache")
    s.add_argument("action", choices=["ls", "clear"])
    s.add_argument("--profile")
    s.add_argument("--force", action="store_true")
    return p


COMMANDS = {"probe": cmd_probe, "put": cmd_put, "manifest": cmd_manifest, "submit": cmd_submit,
            "run": cmd_run, "status": cmd_status, "tail": cmd_tail, "stop": cmd_stop,
            "rollback": cmd_rollback, "profiles": cmd_profiles, "cache": cmd_cache}


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
    except (OSError, ValueError, KeyError) as e:
        emit({"error": f"{type(e).__name__}: {e}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
