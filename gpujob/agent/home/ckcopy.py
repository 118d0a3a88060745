"""A trial's start point: a copy of another job's checkpoint in the trial's own workdir
(stdlib only). ``gpujob bisect`` and ``tune --from JOB`` start each trial from the same
finished checkpoint of the job, and the trial's trainer must never write into the job's
files: the checkpoint is copied, at the same place relative to the trial's workdir as it
had in the job's (a trainer that resumes from its own output dir finds it there), else
under ``.gpujob-start/``; a trainer that resumes from a fixed place of the trial's own
(nanoGPT's ``out/{job_id}/ckpt.pt``) gets it there directly (agent/home/ckregister.py
``own_fixed_place``): one copy, not two. A copy is made beside its place and renamed into it (an
interrupted copy never looks whole); what was there before (an earlier trial's start) is
removed first, a link as a link (never followed).

``copy_into`` is the copy itself; the supervisor also uses it to put ``submit --resume-from``'s
checkpoint at the job's own fixed checkpoint place, for a trainer that resumes from there
(agent/supervisor/cksupervise.py ``start_copy``).
"""

from __future__ import annotations

import json
import os
import shutil
import time

from gpujob.agent.base.proc import die_here


def source_workdir(home_root: str, job_id: str) -> str | None:
    """The workdir of job ``job_id`` as its job.json says (None when unreadable)."""
    try:
        with open(os.path.join(home_root, "jobs", job_id, "job.json")) as f:
            spec = json.load(f)["spec"]
        wd = os.path.expanduser(spec.get("workdir") or os.path.join("work", spec["name"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return wd if os.path.isabs(wd) else os.path.join(home_root, wd)


def place(path: str, src_workdir: str | None, workdir: str) -> str:
    """Where the copy of ``path`` goes in ``workdir``."""
    if src_workdir:
        rel = os.path.relpath(os.path.realpath(path), os.path.realpath(src_workdir))
        if rel != "." and not rel.startswith(".." + os.sep) and rel != "..":
            return os.path.join(workdir, rel)
    return os.path.join(workdir, ".gpujob-start", os.path.basename(path.rstrip(os.sep)))


def _remove(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def signature(src: str) -> tuple:
    """What changes when ``src`` (a file, or a directory's files) is written: sizes and
    modification times (a link as a link)."""
    if os.path.isdir(src) and not os.path.islink(src):
        out = []
        for root, dirs, files in os.walk(src):
            dirs.sort()
            for name in sorted(files):
                st = os.lstat(os.path.join(root, name))
                out.append((os.path.relpath(os.path.join(root, name), src), st.st_size, st.st_mtime_ns))
        return tuple(out)
    st = os.lstat(src)
    return ((st.st_size, st.st_mtime_ns),)


def copy_steady(src: str, dest: str, workdir: str, wait: float, tries: int = 3) -> int:
    """``copy_into`` of a checkpoint that its own job may still be rewriting in place (a
    nanoGPT job still running): a copy during which ``src`` changed is thrown away before it
    reaches ``dest``, and made again after ``wait`` seconds, at most ``tries`` times
    (ValueError then). Returns the number of copies made."""
    for attempt in range(1, tries + 1):
        before = signature(src)
        if copy_into(src, dest, workdir, steady=lambda: signature(src) == before):
            return attempt
        if attempt < tries:
            time.sleep(wait)
    raise ValueError(f"{src} changed while it was copied, {tries} times in a row (the job that writes it "
                     "still runs?): nothing was put in place")


def copy_into(src: str, dest: str, workdir: str, steady=None) -> bool:
    """``src`` (a file or a directory) copied to ``dest`` inside ``workdir``: beside it first,
    then renamed into place, so nothing half-copied ever stands at ``dest`` (a copier killed
    mid-copy leaves its temp file beside, removed by the next copy to the same place). No
    folder between ``workdir`` and ``dest`` may be a link (ValueError); what was at ``dest``
    is removed, a link as a link (never followed). ``steady()``, when given, is asked
    after the copy: False throws the copy away (False returned, ``dest`` untouched)."""
    at = os.path.dirname(dest)
    while at.startswith(workdir.rstrip(os.sep) + os.sep) or at == workdir:  # never through a linked folder
        if os.path.islink(at):
            raise ValueError(f"the copy's place {dest}: {at} is a link (into another place); refused")
        at = os.path.dirname(at)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    head = f".{os.path.basename(dest)}.gpujob-copy"
    for name in os.listdir(os.path.dirname(dest)):  # a copier killed mid-copy left it
        if name.startswith(head):
            _remove(os.path.join(os.path.dirname(dest), name))
    tmp = os.path.join(os.path.dirname(dest), f"{head}{os.getpid()}")
    if os.path.isdir(src) and not os.path.islink(src):
        shutil.copytree(src, tmp, symlinks=True)
    else:
        shutil.copy2(src, tmp, follow_symlinks=False)
    if steady is not None and not steady():
        _remove(tmp)
        return False
    die_here("start_copied")  # the suite's death point: the copy whole beside its place, not renamed
    _remove(dest)
    os.replace(tmp, dest)
    return True


def copy_start(entry: dict, home_root: str, workdir: str, dest: str | None = None) -> dict:
    """``entry`` (submit --resume-from's resolved point: path, job, step) with its path
    replaced by a copy in ``workdir``: at ``dest`` when given (the trial's own fixed
    checkpoint place, where its trainer resumes from: one copy, not a second one by the
    supervisor), else at ``place``; ``copied_from`` keeps the original."""
    src = entry["path"]
    if dest is None:
        dest = place(src, source_workdir(home_root, entry["job"]) if entry.get("job") else None, workdir)
    copy_into(src, dest, workdir)
    return dict(entry, path=dest, copied_from=src)
