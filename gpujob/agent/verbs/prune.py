"""Disk hygiene for job directories and checkpoints (stdlib only): ``gc
--older-than DAYS`` removes the directories of jobs that ended that long ago,
``gc --keep-checkpoints K`` keeps the newest K of the checkpoints each job's runs
wrote, as the checkpoint register records them (agent/home/ckregister.py): never a
file a glob matches that no run of the job wrote (an unrelated directory, an
earlier job's file), wherever the checkpoints live. Neither ever touches a live
job: one whose state is not final, whose supervisor runs (or is being started),
or whose command still runs after its supervisor died.

Safe when killed at any moment. A job directory is first renamed into
``<home>/.gc/`` (one atomic rename: from then on no command sees the job), then
deleted; a checkpoint folder is renamed to a hidden sibling (``.gc-NAME``, which
no glob matches) after a record of it is written to ``<home>/.gc/``; a file is
unlinked (atomic). A venv ``gc --days`` removes goes through the trash like a job
directory. Whatever a killed gc left half-deleted is in ``.gc/`` or named
there, and the next gc finishes it before anything else.
"""

from __future__ import annotations

import json
import os
import shutil
import time

from gpujob.agent.home import ckregister, ckscan, gc
from gpujob.agent.base import answers, ckpaths, envs, fsio
from gpujob.agent.base.protocol import ENDED
from gpujob.agent.base.wire import GcAnswer
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.verbs.lifecycle import active_keys, emit, live_processes

TRASH = ".gc"


# ---- pure choices --------------------------------------------------------------

def select_jobs(jobs: list, older_than_days: float, now: float) -> list:
    """[(job, why)]: why is "remove" or the reason it stays. ``jobs`` holds dicts
    with job_id, live (bool) and ended_at (None while not ended)."""
    out = []
    for j in jobs:
        if j["live"]:
            why = "live"
        elif j.get("ended_at") is None:
            why = "not ended"
        else:
            age = (now - j["ended_at"]) / 86400
            why = "remove" if age >= older_than_days else f"ended {age:.1f} days ago"
        out.append((j, why))
    return out


def select_checkpoints(groups: list, keep: int) -> list:
    """[(path, why)] over ``groups`` of {pattern, files: [(path, mtime)], live: bool}:
    the newest ``keep`` of each group stay, the rest go; nothing of a group a live
    job uses goes. A path in two groups goes only if both let it go."""
    reasons: dict = {}
    for g in groups:
        newest = sorted(g["files"], key=lambda f: f[1], reverse=True)
        for i, (path, _mtime) in enumerate(newest):
            why = "a live job's" if g["live"] else f"newest {keep}" if i < keep else "remove"
            reasons.setdefault(path, []).append(why)
    return [(path, next((w for w in whys if w != "remove"), "remove")) for path, whys in reasons.items()]


# ---- what is there -------------------------------------------------------------

def _live(home, job_id: str) -> tuple:
    """(live, ended_at, state) of a job, as its directory says now."""
    j = Journal(home, job_id)
    st = j.state()
    eff = j.effective_state() if st else {}
    live = bool(st) and (eff.get("state") not in ENDED or j.supervisor_alive(st) or bool(live_processes(st)))
    ended_at = None
    if st and eff.get("state") in ENDED:
        ended_at = st.get("finished_at")
        if ended_at is None:
            try:
                ended_at = os.path.getmtime(j.path("state.json"))
            except OSError:
                ended_at = None
    return live, ended_at, st


def jobs_of(home) -> list:
    out = []
    for job_id in home.job_ids():
        live, ended_at, st = _live(home, job_id)
        out.append({"job_id": job_id, "live": live, "ended_at": ended_at, "state": st.get("state")})
    return out


def checkpoint_groups(home) -> list:
    """One group per job with a register: the checkpoints its runs wrote that are
    still there as they were written, [(path, mtime)]: the same object (inode and
    newest mtime as registered, a file where a file was) in the directory it was
    registered in, resolved through links (agent/home/ckscan.py same_object), and
    never where a checkpoint may not lie."""
    groups = []
    for reg in ckregister.all_registers(home.root):
        job_id = reg["job_id"]
        live = _live(home, job_id)[0] if os.path.exists(Journal(home, job_id).path("job.json")) else False
        files = []
        for path, e in reg["files"].items():
            if e.get("gone"):
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if ckscan.same_object(path, e) is not None:
                continue
            real = ckscan.real_dir(path)
            if ckpaths.refusal(path, home=home.root) or ckscan.refused(real, home.root):
                continue  # a register from before the checks: never such a path
            files.append((path, st.st_mtime))
        groups.append({"job_id": job_id, "live": live, "files": files})
    return groups


def forget(home, removed: dict) -> None:
    """Write the removed checkpoints into their jobs' registers as gone."""
    for job_id, paths in removed.items():
        reg = ckregister.load(home.root, job_id)
        for path in paths:
            if path in reg["files"]:
                reg["files"][path].update(gone=time.time(), removed_by="gc")
        ckregister.save(home.root, reg)


# ---- removing, safe against death -----------------------------------------------

def _trash(home) -> str:
    path = home.path(TRASH)
    os.makedirs(path, exist_ok=True)
    return path


def finish_leftovers(home) -> list:
    """Finish what a killed gc left: every folder in ``.gc/`` and every checkpoint
    folder a record there names. Returns what was finished."""
    trash = home.path(TRASH)
    done = []
    for name in sorted(os.listdir(trash)) if os.path.isdir(trash) else []:
        path = os.path.join(trash, name)
        if name.endswith(".json"):  # a checkpoint folder renamed beside itself
            try:
                with open(path) as f:
                    target = json.load(f)["path"]
            except (OSError, ValueError, KeyError):
                target = None
            if target and os.path.lexists(target):
                shutil.rmtree(target, ignore_errors=True)
                done.append(target)
            os.unlink(path)
        elif os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            done.append(path)
        else:  # a record's temp file, left by a gc killed before its rename
            os.unlink(path)
    return done


