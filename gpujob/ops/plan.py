"""The plan of a submit, pure: spec and target in, steps out (what ``submit --plan`` prints),
and the request ``agent submit`` receives. Every argv is built with the same functions that
``submit`` and the supervisor run (``Target.agent_argv``, ``envs.build_commands``,
``agent.base.placeholders.command_argv``), so the commands it shows are the commands that run.
"""

from __future__ import annotations

import secrets
import shlex

from gpujob.agent.judge import checkpoint
from gpujob.agent.base import ckpaths, envs, planshare
from gpujob.agent.base.placeholders import command_argv, substitute
from gpujob.agent.base.wire import SubmitRequest
from gpujob.spec import cmdfiles, secrets as secrets_env
from gpujob.errors import SpecError
from gpujob.spec.model import JobSpec, remote_dest, spec_hash
from gpujob.spec.layers import layer_steps
from gpujob.spec import selfload
from gpujob.steps import Step
from gpujob.ops.ship import sync_sources
from gpujob.ops.target import Target


ID_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # no 0/o, 1/l/i: ids are read aloud


def new_job_id(name: str) -> str:
    return f"{name}-{''.join(secrets.choice(ID_ALPHABET) for _ in range(4))}"


def job_request(spec: JobSpec, job_id: str, profile: str, *, clear_caches: bool,
                env_passthrough: list | None = None, secrets: dict | None = None,
                fleet: dict | None = None) -> SubmitRequest:
    """What ``agent submit`` receives (besides the code): its first stdin line. Secret env values
    are ``***`` in the spec; their values (``secrets``) ride apart, for secrets.json."""
    data = spec.to_agent_dict()
    names = secrets_env.mask(data)

    def resolved(url: str | None) -> str | None:  # relative file: URLs start at the spec's folder
        if url and url.startswith("file:") and not url.startswith("file://"):
            return (spec.spec_dir / url[5:]).resolve().as_uri()
        return url
    for p in data["profiles"]:
        p["index_url"] = resolved(p["index_url"])
        p["extra_index_urls"] = [resolved(u) for u in p.get("extra_index_urls") or []]
        p["find_links"] = [resolved(u) for u in p.get("find_links") or []]
    req = SubmitRequest(job_id, data, profile, {p["name"]: p["env_key"] for p in data["profiles"]},
                        spec_hash(spec), clear_caches=clear_caches, secret_names=names,
                        env_passthrough=list(env_passthrough or []))
    if secrets and (secrets.get("env") or secrets.get("profiles") or secrets.get("notify")
                    or secrets.get("fleet_key")):
        req.secrets = secrets
    req.self_loads = selfload.self_loads(spec.recipe, spec.train.command)  # the supervisor's note says it
    if fleet is not None:  # one node of a multi-node job (gpujob/ops/fleet.py): its place, its own env
        req.fleet = {k: v for k, v in fleet.items() if k != "env"}
        req.spec["env"].update(fleet.get("env") or {})
    return req


#: how the plan shows the agent launcher's source (gpujob/agent/base/protocol.py LAUNCHER)
LAUNCHER_SHOWN = "<gpujob agent launcher: run AGENT.pyz, exit 6 when it is missing>"


def agent_shown(target: Target, *args: str) -> list[str]:
    return target.agent_argv(*args, launcher=LAUNCHER_SHOWN)


def checkpoint_where(spec: JobSpec, home: str) -> str | None:
    """The checkpoint glob as the container will expand it (absolute when the workdir is
    known here), refused with the spec's file:line when it would reach gpujob's home or
    a system directory (agent/base/ckpaths.py); None without train.checkpoint."""
    ck = spec.train.checkpoint
    if ck is None:
        return None
    wd = spec.workdir or f"work/{spec.name}"
    workdir = wd if wd.startswith("~") else remote_dest(home, wd)
    why = ckpaths.refusal(ck.path, workdir if workdir.startswith("/") else None, home)
    if why:
        from gpujob.yamlsrc import describe
        raise SpecError(spec.source_name, spec.line_of(("train", "checkpoint", "path")),
                        "train.checkpoint.path", f"{describe(ck.path)} refused: {why}")
    return ck.path if ck.path.startswith("/") or not workdir.startswith("/") else f"{workdir}/{ck.path}"


def copy_note(spec: JobSpec, values: dict, resume_from: str | None) -> str:
    """The train step's note on --resume-from's copy into this job's own checkpoint place, for
    a trainer that resumes from a fixed one (agent/base/ckpaths.py fixed_place)."""
    ck = spec.train.checkpoint
    if resume_from is None or ck is None or not ckpaths.fixed_place(ck.path, spec.train.resume_args):
        return ""
    return (f": its checkpoint copied into this job's {substitute(ck.path, values)} first (the resume_args "
            "load from there)")


