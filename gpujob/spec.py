"""The job spec (jobs/*.yaml): what to ship, which wheel profiles to try, how to
warm up and train, how to judge throughput and when to roll back."""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import re
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BeforeValidator, Field, PrivateAttr, StringConstraints, ValidationInfo,
                      model_validator)

from gpujob.agent.commands import FLEET_KEYS, PLACEHOLDER, is_shell_c, quoted_placeholders
from gpujob.errors import InputError
from gpujob.yamlsrc import At, Strict, describe, kind_of, load_yaml, shorten, suggest

_NUMBER = r"(\d+(?:\.\d+)?)"
_DURATION = re.compile(rf"(?:{_NUMBER}h)?(?:{_NUMBER}m)?(?:{_NUMBER}s)?")
_RATE = re.compile(rf"{_NUMBER}\s*([kKmM]?)")
_PINNED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._, -]*\])?==[A-Za-z0-9.+!_-]+")


MAX_DURATION = 365 * 86400.0  # a year: longer is a typo (or an overflow) not a plan
MAX_RATE = 1e12  # tokens/s
MAX_GPU = 1023


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        (isinstance(value, int) or math.isfinite(value))


def _duration(value: Any) -> float:
    """90, '90s', '10m', '1h30m' -> seconds (at most a year)."""
    seconds = None
    if _is_number(value) and value >= 0:
        seconds = value
    match = _DURATION.fullmatch(value.strip()) if isinstance(value, str) and len(value) < 100 else None
    if match and any(match.groups()):
        hours, minutes, secs = (float(part or 0) for part in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if seconds is None:
        raise ValueError(f"expected a duration like 90s, 10m or 1h30m, got {describe(value)}")
    if seconds > MAX_DURATION:
        raise ValueError(f"expected a duration of at most 365 days, got {describe(value)}")
    return float(seconds)


def _rate(value: Any) -> float:
    """12800, '12.8K', '1.2M' -> tokens/s."""
    rate = None
    if _is_number(value):
        rate = value
    match = _RATE.fullmatch(value.strip()) if isinstance(value, str) and len(value) < 100 else None
    if match:
        rate = float(match[1]) * {"": 1, "k": 1e3, "m": 1e6}[match[2].lower()]
    if rate is None:
        raise ValueError(f"expected a number, got {describe(value)}")
    if rate > MAX_RATE:
        raise ValueError(f"expected a rate of at most 1e12 tokens/s, got {describe(value)}")
    return float(rate)


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?B)?")


def _size(value: Any) -> int:
    """1048576, '256M', '256MiB', '1G' -> bytes (binary units)."""
    if _is_number(value) and value >= 0:
        return int(value)
    match = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    if not match:
        raise ValueError(f"expected a size like 256M or 1G, got {describe(value)}")
    scale = 1024 ** ("kmgt".find(match[2].lower()) + 1) if match[2] else 1
    return int(float(match[1]) * scale)



class SecretRef(Strict):
    """An env value read at submit by the CLI (never written in the spec): from the
    laptop's environment or from a file. It travels over stdin and lives in the
    container only in the job's 0600 secrets file."""

    from_env: str | None = None
    from_file: str | None = None

    def describe(self) -> str:
        return f"from ${self.from_env}" if self.from_env else f"from {self.from_file}"


def _env_value(value: Any) -> Any:
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("a NUL character cannot be in an environment value")
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, dict):
        keys = sorted(map(str, value))
        if keys not in (["from_env"], ["from_file"]):
            raise ValueError("expected a string, or a mapping with one key, from_env or from_file; "
                             f"got the keys {', '.join(shorten(k, 30) for k in keys) or 'none'}")
        key, ref = next(iter(value.items()))
        if not isinstance(ref, str) or not ref.strip():
            raise At((key,), f"expected {'a variable name' if key == 'from_env' else 'a file path'}, "
                             f"got {kind_of(ref)}")
        if key == "from_env" and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ref):
            raise At((key,), "expected a variable name matching [A-Za-z_][A-Za-z0-9_]*")
        return SecretRef.model_construct(**{key: ref})
    raise ValueError(f"expected a string, number or boolean, got {kind_of(value)}")


