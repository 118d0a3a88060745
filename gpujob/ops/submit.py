"""Submit, the I/O: ship what changed and start the supervisor in the container (the plan of
it is ops/plan.py's)."""

from __future__ import annotations

import json
import os
from typing import Callable

from gpujob.agent.base import wire
from gpujob.agent.judge import checkpoint
from gpujob.spec import secrets as secrets_env, selfload
from gpujob.errors import GpujobError, InputError
from gpujob.spec.model import JobSpec
from gpujob.ops.target import Target
from gpujob.ops.plan import checkpoint_where, job_request
from gpujob.ops.ship import changed, local_manifest, sync_sources
from gpujob.ops.tarstream import Concat, TarStream


def submitter() -> str:
    """user@laptop, as the container's lock and ``ps --all`` show who submitted a job."""
    import getpass
    import socket
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry
        user = str(os.getuid())
    return f"{user}@{socket.gethostname().split('.')[0] or '?'}"


def submit(spec: JobSpec, target: Target, *, profile: str, job_id: str,
           clear_caches: bool, progress: Callable[[str], None], fleet: dict | None = None,
           fleet_key: str | None = None, resume_from: str | None = None,
           accept_baseline: bool = False, resume_copy: bool = False) -> wire.SubmitAnswer:
    """Ship what is needed and start the supervisor; returns the agent's answer. A node
    of a multi-node job (``fleet``) gets its place and the job's channel key (a secret).
    ``resume_from`` (PATH or JOB, ``submit --resume-from``) is resolved in the container."""
    checkpoint_where(spec, target.home)
    if resume_from is not None and spec.train.checkpoint is None:
        raise InputError("--resume-from needs train.checkpoint in the spec (path and every)")
    sources = sync_sources(spec)  # local problems surface before any remote change
    spec.common_requirements(strict=True)  # a requirements file that is missing or unusable, too
    secrets = secrets_env.resolve(spec)
    if fleet_key:
        secrets = dict(secrets, fleet_key=fleet_key)
    req = job_request(spec, job_id, profile, clear_caches=clear_caches, secrets=secrets,
                      env_passthrough=target.env_passthrough, fleet=fleet)
    req.by = submitter()  # the container's lock says who holds it
    if resume_from is not None:
        req.resume_from_ask = resume_from
        req.resume_from_copy = resume_copy  # a trial: a copy in its own workdir (agent/home/ckcopy.py)
    req.accept_baseline = accept_baseline  # submit --accept-baseline (agent/judge/decide.promotion)
    req.boot_hook = spec.resume_after_reboot and target.driver.boot_hooks  # never a laptop's rc.local
    if spec.resume_after_reboot and not target.driver.boot_hooks:
        progress(f"note: resume_after_reboot installs no boot hook on a {target.kind} target (its "
                 "rc.local would be this machine's); `gpujob status` after a restart brings the job back")
    for w in checkpoint.warnings(req.spec):
        progress(f"warning: {w}")
    progress(f"probing {target.label}")
    target.probe(spec.workdir)
    uv = target.ensure_uv()
    if uv is None:
        progress("no uv in the container and ours cannot run there: the venv will be built with pip")
    req.uv = uv
    streams, payload = [], []
    if sources:
        locals_ = [local_manifest(s.src, s.exclude, s.name) for s in sources]
        asked: dict[str, list[str]] = {}
        for s, local in zip(sources, locals_):
            asked.setdefault(s.dest, []).extend(local)
        asking = json.dumps(wire.ManifestRequest(asked).to_dict()).encode()
        remote = target.ask(wire.ManifestAnswer, "manifest", "--name", spec.name,
                            *(["--workdir", spec.workdir] if spec.workdir else []),
                            *[s.dest for s in sources], stdin=asking)
        for s, local in zip(sources, locals_):
            todo = changed(local, remote.found.get(s.dest, {}))
            progress(f"sync {s.src} -> {s.dest}: {len(todo)} of {len(local)} files changed")
            if todo:
                tar = TarStream(s.src, todo)  # read while it is sent: memory stays flat
                streams.append(wire.SyncStream(s.dest, tar.size).to_dict())
                payload.append(tar)
    req.sync_streams = streams
    stdin = Concat([json.dumps(req.to_dict()).encode() + b"\n", *payload], getattr(progress, "on_read", None))
    progress("starting the supervisor")
    try:
        res = target.ask(wire.SubmitAnswer, "submit", stdin=stdin, timeout=600)
    except GpujobError as e:  # an agent error could quote what it read: never a secret
        e.message = secrets_env.scrub(e.message, secrets)
        e.args = (e.message,)
        raise
    for tar in payload:
        for path in tar.changed:
            progress(f"note: {path} changed while it was shipped; the container's copy may be torn: "
                     "submit again once it is written")
    note = selfload.earlier_note(spec.recipe, spec.train.command)
    for line in earlier_checkpoint_lines(res.to_dict(), note, copy_place(spec, job_id)):
        progress(line)
    return res


def copy_place(spec: JobSpec, job_id: str) -> str | None:
    """This job's checkpoint place when its trainer resumes from a fixed one (the path as the
    spec names it, its job id filled in), else None."""
    from gpujob.agent.base.ckpaths import fixed_place
    ck = spec.train.checkpoint
    if ck is None or not fixed_place(ck.path, spec.train.resume_args):
        return None
    return ck.path.replace("{job_id}", job_id)


def earlier_checkpoint_lines(res: dict, note: str = selfload.earlier_note(None, ""),
                             copy_to: str | None = None) -> list[str]:
    """What submit says about the checkpoints it found (the agent's ``checkpoints`` answer);
    ``note``: what this job's trainer does with them (spec/selfload.py); ``copy_to``: this
    job's checkpoint place, where ``--resume-from``'s is copied (a trainer that resumes from a
    fixed place), else None."""
    found = res.get("checkpoints") or {}
    lines = []
    left = found.get("left") or []
    count = max(int(found.get("left_count") or 0), len(left))  # left_count: an agent that bounds the list
    if left:
        shown = ", ".join(f"{c['path']}" + (f" (job {c['job']})" if c.get("job") else "") for c in left[:5])
        more = f" and {count - 5} more" if count > 5 else ""
        lines.append(f"note: {count} checkpoint(s) that earlier jobs left under {found.get('where')}: "
                     f"{shown}{more}. They stay as they are (a trainer that writes the same name overwrites "
                     f"them); {note}")
    if found.get("resume_from"):
        r = found["resume_from"]
        lines.append(f"resuming on purpose from {r['path']}" + (f" (job {r['job']}" + (
            f", step {r['step']})" if r.get("step") is not None else ")") if r.get("job") else "")
            + (f": copied into this job's {copy_to} before the trainer starts (its resume_args load "
               "from there)" if copy_to else ""))
    return lines