def build_plan(spec: JobSpec, target: Target, job_id: str, profile: str, fleet: dict | None = None,
               resume_from: str | None = None) -> list[Step]:
    """Every step ``submit`` takes, with the exact argv of each remote command."""
    ck_where = checkpoint_where(spec, target.home)
    steps: list[Step] = [Step("warning", "laptop", w) for w in checkpoint.warnings(spec.to_agent_dict())]
    steps += [Step("warning", "laptop", w) for w in selfload.plan_warnings(spec)]
    steps += [Step("note", "laptop", n) for n in spec.common_requirements()[1]]
    steps += layer_steps(spec)
    steps += target.driver.plan_connect(target)
    steps.append(Step("probe", "container", "probe the container (python3, uv, disk, GPUs)",
                      (agent_shown(target, "probe"))))
    steps.append(Step("ship_agent", "container", f"ship the gpujob agent ({target.agent_path})",
                      [target.python, "-c", "<write stdin to file>", target.agent_path],
                      when="if that agent version is not there yet"))
    if target.driver.ships_uv:
        steps.append(Step("ship_uv", "container", f"ship uv to {target.home}/bin/uv",
                          (agent_shown(target, "put", f"{target.home}/bin/uv", "--mode", "755")),
                          when="if the container has no uv"))
    sources = sync_sources(spec, strict=False)
    dests = [s.dest for s in sources]
    if dests:
        steps.append(Step("manifest", "container",
                          "which of the files to ship are there already (their names on stdin)",
                          (agent_shown(target, "manifest", "--name", spec.name,
                                                 *(["--workdir", spec.workdir] if spec.workdir else []),
                                                 *dests))))
    home = target.home
    wd = spec.workdir or f"work/{spec.name}"
    workdir = wd if wd.startswith("~") else remote_dest(home, wd)  # ~: the container's, expanded there
    sync_note = ", ".join(f"{s.src} -> {remote_dest(workdir, s.dest)}"
                          + (f"/{s.name}" if s.name else "")
                          + ("" if s.src.exists() else " [MISSING: submit will refuse]")
                          for s in sources) or "no code to ship"
    steps[:0] = [Step("warning", "laptop", w) for w in cmdfiles.plan_warnings(spec, sources)]
    steps.append(Step("submit", "container",
                      f"take the container lock, unpack changed files ({sync_note}), start the "
                      f"supervisor detached", (agent_shown(target, "submit"))))
    # what the supervisor then runs in the container
    secrets_env.resolve(spec)  # an unset variable or unreadable file fails the plan as it would the submit
    req = job_request(spec, job_id, profile, clear_caches=spec.caches.clear_on_submit,
                      env_passthrough=target.env_passthrough, fleet=fleet)
    refs = secrets_env.secret_refs(spec)
    if refs:
        steps.append(Step("secrets", "container", "write the secret values to the job's own 0600 "
                          "secrets.json (read by the supervisor, removed when the job ends; a webhook's once "
                          "the job's last messages are out): " + ", ".join(
                              f"{name}={secrets_env.MASK} ({ref.describe()})" for _, name, ref in refs)))
    prof = next(p for p in req.spec["profiles"] if p["name"] == profile)
    venv = envs.env_dir(home, prof["env_key"])
    for argv in planshare.env_build_commands(prof, venv, target.python, uv="uv", home=home, spec=req.spec):
        if argv[1:3] == ["-c", envs.LINK_BASE_SCRIPT]:
            argv = [argv[0], "-c", "<link the base interpreter's site-packages: _gpujob_base.pth>", argv[3]]
        steps.append(Step("env", "supervisor", f"build venv {prof['env_key']}", argv,
                          when="if the profile's venv is not installed yet"))
    verify = envs.verify_command(venv, prof)
    verify[2] = "<verify: installed versions, torch.__version__, torch.version.cuda>"
    steps.append(Step("env", "supervisor", "verify the installed pins", verify, when="after a build"))
    if spec.caches.clear_on_submit:
        steps.append(Step("caches", "supervisor", f"clear {envs.cache_dir(home, prof['env_key'])}"))
    else:
        steps.append(Step("caches", "supervisor", f"restore the newest snapshot {home}/snapshots/"
                          f"{prof['env_key']}/ into {envs.cache_dir(home, prof['env_key'])}",
                          when="if the profile is known-good and its live cache is empty (cleared)"))
    keep = ", ".join(target.env_passthrough) or "none (hosts.yaml: env_passthrough)"
    steps.append(Step("env", "supervisor", "job environment: the container's login environment "
                      f"(bash -l from env -i), pass-through {keep}, the spec's env, the profile's "
                      "env, the cache variables, the venv first on PATH"))
    values = planshare.template_values(req.spec, job_id=job_id, profile=profile, workdir=workdir, fleet=fleet)
    warmup = spec.warmup
    if warmup is not None:  # (warmup_gpus is [] without one)
        for gpu in planshare.warmup_gpus(req.spec):
            visible = planshare.warmup_env(gpu).get("CUDA_VISIBLE_DEVICES")
            steps.append(Step("warmup", "supervisor",
                              "warmup"
                              + (f" with CUDA_VISIBLE_DEVICES={visible}" if visible is not None else "")
                              + (f", its scratch folder {workdir.rstrip('/')}/{warmup.scratch} emptied first "
                                 "(warmup.scratch)" if warmup.scratch else ""),
                              command_argv(req.spec["warmup"]["command"],
                                           planshare.template_values(req.spec, job_id=job_id, profile=profile,
                                                                     workdir=workdir, fleet=fleet, gpu=gpu)),
                              when={"cold": "unless a warmup of this command"
                                            + (" (less warmup.ignore_flags)" if warmup.ignore_flags else "")
                                            + " and profile succeeded before (marker in the profile's cache)",
                                    "never": "never", "always": ""}[warmup.when]))
    hang_note = ""
    if spec.throughput is not None and spec.throughput.start_timeout is not None:
        hang_note = (f"; no throughput sample within {spec.throughput.start_timeout:g}s of its start is a "
                     f"start_hang (a compile_race on a cold cache): its Python stacks are saved, then it is "
                     f"ended")
    resume_args = list(req.spec["train"].get("resume_args") or [])
    steps.append(Step("train", "supervisor", "train (own process group; caches in "
                      f"{envs.cache_dir(home, prof['env_key'])}{hang_note})"
                      + (f", resuming on purpose from {resume_from} (submit --resume-from)" if resume_from
                         else "") + copy_note(spec, values, resume_from),
                      command_argv(req.spec["train"]["command"], values,
                                   [a.replace("{resume_from}", f"<{resume_from}>") for a in resume_args]
                                   if resume_from else ())))
    steps += checkpoint_steps(spec, ck_where, values, resume_args)
    if spec.train.standby is not None:
        from gpujob.agent.base.placeholders import command_script
        preload = ", ".join(spec.train.standby.preload) or "nothing"
        script = command_script(spec.train.command)
        if script is None:  # Train's validator refuses a standby whose command is not `python SCRIPT`
            raise TypeError("train.standby: train.command is not a python script")
        steps.append(Step("standby", "supervisor",
                          f"while training on a profile a rollback would leave: an interpreter of the "
                          f"known-good rollback target, in its venv, imports {preload} and waits; a rollback "
                          f"runs the trainer in it as `python {shlex.join(script)}` "
                          "(+ resume_args)",
                          ["<rollback target's venv>/bin/python", "-c", "<standby: preload, wait on "
                           "standby.fifo, run the script as __main__>"],
                          when="when a known-good, installed rollback target exists"))
    for i, hook in enumerate(req.spec.get("notify") or []):
        steps.append(Step("notify", "supervisor",
                          f"post to {planshare.describe(i, hook)} from the container's "
                          f"outbox (its own sender; {hook['timeout']:g}s an attempt, {hook['retries']} "
                          f"retries with backoff, given up {hook['deadline']:g}s after it was queued)",
                          when="on " + ", ".join(hook["events"])))
    if spec.metrics is not None:
        where = planshare.textfile_path(f"{home}/jobs/{job_id}", job_id, spec.metrics.textfile)
        steps.append(Step("metrics", "supervisor", f"write the job's gauges to {where} (Prometheus text "
                          "format, temp file + rename)", when=f"at most every {spec.metrics.every:g}s while "
                          "samples come, and on each state change"))
    return steps