def _gpu_list(value: Any) -> Any:
    if not isinstance(value, list):
        raise ValueError(f"expected a list of GPU indices, got {describe(value)}")
    for i, index in enumerate(value):
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= MAX_GPU:
            raise At((i,), f"expected a GPU index (an integer from 0 to {MAX_GPU}), got {describe(index)}")
        if index in value[:i]:
            raise At((i,), f"GPU {index} is listed twice")
    return value


def _pinned(value: Any) -> Any:
    if not (isinstance(value, str) and _PINNED.fullmatch(value)):
        raise ValueError(f"expected a pinned requirement like torch==2.11.0+cu128, got {describe(value)}")
    return value


def _requirement(value: Any) -> Any:
    from gpujob.reqfiles import requirement
    return requirement(value)


Requirement = Annotated[Any, BeforeValidator(_requirement)]


def _url(value: Any) -> Any:
    if not (isinstance(value, str) and value.startswith(("http://", "https://", "file:"))):
        raise ValueError(f"expected an http(s):// or file: URL, got {describe(value)}")
    return value


def _cuda(value: Any) -> str:
    """'12.8', 12.8, 13 -> 'MAJOR.MINOR'."""
    text = {int: f"{value}.0", float: str(value)}.get(type(value), value)  # not bool: type() is exact
    if not (isinstance(text, str) and re.fullmatch(r"\d+\.\d+", text)):
        raise ValueError(f'expected a CUDA version like "12.8", got {describe(value)}')
    return text


def _unquoted(script: str) -> None:
    quoted = quoted_placeholders(script)
    if quoted:
        raise ValueError(f"drop the quotes around {quoted[0]}: gpujob quotes every value it "
                         "substitutes into a shell command (it is also in $GPUJOB_"
                         f"{quoted[0][1:-1].replace('.', '_').upper()})")


def _command(value: Any) -> Any:
    if isinstance(value, str) and value.strip():
        _unquoted(value)
        return value
    if isinstance(value, list) and value and all(isinstance(arg, str) for arg in value):
        if is_shell_c(value):
            _unquoted(value[2])
        return value
    raise ValueError(f"expected a command (a string or a list of strings), got {describe(value)}")


def _args(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return shlex.split(value)
    except ValueError as exc:
        raise ValueError(f"cannot split {describe(value)} into arguments: {exc}") from None


Duration = Annotated[float, BeforeValidator(_duration)]
Size = Annotated[int, BeforeValidator(_size)]
Rate = Annotated[float, BeforeValidator(_rate), Field(gt=0)]
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
JobName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,39}$")]
GroupName = Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_]*$")]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Env = dict[EnvName, Annotated[str | SecretRef, BeforeValidator(_env_value)]]
GpuList = Annotated[list[int], BeforeValidator(_gpu_list)]
Pinned = Annotated[str, BeforeValidator(_pinned)]
Url = Annotated[str, BeforeValidator(_url)]
Cuda = Annotated[str, BeforeValidator(_cuda)]
Command = Annotated[str | list[str], BeforeValidator(_command)]
Args = Annotated[list[str], BeforeValidator(_args)]
Signal = Literal["low_throughput", "stall", "error_signature", "cuda_oom", "oom_killed", "crash", "gpu_idle",
                 "nccl_timeout", "hw_error", "driver_mismatch"]
UNFIXABLE = ("driver_mismatch",)  # a restart on the same wheels cannot help: the host changed


def _local_path(info: ValidationInfo, path: str) -> Path:
    """A laptop-side path from the spec: relative to the spec file's directory."""
    return Path((info.context or {}).get("spec_dir", ".")) / Path(path).expanduser()


class Sync(Strict):
    src: str  # laptop path, relative to the spec's directory; checked at submit
    dest: str | None = None  # relative to workdir, or absolute; default: basename of src (set at load)
    exclude: list[str] = [".git", "__pycache__"]

    @model_validator(mode="after")
    def _default_dest(self, info: ValidationInfo) -> Sync:
        if self.dest is None:
            self.dest = _local_path(info, self.src).resolve().name
            if not self.dest:
                raise At(("dest",), f"missing (required): cannot be derived from src {describe(self.src)}")
        if "\x00" in self.dest or not self.dest.strip():
            raise At(("dest",), f"expected a path, got {describe(self.dest)}")
        dest = posixpath.normpath(self.dest)
        if dest == "/":
            raise At(("dest",), "'/' is the container's root; name a directory under it")
        self.dest = dest
        return self


