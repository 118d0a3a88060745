"""The job spec (jobs/*.yaml): what to ship, which wheel profiles to try, how to
warm up and train, how to judge throughput and when to roll back."""

from __future__ import annotations

import hashlib
import json
import posixpath
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BeforeValidator, Field, PrivateAttr, StringConstraints, ValidationInfo,
                      model_validator)

from gpujob.agent.base.placeholders import FLEET_KEYS, PLACEHOLDER
from gpujob.errors import InputError
from gpujob.yamlsrc import At, Strict, describe, shorten, suggest
from gpujob.spec import reqfiles
from gpujob.spec.notify import Metrics, Webhook
from gpujob.spec.recipes.registry import RECIPES
from gpujob.spec.checkpoint import Checkpoint, check_checkpoint_use
from gpujob.spec.throughput import Throughput  # noqa: F401 (specdefaults imports it from here)
from gpujob.agent.base.protocol import UNFIXABLE, FailureSignal as F
from gpujob.spec.types import (Args, Command, Cuda, Duration, Env, EnvName, GpuList, GroupName, Interpreter,
                               JobName, Name, PathText, Pinned, Requirement, ScratchPath, SecretRef, Signal,
                               Size, Url, _env_value, _local_path, remote_dest)


def _is_file(path) -> bool:
    """A file now (a name too long, a loop or no access: not one; submit says what is wrong)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


class Sync(Strict):
    src: PathText  # laptop path, relative to the spec's directory; checked at submit
    dest: PathText | None = None  # relative to workdir, or absolute; default: basename of src (set at load)
    exclude: list[PathText] = [".git", "__pycache__"]

    @model_validator(mode="after")
    def _default_dest(self, info: ValidationInfo) -> Sync:
        if self.dest is None:
            self.dest = _local_path(info, self.src).resolve().name
            if not self.dest:
                raise At(("dest",), f"missing (required): cannot be derived from src {describe(self.src)}")
        if "\x00" in self.dest or not self.dest.strip():
            raise At(("dest",), f"expected a path, got {describe(self.dest)}")
        dest = posixpath.normpath(self.dest)
        into = self.dest.endswith("/") or dest == "."  # "into this folder", as cp and rsync read it
        if into and dest != "/" and _is_file(_local_path(info, self.src)):
            dest = posixpath.join(dest, _local_path(info, self.src).resolve().name) if dest != "." \
                else _local_path(info, self.src).resolve().name
        if dest == "/":
            raise At(("dest",), "'/' is the container's root; name a directory under it")
        self.dest = dest
        return self


class Profile(Strict):
    name: Name
    index_url: Url | None = None  # required when the profile installs anything
    extra_index_urls: list[Url] = []
    find_links: list[Url] = []  # flat folders or pages of wheels (pip's and uv's --find-links)
    packages: list[Pinned] = []  # at least one, unless system_site_packages
    requirements: PathText | None = None  # laptop path of a requirements file, relative to the spec
    env: Env = {}
    cuda: Cuda | None = None
    python: Interpreter | None = None  # in the container; None: the agent's interpreter
    system_site_packages: bool = False  # the venv sees python's packages (its own still win)

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Profile:
        if self.requirements is not None and not _local_path(info, self.requirements).is_file():
            raise At(("requirements",), f"no such file: {_local_path(info, self.requirements)}")
        if not self.packages and not self.system_site_packages:
            raise At(("packages",), "expected at least one pinned package "
                                    "(or system_site_packages: true to use the base interpreter's)")
        if self.index_url is None and (self.packages or self.requirements):
            raise At(("index_url",), "missing (required when the profile installs packages)")
        return self


class Caches(Strict):
    per_profile: bool = True
    clear_on_submit: bool = False
    snapshots_keep: int = Field(1, ge=0, le=100)  # snapshots of a known-good cache kept; 0: none


class Warmup(Strict):
    command: Command  # a string runs with `bash -c` in the workdir; a list is an argv
    per_gpu: str | None = None  # a GPU group: one warmup per GPU of it
    timeout: Duration = 3600.0
    when: Literal["cold", "always", "never"] = "cold"
    # flags that change nothing compiled (`--flag V`, `--flag=V`, `key=V`): the cache stays warm
    ignore_flags: list[Annotated[str, StringConstraints(pattern=r"^-{0,2}[A-Za-z_][A-Za-z0-9_.-]*$")]] = []
    scratch: ScratchPath | None = None  # a folder in the workdir, emptied before each warmup run


class Restarts(Strict):
    """Restart the trainer on the same profile after a transient failure, like
    torchrun's --max-restarts; a crash loop ends the job."""
    max: int = Field(3, ge=0, le=1000)
    within: Duration = 3600.0
    on: list[Signal] = [F.CRASH.value, F.NCCL_TIMEOUT.value, F.HW_ERROR.value]

    @model_validator(mode="after")
    def _fixable(self) -> Restarts:
        for i, signal in enumerate(self.on):
            if signal in UNFIXABLE:
                raise At(("on", i), f"'{signal}' cannot be fixed by a restart on the same wheels")
        return self


