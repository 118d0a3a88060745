"""Env values a spec takes from the laptop (``{from_env: VAR}``, ``{from_file: PATH}``).

They are read by the CLI process that submits, travel in the job request over the
agent's stdin (never argv), and are stored in the container only in the job's 0600
``secrets.json``; everywhere else (plan, job.json, status, events, errors) they are ``***``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpujob.errors import SpecError
from gpujob.spec.model import JobSpec, SecretRef

MASK = "***"
MAX_SECRET = 64 * 1024


def secret_refs(spec: JobSpec) -> list[tuple[tuple, str, SecretRef]]:
    """(loc, variable, reference) of every secret env value, job-level first."""
    out: list[tuple[tuple, str, SecretRef]] = [
        (("env", k), k, v) for k, v in spec.env.items() if isinstance(v, SecretRef)]
    for i, p in enumerate(spec.profiles):
        out += [(("profiles", i, "env", k), k, v) for k, v in p.env.items() if isinstance(v, SecretRef)]
    for i, hook in enumerate(spec.notify):
        out += [(("notify", i, k), f"notify[{i}].{k}", v) for k in ("url", "token")
                if isinstance(getattr(hook, k), SecretRef) for v in [getattr(hook, k)]]
    return out


def _field(loc: tuple) -> str:
    if loc[0] == "env":
        return f"env.{loc[1]}"
    if loc[0] == "notify":
        return f"notify[{loc[1]}].{loc[2]}"
    return f"profiles[{loc[1]}].env.{loc[3]}"


class _NotRegular(Exception):
    pass


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


def _read_regular(path: Path) -> bytes:
    """The first MAX_SECRET + 1 bytes of a regular file. Anything else (a FIFO that
    would block the submit forever, a device, a socket) is refused; the open itself
    never blocks (O_NONBLOCK) and the file is checked once it is open (fstat), so a
    swap between the check and the read changes nothing."""
    def check(mode: int) -> None:
        if not stat.S_ISREG(mode):
            raise _NotRegular(next((what for test, what in _KINDS if test(mode)), "not a plain file"))
    check(os.stat(path).st_mode)  # a socket cannot even be opened: say what it is
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        check(os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
        chunks, left = [], MAX_SECRET + 1
        while left:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read(spec: JobSpec, loc: tuple, ref: SecretRef) -> str:
    def fail(message: str) -> SpecError:
        return SpecError(spec.source_name, spec.line_of(loc), _field(loc), message)
    if ref.from_env is not None:
        value = os.environ.get(ref.from_env)
        if value is None:
            raise fail(f"from_env: ${ref.from_env} is not set in this shell")
        return value
    if ref.from_file is None:  # a SecretRef holds exactly one of the two (spec_types)
        raise TypeError("secret reference: neither from_env nor from_file")
    path = Path(ref.from_file).expanduser()
    if not path.is_absolute():
        path = spec.spec_dir / path
    try:
        raw = _read_regular(path)
    except OSError as e:
        raise fail(f"from_file: cannot read {path}: {e.strerror or type(e).__name__}") from None
    except _NotRegular as e:
        raise fail(f"from_file: {path} is {e}, not a regular file") from None
    if len(raw) > MAX_SECRET:
        raise fail(f"from_file: {path} is larger than {MAX_SECRET // 1024} KiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise fail(f"from_file: {path} is not UTF-8 text") from None
    text = text.rstrip("\r\n")  # `echo token > file` leaves a newline that is not part of it
    if "\0" in text:
        raise fail(f"from_file: {path} holds a NUL byte")
    return text


def _check_notify(spec: JobSpec, loc: tuple, value: str) -> None:
    """A webhook URL or token read from the laptop meets the spec's own rules (a URL
    with a newline or no host, a token that would end its header line)."""
    if loc[0] != "notify":
        return
    from gpujob.spec.notify import url_problem
    from gpujob.yamlsrc import control_char
    why = url_problem(value) if loc[2] == "url" else \
        ("a token cannot hold a control character" if control_char(value) else None)
    if why:
        raise SpecError(spec.source_name, spec.line_of(loc), _field(loc), f"{ref_of(spec, loc)}: {why} "
                        "(not echoed: it is a secret)")


def ref_of(spec: JobSpec, loc: tuple) -> str:
    hook = spec.notify[loc[1]]
    return getattr(hook, loc[2]).describe()


def resolve(spec: JobSpec) -> dict:
    """{"env": {VAR: value}, "profiles": {profile: {VAR: value}}, "notify": {index:
    {"url"|"token": value}}}; a SpecError (one line, never the value) when a variable
    is unset or a file unreadable."""
    out: dict = {"env": {}, "profiles": {}}
    for loc, name, ref in secret_refs(spec):
        value = _read(spec, loc, ref)
        _check_notify(spec, loc, value)
        if loc[0] == "notify":
            out.setdefault("notify", {}).setdefault(str(loc[1]), {})[loc[2]] = value
        elif loc[0] == "env":
            out["env"][name] = value
        else:
            out["profiles"].setdefault(spec.profiles[loc[1]].name, {})[name] = value
    return out


def mask(spec_data: dict) -> list[str]:
    """Replace every secret reference in an agent spec dict by ``***``; the names."""
    names = []
    for env in [spec_data.get("env") or {}] + [p.get("env") or {} for p in spec_data.get("profiles") or []]:
        for key, value in env.items():
            if isinstance(value, dict):
                env[key] = MASK
                names.append(key)
    for i, hook in enumerate(spec_data.get("notify") or []):
        for key in ("url", "token"):
            if isinstance(hook.get(key), dict):
                hook[key] = MASK
                names.append(f"notify[{i}].{key}")
    return sorted(set(names))


def scrub(text: str, secrets: dict) -> str:
    """``text`` with every secret value in it replaced by ``***``."""
    values = list(secrets.get("env", {}).values())
    for env in list(secrets.get("profiles", {}).values()) + list(secrets.get("notify", {}).values()):
        values += list(env.values())
    values += [secrets["fleet_key"]] if secrets.get("fleet_key") else []
    for value in sorted((v for v in values if len(v) >= 4), key=len, reverse=True):
        text = text.replace(value, MASK)
    return text