def _interpreter(value: Any) -> Any:
    if not (isinstance(value, str) and value.strip() and "\n" not in value):
        raise ValueError(f"expected an interpreter path or name like /opt/torch/bin/python3, got {describe(value)}")
    return value


Interpreter = Annotated[str, BeforeValidator(_interpreter)]


def remote_dest(workdir: str, dest: str) -> str:
    """Where a sync dest lands in the container (relative dests start at the workdir)."""
    return posixpath.normpath(posixpath.join(workdir, dest))


class Profile(Strict):
    name: Name
    index_url: Url | None = None  # required when the profile installs anything
    extra_index_urls: list[Url] = []
    find_links: list[Url] = []  # flat folders or pages of wheels (pip's and uv's --find-links)
    packages: list[Pinned] = []  # at least one, unless system_site_packages
    requirements: str | None = None  # laptop path of a requirements file, relative to the spec
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


class Restarts(Strict):
    """Restart the trainer on the same profile after a transient failure, like
    torchrun's --max-restarts; a crash loop ends the job."""
    max: int = Field(3, ge=0, le=1000)
    within: Duration = 3600.0
    on: list[Signal] = ["crash", "nccl_timeout", "hw_error"]

    @model_validator(mode="after")
    def _fixable(self) -> Restarts:
        for i, signal in enumerate(self.on):
            if signal in UNFIXABLE:
                raise At(("on", i), f"'{signal}' cannot be fixed by a restart on the same wheels")
        return self


class Checkpoint(Strict):
    path: str  # glob, relative to the workdir: the trainer's checkpoint files
    every: Duration  # how often the trainer writes one

    @model_validator(mode="after")
    def _positive(self) -> Checkpoint:
        if self.every <= 0:
            raise At(("every",), "expected a duration > 0")
        if not self.path.strip():
            raise At(("path",), "expected a glob like ckpt/step_*.pt")
        return self


class Standby(Strict):
    """Keep an interpreter of the rollback target preloaded (see agent/standby.py)."""
    preload: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")]] \
        = ["torch"]


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
        from gpujob.agent.standby import command_script
        if self.standby is not None and command_script(self.command) is None:
            raise At(("standby",), "needs train.command to be `python SCRIPT ...` or `python -m MODULE ...` "
                     "(no shell syntax): the standby interpreter runs that script")
        return self


class Throughput(Strict):
    source: Literal["stdout", "file"] = "stdout"  # the trainer's output lines, or a JSONL metrics file
    format: Literal["ktok", "torchtitan", "tqdm", "hf", "regex"] | None = None  # for source stdout
    path: str | None = None  # source file: the JSONL file the trainer appends to (relative: the workdir)
    field: str | None = None  # source file: the tok/s field of each record ("a.b" reaches into objects)
    step_field: str | None = None  # source file: the step field, if the records carry one
    pattern: str | None = None
    tokens_per_step: float | None = Field(None, gt=0, le=1e12)
    scope: Literal["total", "per_gpu"] = "total"
    scope_group: str | None = None
    initial_delay: Duration = 0.0
    resume_initial_delay: Duration | None = None  # instead, for a known-good profile resumed
    initial_delay_samples: int = Field(0, ge=0, le=1_000_000)
    window: int = Field(5, ge=1, le=10_000)
    min: Rate | None = None
    min_ratio: float | None = Field(None, gt=0, le=1)
    failure_limit: int = Field(3, ge=1, le=10_000)
    no_data_timeout: Duration | None = 600.0  # null: no stall detection
    good_after: Duration = 600.0
    aggregate: Literal["sum", "min"] = "sum"  # multi-node: the nodes' latest tok/s summed, or the slowest

    @model_validator(mode="after")
    def _consistent(self) -> Throughput:
        if self.source == "file":
            for field in ("path", "field"):
                if not (getattr(self, field) or "").strip():
                    raise At((field,), "missing (required) for source file")
            for field in ("format", "pattern", "tokens_per_step"):
                if getattr(self, field) is not None:
                    raise At((field,), "only for source stdout (a metrics file's records are read by field)")
        else:
            if self.format is None:
                raise At(("format",), "missing (required) for source stdout")
            for field in ("path", "field", "step_field"):
                if getattr(self, field) is not None:
                    raise At((field,), "only for source file")
        for field, fmts in (("pattern", ("regex",)), ("tokens_per_step", ("tqdm", "regex"))):
            given = getattr(self, field) is not None
            if self.format == fmts[0] and not given:
                raise At((field,), f"missing (required) for format {fmts[0]}")
            if self.format not in fmts and given:
                raise At((field,), f"only for format {' or '.join(fmts)}")
        for field in ("no_data_timeout", "good_after"):
            value = getattr(self, field)
            if value is not None and value <= 0:
                raise At((field,), "expected a duration > 0" +
                         (" (or null to turn stall detection off)" if field == "no_data_timeout" else ""))
        if self.pattern is not None:
            try:
                groups = re.compile(self.pattern).groupindex
            except re.error as exc:
                raise At(("pattern",), f"not a valid regex: {exc}") from None
            if "value" not in groups:
                raise At(("pattern",), "needs a named group (?P<value>...)")
        if self.scope_group is not None and self.scope != "per_gpu":
            raise At(("scope_group",), "only for scope per_gpu")
        if self.min is None and self.min_ratio is None:
            raise At((), "needs min, min_ratio or both")
        return self