class Standby(Strict):
    """Keep an interpreter of the rollback target preloaded (see agent/supervisor/standby.py)."""
    preload: list[Annotated[str, StringConstraints(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")]] = ["torch"]


class Train(Strict):
    command: Command
    checkpoint: Checkpoint | None = None
    resume_args: Args = []
    timeout: Duration | None = None
    grace: Duration = 30.0
    restarts: Restarts | None = None
    standby: Standby | None = None

    @model_validator(mode="after")
    def _standby_runs_python(self) -> Train:
        from gpujob.agent.base.placeholders import command_script
        if self.standby is not None and command_script(self.command) is None:
            raise At(("standby",), "needs train.command to be `python SCRIPT ...` or `python -m MODULE ...` "
                     "(no shell syntax): the standby interpreter runs that script")
        return self


class GpuIdle(Strict):
    group: str | None = None  # None: all GPUs of gpus
    below: float = Field(5.0, ge=0, le=100)  # percent utilisation
    for_: Duration = Field(300.0, alias="for")


class Rollback(Strict):
    enabled: bool = True
    max_rollbacks: int = Field(2, ge=0, le=1_000)
    fallback: list[str] = []
    on: list[Signal] = [F.LOW_THROUGHPUT.value, F.STALL.value, F.ERROR_SIGNATURE.value, F.CUDA_OOM.value,
                        F.START_HANG.value, F.COMPILE_RACE.value]
    stop_on: list[Signal] = []
    error_signatures: list[str] = ["is_fx_symbolic_tracing",
                                   "Detected that you are using FX to symbolically trace"]
    signature_grace: Duration = 10.0  # a process still running this long after a signature is stuck
    gpu_idle: GpuIdle | None = None
    wait_for_checkpoint: bool = False  # hold an automatic rollback until train.checkpoint exists
    confirm: Duration = Field(120.0, ge=0)  # the target holds >= threshold this long: the left profile is bad
    on_no_recovery: Literal["continue", "stop"] = "continue"  # target as slow: go on unjudged, or end

    @model_validator(mode="after")
    def _consistent(self) -> Rollback:
        for i, signal in enumerate(self.stop_on):
            if signal in self.on:
                raise At(("stop_on", i), f"'{signal}' is also in rollback.on")
        watched = F.GPU_IDLE in self.on + self.stop_on
        if watched and self.gpu_idle is None:
            raise At((), "the gpu_idle signal needs a gpu_idle block")
        if self.gpu_idle is not None and not watched:
            raise At(("gpu_idle",), "'gpu_idle' is in neither rollback.on nor rollback.stop_on")
        return self


class Journal(Strict):
    """How much of a long job's journal is kept in the container."""
    keep_log: Size = Field(256 << 20, ge=1 << 20, le=1 << 40)  # per log: older bytes are freed
    full_rate_samples: Duration = Field(3600.0, ge=60)  # then one summary a minute


def _targets(value: Any) -> Any:
    if isinstance(value, list):
        if not 2 <= len(value) <= 64:
            raise ValueError(f"expected 2 to 64 containers in a multi-node target, got {len(value)}")
        for i, name in enumerate(value):
            if not isinstance(name, str) or not name.strip():
                raise At((i,), f"expected a container name or host/name, got {describe(name)}")
            if name in value[:i]:
                raise At((i,), f"'{shorten(name, 60)}' is listed twice")
    return value


def _plain_env(value: Any) -> Any:
    value = _env_value(value)
    if isinstance(value, SecretRef):
        raise ValueError("a per-node value cannot be a secret (put secrets in env)")
    return value


class Nodes(Strict):
    """A multi-node job (target: a list): how node losses are treated, and each node's own env."""
    on_loss: Literal["end", "wait"] = "end"  # a node gone: end the job, or the leader waits for it
    lost_after: Duration = 60.0  # a node silent this long (supervisor and channel gone) is lost
    start_timeout: Duration = 900.0  # a node held at the start gives up when no go comes (a submit cut off)
    env: list[dict[EnvName, Annotated[str, BeforeValidator(_plain_env)]]] = []  # one per node, in order

    @model_validator(mode="after")
    def _positive(self) -> Nodes:
        for field in ("lost_after", "start_timeout"):
            if getattr(self, field) <= 0:
                raise At((field,), "expected a duration > 0")
        return self


class JobSpec(Strict):
    # recipes.py
    recipe: Literal["specforge", "hf_trainer", "nanogpt", "torchtitan", "lightning"] | None = None
    name: JobName
    target: Annotated[str | list[str] | None, BeforeValidator(_targets)] = None  # a list: multi-node
    nodes: Nodes | None = None  # multi-node only
    workdir: PathText | None = None  # in the container; None: <gpujob home>/work/<name>
    sync: list[Sync] = []
    env: Env = {}
    gpus: dict[GroupName, GpuList] = {}
    requirements: list[Requirement] = []  # strings, or {file, exclude}: gpujob/spec/reqfiles.py
    profiles: list[Profile] = Field(min_length=1)
    profile: str | None = None  # None at load -> the first profile
    caches: Caches = Field(default_factory=Caches)
    warmup: Warmup | None = None
    train: Train
    throughput: Throughput | None = None
    rollback: Rollback = Field(default_factory=Rollback)
    journal: Journal = Field(default_factory=Journal)
    resume_after_reboot: bool = False  # a boot hook in the container brings the job back
    notify: list[Webhook] = []  # webhooks the supervisor posts to (rollback, failure, success, known_good)
    metrics: Metrics | None = None  # a Prometheus textfile of the job's gauges; None: none written
    _source_path: Path | None = PrivateAttr(None)
    _lines: dict = PrivateAttr(default_factory=dict)
    _source_name: str = PrivateAttr("spec")  # the path as the user gave it, for errors
    _layers: dict = PrivateAttr(default_factory=dict)  # {"recipe": {key: value}, "sets": [(key, old, new)]}

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        names = [p.name for p in self.profiles]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise At(("profiles", i, "name"), f"duplicate profile name '{name}'")
        self.profile = self.profile or names[0]
        self._check_profile(("profile",), self.profile)
        for i, name in enumerate(self.rollback.fallback):
            self._check_profile(("rollback", "fallback", i), name)
        owner: dict[int, str] = {}
        for group, indices in self.gpus.items():
            for i, index in enumerate(indices):
                if index in owner:
                    raise At(("gpus", group, i), f"GPU {index} is already in group '{owner[index]}'")
                owner[index] = group
        restarts = self.train.restarts.on if self.train.restarts else []
        for i, signal in enumerate(restarts):
            for where, listed in (("rollback.on", self.rollback.on),
                                  ("rollback.stop_on", self.rollback.stop_on)):
                if signal in listed:
                    raise At(("train", "restarts", "on", i), f"'{signal}' is also in {where}")
        for i, entry in enumerate(self.sync):
            dest = entry.dest
            if dest is None:  # Sync's validator has set it
                raise TypeError(f"sync[{i}].dest: not set")
            if dest == ".." or dest.startswith("../"):
                where = remote_dest(self.workdir, dest) if self.workdir and self.workdir.startswith("/") \
                    else f"<workdir>/{dest}"
                raise At(("sync", i, "dest"), f"{describe(dest)} resolves to {shorten(where)}, outside "
                         "the workdir; give an absolute path to write outside it")
        self._check_group(("warmup", "per_gpu"), self.warmup.per_gpu if self.warmup else None)
        self._check_group(("throughput", "scope_group"),
                          self.throughput.scope_group if self.throughput else None)
        self._check_group(("rollback", "gpu_idle", "group"),
                          self.rollback.gpu_idle.group if self.rollback.gpu_idle else None)
        if self.rollback.wait_for_checkpoint and self.train.checkpoint is None:
            raise At(("rollback", "wait_for_checkpoint"), "needs train.checkpoint (path and every)")
        check_checkpoint_use(self)  # {resume_from}, the glob within the workdir
        self._check_fleet()
        return self

    @property
    def multi_node(self) -> bool:
        return isinstance(self.target, list)

    def _check_fleet(self) -> None:
        """Multi-node keys only with a list target, and each node's env for every node."""
        if isinstance(self.target, list):  # multi_node
            if self.nodes is not None and self.nodes.env and len(self.nodes.env) != len(self.target):
                raise At(("nodes", "env"), f"expected one entry per node ({len(self.target)}), "
                         f"got {len(self.nodes.env)}")
            return
        if self.nodes is not None:
            raise At(("nodes",), "only for a multi-node job (target: a list of containers)")
        if self.throughput is not None and "aggregate" in self.throughput.model_fields_set:
            raise At(("throughput", "aggregate"), "only for a multi-node job (target: a list of containers)")
        texts = [(("train", "command"), self.train.command)]
        if self.warmup:
            texts.append((("warmup", "command"), self.warmup.command))
        for loc, command in texts:
            for text in [command] if isinstance(command, str) else command:
                found = [m.group(1) for m in PLACEHOLDER.finditer(text) if m.group(1) in FLEET_KEYS]
                if found:
                    raise At(loc, f"{{{found[0]}}} is only for a multi-node job (target: a list of "
                             "containers)")

    def _check_profile(self, loc: tuple, name: str) -> None:
        names = [p.name for p in self.profiles]
        if name not in names:
            raise At(loc, f"'{name}' is not a profile; profiles: {', '.join(names)}")

    def _check_group(self, loc: tuple, group: str | None) -> None:
        if group is not None and group not in self.gpus:
            hint = suggest(group, self.gpus) if self.gpus else " (gpus defines no groups)"
            raise At(loc, f"no GPU group '{group}' in gpus{hint}")

    def line_of(self, loc: tuple) -> int | None:
        """The spec file's line of a field (or of its nearest parent), when loaded from one."""
        loc = tuple(loc)
        while loc and loc not in self._lines:
            loc = loc[:-1]
        return self._lines.get(loc)

    @property
    def source_name(self) -> str:
        return self._source_name

    @property
    def source_path(self) -> Path | None:
        return self._source_path

    @property
    def spec_dir(self) -> Path:
        """Where relative laptop paths (sync src, requirements files) start."""
        return self._source_path.parent if self._source_path else Path.cwd()

    def profile_by_name(self, name: str) -> Profile:
        for profile in self.profiles:
            if profile.name == name:
                return profile
        names = [p.name for p in self.profiles]
        raise InputError(f"unknown profile '{name}'; profiles: {', '.join(names)}{suggest(name, names)}")

    def requirements_text(self, profile_name: str) -> str | None:
        """The content of the profile's requirements file, if it has one."""
        path = self.profile_by_name(profile_name).requirements
        return (self.spec_dir / Path(path).expanduser()).read_text(encoding="utf-8") if path else None

    def env_key(self, profile_name: str) -> str:
        """`<profile>-<hash12>`: changes whenever what goes into the profile's venv changes."""
        profile = self.profile_by_name(profile_name)
        content: dict[str, Any] = {
            "index_url": profile.index_url,
            "extra_index_urls": profile.extra_index_urls,
            "packages": sorted(profile.packages),
            "requirements_file": self.requirements_text(profile_name),
            "requirements": sorted(r for r in self.requirements if isinstance(r, str)),
        }
        if any(isinstance(r, dict) for r in self.requirements):  # older keys stay as they were
            content.update(requirements_files=self.common_requirements()[0])
            content.update({"no_deps": d} if (d := reqfiles.no_deps(self)) else {})
        if profile.python or profile.system_site_packages:  # older keys stay as they were
            content.update(python=profile.python, system_site_packages=profile.system_site_packages)
        if profile.find_links:
            content.update(find_links=profile.find_links)
        return f"{profile.name}-{_sha256(content)[:12]}"

    def common_requirements(self, strict: bool = False) -> tuple[list[str], list[str]]:
        """(what every venv gets besides its pins, notes): files read (reqfiles.expand)."""
        from gpujob.spec.reqfiles import expand
        return expand(self, strict)

    def to_agent_dict(self) -> dict:
        """Plain JSON for the supervisor; each profile also gets env_key and requirements_text."""
        data = self.model_dump(mode="json", by_alias=True)
        data["requirements"] = self.common_requirements()[0]
        data["requirements_no_deps"] = reqfiles.no_deps(self)
        if self.recipe:  # job.json records the recipe's own version: a newer gpujob's is visible
            data["recipe_info"] = RECIPES[self.recipe].info()
        for profile in data["profiles"]:
            profile["env_key"] = self.env_key(profile["name"])
            profile["requirements_text"] = self.requirements_text(profile["name"])
        return data


def _sha256(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def spec_hash(spec: JobSpec) -> str:
    return _sha256(spec.model_dump(mode="json", by_alias=True))[:16]


def load_spec(path: str | Path, sets: list | tuple = (), profile: str | None = None) -> JobSpec:
    """Load and validate a job spec; SpecError (path:line: field: message) when it is wrong.
    ``sets``: `--set KEY=VALUE` items applied first, then the spec's recipe (speclayers.py);
    ``profile``: the one submit --profile names, in place of the spec's own."""
    from gpujob.spec.layers import load
    return load(JobSpec, Path(path), list(sets), profile)
