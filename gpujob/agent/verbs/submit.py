"""``submit``: a job's files and record written, its checkpoints checked against this home,
the lock taken and a detached supervisor started (stdlib only)."""

from __future__ import annotations

import json
import os
import shutil
import sys

from gpujob.agent.base import protocol
from gpujob.agent.base.fsio import now, write_json
from gpujob.agent.base.protocol import JobState
from gpujob.agent.base.stages import Stage
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.supervisor import boothook
from gpujob.agent.verbs.files import untar
from gpujob.agent.base.wire import JOB_ID, JOB_NAME, BadShape, Code, Refused, SubmitAnswer, SubmitRequest
from gpujob.agent.verbs.lifecycle import acquire, emit, spawn_supervisor


def read_request(line: bytes) -> SubmitRequest:
    """submit's first stdin line as its record; Refused (bad_request) when it is none."""
    try:
        req = SubmitRequest.from_dict(json.loads(line))
    except (ValueError, BadShape) as e:  # BadShape names the field
        raise Refused(f"submit: the request is not one this agent reads: {e}", Code.BAD_REQUEST) from None
    name = req.spec.get("name")
    if not (isinstance(name, str) and JOB_NAME.fullmatch(name)):
        raise Refused(f"submit: spec name {name!r} is no job name", Code.BAD_REQUEST)
    if not JOB_ID.fullmatch(req.job_id):
        raise Refused(f"submit: job id {req.job_id!r} is no job id", Code.BAD_REQUEST)
    return req


def cmd_submit(home: Home, args) -> None:
    """stdin: one JSON line (the job, ``wire.SubmitRequest``), then the tar streams of the sync entries."""
    stdin = sys.stdin.buffer
    req = read_request(stdin.readline())
    streams = req.streams()
    job = req.job_record()  # job.json: without the secrets (kept apart) and the streams
    job_id = req.job_id
    secrets = req.secrets
    j = Journal(home, job_id)
    if os.path.exists(j.dir):
        raise Refused(f"job id {job_id} already exists in this container; nothing was changed", Code.EXISTS)
    held, stale = acquire(home, job_id, job.get("by"))
    made = None  # the job's folder, once this submit made it
    try:
        j = Journal(home, job_id, held.generation)
        workdir = home.workdir(job["spec"])
        for entry in streams:  # checked again here, before anything is written
            inside = os.path.abspath(os.path.join(workdir, entry.dest)) + os.sep
            if not (os.path.isabs(entry.dest) or inside.startswith(os.path.abspath(workdir) + os.sep)):
                raise ValueError(f"sync dest {entry.dest!r} resolves outside the workdir")
        found = submit_checkpoints(home, job, workdir)  # before job.json, which holds resume_from
        os.makedirs(j.dir, exist_ok=False)
        made = j.dir
        synced = {}
        for entry in streams:
            dest = entry.dest if os.path.isabs(entry.dest) else os.path.join(workdir, entry.dest)
            synced[entry.dest] = untar(stdin, entry.size, dest)
        job["submitted_at"] = now()
        if secrets:
            write_json(j.path("secrets.json"), secrets, mode=0o600)
        write_json(j.path("job.json"), dict(job, **{protocol.FORMAT_KEY: protocol.FORMAT}), mode=0o600)
        j.set_state(job_id=job_id, name=job["spec"]["name"], state=JobState.PREPARING, phase="start",
                    step=Stage.ENV, profile=job["profile"], resume=bool(job.get("resume_from")),
                    started_at=now())
        j.event("submitted", profile=job["profile"], synced=synced,
                stale_lock=stale.get("job_id") if stale else None)
        if job.get("boot_hook"):
            line = boothook.install(sys.executable, os.path.abspath(sys.argv[0]), home.root)
            j.event("boot_hook", path=boothook.RC_LOCAL, line=line)
        made = None  # from here a supervisor may run: its folder stays
        pid = spawn_supervisor(home, job_id, held)
    except BaseException:
        held.release()
        if os.path.exists(Journal(home, job_id).path("secrets.json")):  # no supervisor will use them
            os.unlink(Journal(home, job_id).path("secrets.json"))
        if made is not None:  # no supervisor started: no job of this id (ps shows none, the id is free)
            shutil.rmtree(made, ignore_errors=True)
        raise
    emit(SubmitAnswer(job_id, pid, synced, stale_lock=stale, checkpoints=found))


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
        raise Refused(f"train.checkpoint.path {ck['path']!r} refused: {why}", Code.BAD_REQUEST)
    patterns = []
    for p in job["spec"]["profiles"]:
        pat = substitute(ck["path"],
                         planshare.template_values(job["spec"], job_id=job["job_id"], profile=p["name"],
                                                                workdir=workdir, fleet=job.get("fleet")))
        patterns.append(pat if os.path.isabs(pat) else os.path.join(workdir, pat))
    try:
        return ckregister.at_submit(home.root, job, workdir, patterns)
    except ValueError as e:
        raise Refused(str(e), Code.NOT_FOUND) from None