class GpuIdle(Strict):
    group: str | None = None  # None: all GPUs of gpus
    below: float = Field(5.0, ge=0, le=100)  # percent utilisation
    for_: Duration = Field(300.0, alias="for")


class Rollback(Strict):
    enabled: bool = True
    max_rollbacks: int = Field(2, ge=0, le=1_000)
    fallback: list[str] = []
    on: list[Signal] = ["low_throughput", "stall", "error_signature", "cuda_oom"]
    stop_on: list[Signal] = []
    error_signatures: list[str] = ["is_fx_symbolic_tracing",
                                   "Detected that you are using FX to symbolically trace"]
    signature_grace: Duration = 10.0  # a process still running this long after a signature is stuck
    gpu_idle: GpuIdle | None = None
    wait_for_checkpoint: bool = False  # hold an automatic rollback until train.checkpoint exists

    @model_validator(mode="after")
    def _consistent(self) -> Rollback:
        for i, signal in enumerate(self.stop_on):
            if signal in self.on:
                raise At(("stop_on", i), f"'{signal}' is also in rollback.on")
        watched = "gpu_idle" in self.on + self.stop_on
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


NotifyEvent = Literal["rollback", "failure", "success", "known_good"]


def _webhook_url(value: Any) -> Any:
    """A webhook URL: http(s) written in the spec, or a secret reference (from_env,
    from_file) when the URL holds a token (Slack's does, in its path)."""
    if isinstance(value, dict):
        return _env_value(value)
    if not (isinstance(value, str) and value.startswith(("http://", "https://"))):
        got = "a string that does not start with http:// or https://" if isinstance(value, str) else kind_of(value)
        raise ValueError(f"expected an http(s):// URL or {{from_env: VAR}} / {{from_file: PATH}}, got {got} "
                         "(not echoed: it may hold a token)")
    if "@" in value.split("/", 3)[2]:
        raise ValueError("this URL holds credentials (user:pass@): give it as a secret, "
                         "{from_env: VAR} or {from_file: PATH}, so it stays out of job.json and logs")
    return value


def _token(value: Any) -> Any:
    if not isinstance(value, dict):
        raise ValueError("a token is a secret: give it as {from_env: VAR} or {from_file: PATH}")
    return _env_value(value)


class Webhook(Strict):
    """One webhook the supervisor posts to (agent/notify.py)."""
    url: Annotated[str | SecretRef, BeforeValidator(_webhook_url)]
    format: Literal["slack", "ntfy", "json"] = "json"
    token: Annotated[SecretRef, BeforeValidator(_token)] | None = None  # sent as Authorization: Bearer
    events: list[NotifyEvent] = ["rollback", "failure", "success", "known_good"]
    timeout: Duration = 10.0  # per attempt
    retries: int = Field(5, ge=0, le=20)  # after the first attempt, with backoff 1 s, 2 s, 4 s ... (60 s at most)

    @model_validator(mode="after")
    def _consistent(self) -> Webhook:
        for i, event in enumerate(self.events):
            if event in self.events[:i]:
                raise At(("events", i), f"'{event}' is listed twice")
        if not self.events:
            raise At(("events",), "expected at least one of rollback, failure, success, known_good")
        if not 0 < self.timeout <= 300:
            raise At(("timeout",), "expected a duration > 0 and at most 5m")
        return self