def remove_job(home, job_id: str) -> bool:
    """Rename the job's directory into the trash, make sure it is still not live
    (a rollback by hand may have restarted it in between: then it goes back), and
    delete it. False when it stayed."""
    src = home.path("jobs", job_id)
    dst = os.path.join(_trash(home), f"job-{job_id}-{os.getpid()}")
    os.rename(src, dst)
    try:  # gone from jobs/ now: read its state where it lies
        with open(os.path.join(dst, "state.json")) as f:
            st = json.load(f)
    except (OSError, ValueError):
        st = {}
    if st.get("state") not in ENDED:  # it came alive between the look and the rename
        os.rename(dst, src)
        return False
    shutil.rmtree(dst, ignore_errors=True)
    return True


def remove_tree(home, path: str, tag: str) -> None:
    """Remove a tree under the home (a venv) the way a job directory goes: renamed
    into the trash in one step, then deleted; a death in between is finished by
    the next gc, and no half tree is ever where it was."""
    dst = os.path.join(_trash(home), f"{tag}-{os.path.basename(path)}-{os.getpid()}")
    os.rename(path, dst)
    shutil.rmtree(dst, ignore_errors=True)


def remove_checkpoint(home, path: str) -> None:
    """Remove a checkpoint where it really lies (its directory resolved through links
    once, so a link changed meanwhile cannot lead the removal elsewhere)."""
    path = os.path.join(ckscan.real_dir(path), os.path.basename(path))
    if os.path.isdir(path) and not os.path.islink(path):
        hidden = os.path.join(os.path.dirname(path), f".gc-{os.path.basename(path)}-{os.getpid()}")
        record = os.path.join(_trash(home), f"ckpt-{time.time_ns()}.json")
        # the record first (atomic, durable, through no planted link): a death after the rename
        # is finished later
        fsio.write_json(record, {"path": hidden, "was": path}, mode=0o600)
        os.rename(path, hidden)
        shutil.rmtree(hidden, ignore_errors=True)
        os.unlink(record)
    else:
        os.unlink(path)


def prune(home, older_than: float | None, keep: int | None, dry_run: bool, now: float) -> dict:
    """``gc``'s job directories and checkpoints; the leftovers of a killed gc first."""
    res = {"finished": [] if dry_run else finish_leftovers(home), "jobs": [], "checkpoints": []}
    # checkpoints first: they are found through the job directories' specs
    if keep is not None:
        groups = checkpoint_groups(home)
        owner = {path: g["job_id"] for g in groups for path, _ in g["files"]}
        gone: dict = {}
        for path, why in select_checkpoints(groups, keep):
            du = _size(path)
            removed = why == "remove" and not dry_run
            if removed:
                remove_checkpoint(home, path)
                gone.setdefault(owner[path], []).append(path)
            res["checkpoints"].append({"path": path, "why": why, "removed": removed, "bytes": du,
                                       "job_id": owner[path]})
        forget(home, gone)
    if older_than is not None:
        for j, why in select_jobs(jobs_of(home), older_than, now):
            du = _size(home.path("jobs", j["job_id"]))
            removed = why == "remove" and not dry_run and remove_job(home, j["job_id"])
            if why == "remove" and not dry_run and not removed:
                why = "live"
            res["jobs"].append({"job_id": j["job_id"], "state": j["state"], "ended_at": j["ended_at"],
                                "why": why, "removed": bool(removed), "bytes": du})
    return res


def _size(path: str) -> int:
    if not os.path.isdir(path) or os.path.islink(path):
        try:
            return os.lstat(path).st_size
        except OSError:
            return 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def cmd_gc(home: Home, args) -> None:
    """Remove venvs not used for --days days, never an active or known-good one; job
    directories ended --older-than days ago and all but the newest
    --keep-checkpoints checkpoints each job's runs wrote (the checkpoint register),
    never a live job's (agent/verbs/prune.py)."""
    res = prune(home, args.older_than, args.keep_checkpoints, args.dry_run, time.time())
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
            remove_tree(home, os.path.join(root, e["env_key"]), "env")
        rows.append(dict(e, why=why, removed=remove, disk=du))
    res = dict(res, envs=rows, dry_run=args.dry_run, days=args.days, older_than=args.older_than,
               keep_checkpoints=args.keep_checkpoints)
    emit(GcAnswer.from_dict(bounded(res)))


def bounded(res: dict) -> dict:
    """``gc``'s answer with each listing cut to answers.LIST_MAX rows (what is removed listed
    first): tens of thousands of checkpoints would pass the controller's answer cap. The
    totals are over every row: ``counts`` (rows, removed or to remove) and ``freed`` bytes."""
    res["freed"] = sum(e["disk"]["own"] for e in res["envs"] if e["why"] == "remove") + \
        sum(e["bytes"] for e in res["jobs"] + res["checkpoints"] if e["why"] == "remove")
    res["counts"] = {k: {"all": len(res[k]), "remove": sum(e["why"] == "remove" for e in res[k])}
                     for k in ("envs", "jobs", "checkpoints")}
    for key in ("envs", "jobs", "checkpoints", "finished"):
        answers.cap(res, key, first=lambda e: isinstance(e, dict) and e.get("why") == "remove")
    return res
