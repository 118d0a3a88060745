"""The agent's command line, run in the container by the controller (stdlib only):

    python3 -c LAUNCHER agent.pyz --home H <command> ...   (protocol.LAUNCHER)

Every command prints JSON (or raw log bytes for ``tail``) and exits 0, or prints
one ``{"error": ...}`` line and exits non-zero; exit codes and result shapes are in protocol.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

from gpujob.agent.base.stages import Stage
from gpujob.agent.supervisor import boothook
from gpujob.agent.home import gc
from gpujob.agent.base import envs
from gpujob.agent.base.protocol import ENDED
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.home import ledgerfile
from gpujob.agent.home.ledger import Ledger, Superseded
from gpujob.agent.home.ledgerfile import LedgerError
from gpujob.agent.base.fsio import now, write_json
from gpujob.agent.home.lock import Lock
from gpujob.agent.base.proc import die_here
from gpujob.agent.base import protocol
from gpujob.agent.base.protocol import JobState
from gpujob.agent.verbs.lifecycle import (Refused, acquire, emit, job_or_refuse, revive, spawn_supervisor,
                                          summary, would_revive)
from gpujob.agent.verbs.files import cmd_manifest, cmd_probe, cmd_put, untar
from gpujob.agent.verbs.tail import cmd_tail
from gpujob.agent.verbs.control import cmd_rollback, cmd_stop


REFUSED = protocol.REFUSED


class _Parser(argparse.ArgumentParser):
    """Bad usage is one ``{"error"}`` line (exit 2) like every other failure."""

    def error(self, message: str):
        raise _Usage(f"{self.prog}: {message}")


class _Usage(Exception):
    pass


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
        found = submit_checkpoints(home, job, workdir)  # before job.json, which holds resume_from
        os.makedirs(j.dir, exist_ok=False)
        synced = {}
        for entry in job.pop("sync_streams", []):
            dest = entry["dest"] if os.path.isabs(entry["dest"]) else os.path.join(workdir, entry["dest"])
            synced[entry["dest"]] = untar(stdin, entry["size"], dest)
        job["submitted_at"] = now()
        if secrets:
            write_json(j.path("secrets.json"), secrets, mode=0o600)
        write_json(j.path("job.json"), dict(job, **{protocol.FORMAT_KEY: protocol.FORMAT}), mode=0o600)
        j.set_state(job_id=job_id, name=job["spec"]["name"], state=JobState.PREPARING, phase="start",
                    step=Stage.ENV, profile=job["profile"], resume=bool(job.get("resume_from")), started_at=now())
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
    emit({"job_id": job_id, "supervisor_pid": pid, "synced": synced, "stale_lock": stale, "checkpoints": found})


def submit_checkpoints(home: Home, job: dict, workdir: str) -> dict | None:
    """The job's checkpoint globs checked against this home, what earlier jobs left
    under them, and ``--resume-from`` resolved (agent/home/ckregister.py at_submit)."""
    from gpujob.agent.home import ckregister
    from gpujob.agent.base import ckpaths, planshare
    from gpujob.agent.base.placeholders import substitute
    ck = (job["spec"].get("train") or {}).get("checkpoint")
    if not ck:
        return None
    why = ckpaths.refusal(ck["path"], workdir, home.root)
    if why:
        raise Refused(f"train.checkpoint.path {ck['path']!r} refused: {why}")
    patterns = []
    for p in job["spec"]["profiles"]:
        pat = substitute(ck["path"], planshare.template_values(job["spec"], job_id=job["job_id"], profile=p["name"],
                                                                workdir=workdir, fleet=job.get("fleet")))
        patterns.append(pat if os.path.isabs(pat) else os.path.join(workdir, pat))
    try:
        return ckregister.at_submit(home.root, job, workdir, patterns)
    except ValueError as e:
        raise Refused(str(e)) from None


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
    jobs += [{"job_id": i, "state": JobState.NOT_FOUND, "reason": "no such job in this container (its submit "
              "never got there)"} for i in missing]
    emit({"jobs": jobs, "lock": Lock(home.root).holder()})


LEDGER_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}(@x[0-9]{1,2}-[0-9a-f]{6})?")  # a job name (@ fleet shape)


PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def cmd_ledger(home: Home, args) -> None:
    """``ledger show NAME`` (a job name's ledger), ``ledger set NAME PROFILE STATUS`` (by
    hand: good, bad, or untried, which removes the entry), ``history``, ``undo NAME ID``,
    ``recover NAME`` (a damaged ledger put aside, its last good copy restored)."""
    if not LEDGER_NAME.fullmatch(args.name):
        raise Refused(f"job name {args.name!r}: expected lowercase letters, digits and '-' (at most 40)")
    led = Ledger(home, args.name)
    if args.action == "show":
        emit({"name": args.name, "ledger": led.read()})
        return
    if args.action == "history":
        emit({"name": args.name, "history": led.history()})
        return
    if args.action == "recover":
        emit(dict(led.recover(), name=args.name, ledger=led.read()))
        return
    if args.action == "undo":
        if not args.profile:
            raise Refused("ledger undo needs a verdict id (gpujob ledger history lists them)")
        try:
            rec = led.undo(args.profile, by_hand=True)
        except KeyError:
            raise Refused(f"no verdict {args.profile!r} in the ledger of {args.name} "
                          f"(gpujob ledger history lists them)") from None
        except Superseded as e:
            h = e.args[0]
            raise Refused(f"verdict {args.profile} of {args.name} is not undone: verdict {h['id']} "
                          f"({h['profile']} {h['status']}, {h.get('reason') or 'no reason'}) came after it "
                          f"on the same profile; undo {h['id']} first, or set {h['profile']} by hand "
                          f"(gpujob ledger set)") from None
        after = led.read()
        emit({"name": args.name, "undone": rec, "id": led.last.get("id"), "profile": rec["profile"],
              "status": (after["profiles"].get(rec["profile"]) or {}).get("status", "untried"), "ledger": after})
        return
    if not args.profile or not args.status:
        raise Refused("ledger set needs a profile and a status (good, bad or untried)")
    if not PROFILE_NAME.fullmatch(args.profile):
        raise Refused(f"profile {args.profile!r}: expected letters, digits, '_', '.' and '-'")
    reason = args.reason or "set by hand"
    if args.status == "untried":
        res = led.forget(args.profile, reason=reason, by_hand=True)
    else:
        res = led.mark(args.profile, args.status, reason=reason, by_hand=True)
    emit({"name": args.name, "profile": args.profile, "id": led.last.get("id"),
          "before": (led.last.get("before") or {}).get("status", "untried"), "status": args.status,
          "reason": None if args.status == "untried" else reason, "ledger": res})


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
        if name.endswith(".json"):  # a damaged one: its line, the others as they are
            try:
                ledgers[name[:-5]] = ledgerfile.load(os.path.join(ldir, name))
            except LedgerError as e:
                ledgers[name[:-5]] = {"error": str(e)}
    emit({"envs": installed, "ledgers": ledgers,
          "disk_total": gc.disk_usage([os.path.join(root, e["env_key"]) for e in installed])})


def cmd_gc(home: Home, args) -> None:
    """Remove venvs not used for --days days, never an active or known-good one; job
    directories ended --older-than days ago and all but the newest
    --keep-checkpoints checkpoints each job's runs wrote (the checkpoint register),
    never a live job's (agent/verbs/prune.py)."""
    from gpujob.agent.verbs import prune
    res = prune.prune(home, args.older_than, args.keep_checkpoints, args.dry_run, time.time())
    root = home.path("envs")
    items = []
    for key in (sorted(os.listdir(root)) if os.path.isdir(root) else []) if args.days is not None else []:
        if not key.startswith("."):
            marker = envs.read_marker(home.root, key)
            items.append({"env_key": key, "profile": marker.get("profile"),
                          "last_used": gc.last_used(os.path.join(root, key), marker)})
    ledgers, damaged = gc.read_ledgers(home.path("ledger"))
    good_keys, good_names = gc.protected_by_ledgers(ledgers)
    hold = f"kept: a ledger cannot be read ({damaged[0]})" if damaged else None
    rows = []
    for e, why in gc.select(items, args.days, time.time(), active_keys(home), good_keys, good_names, hold):
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
    from gpujob.agent.verbs import cachecmd
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