def _prom_path(value: Any) -> Any:
    if not (isinstance(value, str) and value.endswith(".prom") and "\x00" not in value and "\n" not in value):
        raise ValueError(f"expected a path ending in .prom (node_exporter's textfile collector reads only "
                         f"those), got {describe(value)}")
    return value


class Metrics(Strict):
    """Prometheus gauges for node_exporter's textfile collector (agent/metrics.py)."""
    textfile: Annotated[str, BeforeValidator(_prom_path)] = "metrics.prom"  # relative: the job dir
    every: Duration = Field(10.0, ge=1)  # at most one rewrite this often while samples come


class JobSpec(Strict):
    name: JobName
    target: Annotated[str | list[str] | None, BeforeValidator(_targets)] = None  # a list: multi-node
    nodes: Nodes | None = None  # multi-node only
    workdir: str | None = None  # in the container; None: <gpujob home>/work/<name>
    sync: list[Sync] = []
    env: Env = {}
    gpus: dict[GroupName, GpuList] = {}
    requirements: list[Requirement] = []  # strings, or {file, exclude}: gpujob/reqfiles.py
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
            for where, listed in (("rollback.on", self.rollback.on), ("rollback.stop_on", self.rollback.stop_on)):
                if signal in listed:
                    raise At(("train", "restarts", "on", i), f"'{signal}' is also in {where}")
        for i, entry in enumerate(self.sync):
            if entry.dest == ".." or entry.dest.startswith("../"):
                where = remote_dest(self.workdir, entry.dest) if self.workdir and self.workdir.startswith("/") \
                    else f"<workdir>/{entry.dest}"
                raise At(("sync", i, "dest"), f"{describe(entry.dest)} resolves to {shorten(where)}, outside "
                         "the workdir; give an absolute path to write outside it")
        self._check_group(("warmup", "per_gpu"), self.warmup and self.warmup.per_gpu)
        self._check_group(("throughput", "scope_group"), self.throughput and self.throughput.scope_group)
        self._check_group(("rollback", "gpu_idle", "group"), self.rollback.gpu_idle and self.rollback.gpu_idle.group)
        if self.rollback.wait_for_checkpoint and self.train.checkpoint is None:
            raise At(("rollback", "wait_for_checkpoint"), "needs train.checkpoint (path and every)")
        self._check_fleet()
        return self

    @property
    def multi_node(self) -> bool:
        return isinstance(self.target, list)

    def _check_fleet(self) -> None:
        """Multi-node keys only with a list target, and each node's env for every node."""
        if self.multi_node:
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
        content = {
            "index_url": profile.index_url,
            "extra_index_urls": profile.extra_index_urls,
            "packages": sorted(profile.packages),
            "requirements_file": self.requirements_text(profile_name),
            "requirements": sorted(r for r in self.requirements if isinstance(r, str)),
        }
        if any(isinstance(r, dict) for r in self.requirements):  # older keys stay as they were
            content.update(requirements_files=self.common_requirements()[0])
        if profile.python or profile.system_site_packages:  # older keys stay as they were
            content.update(python=profile.python, system_site_packages=profile.system_site_packages)
        if profile.find_links:
            content.update(find_links=profile.find_links)
        return f"{profile.name}-{_sha256(content)[:12]}"

    def common_requirements(self, strict: bool = False) -> tuple[list[str], list[str]]:
        """(what every venv gets besides its pins, notes): files read (reqfiles.expand)."""
        from gpujob.reqfiles import expand
        return expand(self, strict)

    def to_agent_dict(self) -> dict:
        """Plain JSON for the supervisor; each profile also gets env_key and requirements_text."""
        data = self.model_dump(mode="json", by_alias=True)
        data["requirements"] = self.common_requirements()[0]
        for profile in data["profiles"]:
            profile["env_key"] = self.env_key(profile["name"])
            profile["requirements_text"] = self.requirements_text(profile["name"])
        return data


def _sha256(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def spec_hash(spec: JobSpec) -> str:
    return _sha256(spec.model_dump(mode="json", by_alias=True))[:16]


def load_spec(path: str | Path) -> JobSpec:
    """Load and validate a job spec; SpecError (path:line: field: message) when it is wrong."""
    path = Path(path)
    source = load_yaml(path)
    spec = source.validate(JobSpec, context={"spec_dir": path.parent})
    spec._source_path = path.absolute()
    spec._lines = source.lines
    spec._source_name = str(path)
    return spec