def checkpoint_steps(spec: JobSpec, where: str | None, values: dict, resume_args: list) -> list[Step]:
    """What the plan says about checkpoints: the register, earlier jobs' files, and
    the argv of a resumed trainer ({resume_from} filled with this job's checkpoint)."""
    ck = spec.train.checkpoint
    if where is None or ck is None:  # where is None exactly when ck is (checkpoint_where)
        return []
    done = (f"its file {ck.done_file} exists in it and nothing in it has changed for {ck.settle:g}s"
            if ck.done_file else f"it has not changed for {ck.settle:g}s")
    steps = [Step("checkpoints", "supervisor", f"watch {where} (glob + stat, every 0.5s) and record in the "
                  "checkpoint register which checkpoints each trainer run wrote; one is finished when "
                  f"{done}; a stop or rollback that finds a save in progress waits up to "
                  f"{ck.save_wait:g}s for it"),
             Step("checkpoints", "container",
                  f"checkpoints that earlier jobs left under {where} are listed by submit; they stay as they "
                  f"are (a trainer that writes the same name overwrites them), "
                  f"{selfload.earlier_note(spec.recipe, spec.train.command).split(' (gpujob submit')[0]}, "
                  "and gc removes only what this job's runs wrote",
                  when="at submit")]
    if spec.rollback.wait_for_checkpoint:
        fallback = ("an automatic rollback waits until the running trainer has written a finished checkpoint "
                    f"(at most {checkpoint.hold_limit(ck.every):g}s)")
    else:
        fallback = "without a checkpoint of this job the trainer restarts from scratch, without resume_args"
    shown = [a.replace("{resume_from}", "<newest finished checkpoint of this job>") for a in resume_args]
    steps.append(Step("resume", "supervisor",
                      f"a resumed trainer (rollback, restart) gets resume_args; {fallback}",
                      command_argv(spec.train.command if isinstance(spec.train.command, str)
                                   else list(spec.train.command), values, shown),
                      when="on a rollback or restart"))
    return steps
