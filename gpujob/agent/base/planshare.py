"""What the plan shows and the supervisor runs, derived once (stdlib only).

``gpujob.ops.plan.build_plan`` (controller) and the supervisor (agent) both call these
functions, so the plan cannot drift from the run: the placeholder values of a
command, the warmup's fan-out (which GPUs, which environment per run), the venv's
side files and the venv build commands.
"""

from __future__ import annotations

import hashlib
import os

from gpujob.agent.base import defaults, envs
from gpujob.agent.base.placeholders import substitute

CONSTRAINTS_FILE = ".gpujob-constraints.txt"   # in the venv: the profile's pins, as uv constraints
REQUIREMENTS_FILE = ".gpujob-requirements.txt"  # in the venv: a profile's requirements_text
MASK = "***"  # a secret webhook URL as the journal keeps it


def template_values(spec: dict, *, job_id: str, profile: str, workdir: str, fleet: dict | None = None,
                    gpu=None) -> dict:
    """The values of the placeholders of a spec command (commands.substitute):
    ``gpus.NAME``, ``profile``, ``job_id``, ``workdir``, a multi-node job's own
    values (``fleet["values"]``) and, for one run of a per-GPU warmup, ``gpu``."""
    vals = {f"gpus.{g}": ",".join(str(i) for i in ids) for g, ids in (spec.get("gpus") or {}).items()}
    vals.update(profile=profile, job_id=job_id, workdir=workdir)
    vals.update((fleet or {}).get("values") or {})
    if gpu is not None:
        vals["gpu"] = str(gpu)
    return vals


def warmup_gpus(spec: dict) -> list:
    """The warmup's runs: one per GPU of its ``per_gpu`` group, else one run ([None]);
    [] without a warmup."""
    w = defaults.section(spec, "warmup")
    if not w:
        return []
    if w["per_gpu"]:
        return list((spec.get("gpus") or {}).get(w["per_gpu"], []))
    return [None]


def warmup_env(gpu) -> dict:
    """The environment one warmup run gets on top of the job's: its one GPU."""
    return {"CUDA_VISIBLE_DEVICES": str(gpu), "GPUJOB_GPU": str(gpu)} if gpu is not None else {}


def side_files(venv: str, profile: dict) -> tuple:
    """The files the venv build writes into the venv before installing: the
    constraints file and (for a profile with requirements_text) the requirements file."""
    req = os.path.join(venv, REQUIREMENTS_FILE) if profile.get("requirements_text") else None
    return os.path.join(venv, CONSTRAINTS_FILE), req


def uv_cache(home: str) -> str:
    return os.path.join(home, "uv-cache")


def env_build_commands(profile: dict, venv: str, python: str, *, uv, home: str, spec: dict) -> list:
    """The argv lists that build ``profile``'s venv (envs.build_commands with the
    side files and uv cache above)."""
    constraints, req = side_files(venv, profile)
    return envs.build_commands(profile, venv, python, uv=uv, uv_cache=uv_cache(home),
                               common_requirements=list(spec.get("requirements") or []),
                               constraints_file=constraints, profile_requirements_file=req,
                               no_deps=list(spec.get("requirements_no_deps") or []))


def ledger_name(job: dict) -> str:
    """The ledger of a job name, per fleet shape: a profile known-good on one
    container says nothing of it on two (NCCL across nodes)."""
    name = job["spec"]["name"]
    fleet = job.get("fleet")
    if not fleet:
        return name
    shape = hashlib.sha256("\n".join(fleet["nodes"]).encode()).hexdigest()[:6]
    return f"{name}@x{fleet['nnodes']}-{shape}"


def textfile_path(job_dir: str, job_id: str, textfile: str) -> str:
    """Where the textfile goes: ``{job_id}`` substituted; relative paths start at the job dir."""
    path = os.path.expanduser(substitute(textfile, {"job_id": job_id}))
    return path if os.path.isabs(path) else os.path.join(job_dir, path)


def describe(index: int, hook: dict) -> str:
    """A webhook as the plan and the journal name it (never its URL when that is a secret)."""
    url = hook.get("url")
    where = "a secret URL" if not isinstance(url, str) or url == MASK else url.split("?")[0]
    return f"notify[{index}] ({hook.get('format', defaults.DEFAULTS['notify']['format'])}, {where})"