def cmd_fleet(home: Home, args) -> None:
    from gpujob.agent.verbs import fleetcmd
    try:
        emit(fleetcmd.cmd_fleet(home, args))
    except LookupError as e:
        raise Refused(str(e)) from None


def cmd_run(home: Home, args) -> None:
    from gpujob.agent.supervisor.supervisor import run
    sys.exit(run(home.root, args.job, args.lock_fd, args.generation))


_PARSER = None  # built once a process (the exec channel's zygote builds it before it forks)


def parser() -> argparse.ArgumentParser:
    global _PARSER
    if _PARSER is None:
        _PARSER = _build_parser()
    return _PARSER


warm = parser  # what the exec channel's zygote runs once after importing this module


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gpujob-agent")
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
    s.add_argument("action", choices=["show", "set", "history", "undo", "recover"])
    s.add_argument("name")
    s.add_argument("profile", nargs="?")
    s.add_argument("status", nargs="?", choices=["good", "bad", "untried"])
    s.add_argument("--reason")
    sub.add_parser("profiles")
    sub.add_parser("boot")
    s = sub.add_parser("fleet")
    s.add_argument("action", choices=["ports", "go", "release"])
    s.add_argument("job", nargs="?")
    s.add_argument("--reason")
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
            "ledger": cmd_ledger, "fleet": cmd_fleet}


