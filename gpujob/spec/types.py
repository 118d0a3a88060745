"""The job spec's value types (stdlib + pydantic): durations, rates, sizes, GPU
lists, pinned packages, URLs, commands, secret references and their one-line
errors. Used by the spec's sections (spec.py, spec_notify.py)."""

from __future__ import annotations

import math
import posixpath
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, StringConstraints, ValidationInfo

from gpujob.agent.base.placeholders import is_shell_c, quoted_placeholders
from gpujob.agent.base.protocol import FailureSignal
from gpujob.agent.base import wire
from gpujob.yamlsrc import At, Strict, control_char, describe, kind_of, shorten

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
        if key == "from_file" and control_char(ref):
            raise At((key,), f"a path cannot hold a control character (found {control_char(ref)})")
        if key == "from_env" and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ref):
            raise At((key,), "expected a variable name matching [A-Za-z_][A-Za-z0-9_]*")
        if key == "from_env":
            return SecretRef.model_construct(from_env=ref)
        return SecretRef.model_construct(from_file=ref)
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
    from gpujob.spec.reqfiles import requirement
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
Name = Annotated[str, StringConstraints(pattern=f"^{wire.PROFILE_NAME.pattern}$")]  # the agent's rule too
JobName = Annotated[str, StringConstraints(pattern=f"^{wire.JOB_NAME.pattern}$")]  # the agent's rule too
GroupName = Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_]*$")]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Env = dict[EnvName, Annotated[str | SecretRef, BeforeValidator(_env_value)]]
GpuList = Annotated[list[int], BeforeValidator(_gpu_list)]
Pinned = Annotated[str, BeforeValidator(_pinned)]
Url = Annotated[str, BeforeValidator(_url)]
Cuda = Annotated[str, BeforeValidator(_cuda)]
Command = Annotated[str | list[str], BeforeValidator(_command)]
Args = Annotated[list[str], BeforeValidator(_args)]
if TYPE_CHECKING:  # a Literal built at run time; to a type checker, a str
    Signal = str
else:
    # rollback.on etc.: protocol.FailureSignal's names
    Signal = Literal[tuple(s.value for s in FailureSignal)]


def _path_text(value: Any) -> Any:
    """A path (laptop or container side): any string without control characters.
    Other types go on to the field's own check."""
    if isinstance(value, str):
        bad = control_char(value)
        if bad:
            raise ValueError(f"cannot hold a control character (found {bad}): it would reach a shell "
                             "or a file in the container")
    return value


PathText = Annotated[str, BeforeValidator(_path_text)]


def _inside_workdir(v: str) -> str:
    """warmup.scratch: a folder inside the workdir (``NAME/...`` or ``{workdir}/NAME/...``),
    kept relative."""
    rel = v[len("{workdir}/"):] if v.startswith("{workdir}/") else v
    if rel.startswith("/") or "{" in rel or any(p in ("", ".", "..") for p in rel.split("/")):
        raise ValueError(f"expected a folder inside the workdir (relative, or {{workdir}}/NAME; no '.', "
                         f"'..' or other placeholders), got {v!r}")
    return rel


ScratchPath = Annotated[str, BeforeValidator(_path_text), AfterValidator(_inside_workdir)]


def _local_path(info: ValidationInfo, path: str) -> Path:
    """A laptop-side path from the spec: relative to the spec file's directory."""
    return Path((info.context or {}).get("spec_dir", ".")) / Path(path).expanduser()


def _interpreter(value: Any) -> Any:
    if not (isinstance(value, str) and value.strip() and not control_char(value)):
        raise ValueError(f"expected an interpreter path or name like /opt/torch/bin/python3, got "
                         f"{describe(value)}")
    return value


Interpreter = Annotated[str, BeforeValidator(_interpreter)]


def remote_dest(workdir: str, dest: str) -> str:
    """Where a sync dest lands in the container (relative dests start at the workdir)."""
    return posixpath.normpath(posixpath.join(workdir, dest))