def main(argv=None) -> int:
    try:
        args = parser().parse_args(argv)
        COMMANDS[args.cmd](Home(args.home), args)
    except _Usage as e:
        emit(protocol.error_result(str(e)))
        return protocol.USAGE
    except (Refused, protocol.NewerFormat, LedgerError) as e:
        emit(protocol.error_result(str(e), refused=True))
        return REFUSED
    except BrokenPipeError:
        return protocol.OK
    except Exception as e:  # every failure is one JSON line, never a traceback
        emit(protocol.error_result(f"{type(e).__name__}: {e}"))
        return protocol.FAILED
    return protocol.OK


#: ``status`` is answered inside the exec channel's server (``answer``) for at most this many ids
ANSWER_MAX_JOBS = 32


def answer(argv: list) -> tuple | None:
    """``status`` with the job ids named, answered in this very process — the exec channel's
    server, which loaded this module once (transport/mux_server.py) — instead of a forked
    child: (exit code, stdout, stderr), exactly what ``main(argv)`` prints. Only when that
    changes nothing: a job whose supervisor would be restarted (``revive``, which spawns a
    process and takes the lock) makes it None, and the caller forks as before; so do bad
    usage and anything but a short ``status``. The server waits while this runs, so it
    reads only the named jobs' small files."""
    import io
    real = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err = io.StringIO(), io.StringIO()
    try:
        try:
            args = parser().parse_args(argv)
        except BaseException:  # noqa: BLE001 - bad usage, --help: the forked way says it
            return None
        if list(argv[2:3]) != ["status"] or args.cmd != "status" or not args.jobs or len(args.jobs) > ANSWER_MAX_JOBS:
            return None
        home = Home(args.home)
        try:
            if not args.no_revive and any(would_revive(home, i) for i in args.jobs
                                          if os.path.exists(Journal(home, i).path("job.json"))):
                return None
        except Exception:  # noqa: BLE001 - a state it cannot read: the forked way says what
            return None
        die_here("status_answer")  # the suite's fault point: the server dies mid-answer
        code = main(list(argv[:3]) + ["--no-revive"] + list(argv[3:]))  # nothing to revive: the same answer
        return code, out.getvalue(), err.getvalue()
    finally:
        sys.stdout, sys.stderr = real


if __name__ == "__main__":
    sys.exit(main())
