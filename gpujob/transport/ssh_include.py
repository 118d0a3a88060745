"""``~/.ssh/config`` read without OpenSSH (no ``ssh`` on PATH): paramiko's parser, which
keeps ``Include`` as an unknown keyword, fed a text in which every ``Include`` has been
replaced by the files it names, as OpenSSH reads them (ssh_config(5)):

- a path that is not absolute and does not start with ``~`` is relative to ``~/.ssh``
  (for the user's config, whatever its own folder); ``~`` is this process's $HOME;
- a glob names its files in sorted order; one that names none is no error;
- an included file's lines belong to the block the ``Include`` stands in, and a ``Host``
  or ``Match`` inside it applies only where that block applied too (OpenSSH's NEVERMATCH):
  the two conditions become one ``Match originalhost A,B originalhost C,D``;
- after the included file, the block the ``Include`` stood in goes on;
- at most 16 levels (OpenSSH's READCONF_MAX_DEPTH); deeper is a one-line InputError.

:func:`config_files` names every file (and every folder a glob looked in) that a lookup
may depend on: the daemon watches them to know when a kept connection is stale."""

from __future__ import annotations

import glob
import os
import re
import shlex
from pathlib import Path

from gpujob.errors import InputError

MAX_DEPTH = 16
_KEY = re.compile(r"\s*(\w+)(?:\s*=\s*|\s+)(.*?)\s*$")


def _include_paths(value: str, where: str) -> list[str]:
    try:
        words = shlex.split(value)
    except ValueError:
        raise InputError(f"{where}: Include {value!r}: unbalanced quotes") from None
    found: list[str] = []
    for word in words:
        path = os.path.expanduser(word) if word.startswith("~") else word
        if not os.path.isabs(path):
            path = os.path.join(os.path.expanduser("~/.ssh"), path)
        found.extend(sorted(glob.glob(path)) if glob.has_magic(path) else [path])
    return found


def _glob_dirs(value: str) -> list[str]:
    dirs = []
    for word in value.split():
        path = os.path.expanduser(word) if word.startswith("~") else word
        if not os.path.isabs(path):
            path = os.path.join(os.path.expanduser("~/.ssh"), path)
        if glob.has_magic(path):
            dirs.append(os.path.dirname(path))
    return dirs


def _condition(key: str, value: str) -> list[str]:
    """A Host or Match line as Match words ([] for ``Match all``)."""
    if key == "host":
        return ["originalhost", ",".join(shlex.split(value))]
    words = shlex.split(value)
    return [] if words == ["all"] else words


def _header(words: list[str]) -> str:
    return "Match " + " ".join(shlex.quote(w) for w in words) if words else "Host *"


def expand(path: Path, out: list[str], files: list[str], *, outer: list[str] | None = None,
           depth: int = 0) -> None:
    """Append ``path``'s lines to ``out``, Includes replaced by their files' lines; ``outer``:
    the Match words of the block the Include stood in (None: the top of the user's file)."""
    if depth > MAX_DEPTH:
        raise InputError(f"{path}: Include nested more than {MAX_DEPTH} levels deep (a loop?)")
    files.append(str(path))
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return  # an Include of a file that is not there is no error (OpenSSH: the same)
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read this ssh config file ({e})") from None
    current = list(outer or [])
    for number, line in enumerate(text.splitlines(), 1):
        m = _KEY.match(line)
        if not m or line.lstrip().startswith("#"):
            out.append(line)
            continue
        key, value = m.group(1).lower(), m.group(2)
        if key in ("host", "match"):
            try:
                current = list(outer or []) + _condition(key, value)
            except ValueError:
                raise InputError(f"{path}:{number}: {key} {value!r}: unbalanced quotes") from None
            out.append(line if outer is None else _header(current))
        elif key == "include":
            files.extend(_glob_dirs(value))
            for inc in _include_paths(value, f"{path}:{number}"):
                expand(Path(inc), out, files, outer=current, depth=depth + 1)
            out.append(_header(current))  # back to the block the Include stood in
        else:
            out.append(line)


def read(path: Path):
    """paramiko's SSHConfig of ``path`` with its Includes followed, and the files it read."""
    from gpujob.lazyimport import paramiko as _paramiko
    paramiko = _paramiko()
    out: list[str] = []
    files: list[str] = []
    expand(path, out, files)
    try:
        return paramiko.SSHConfig.from_text("\n".join(out) + "\n"), files
    except Exception as e:  # paramiko's ConfigParseError and its kin
        raise InputError(f"{path}: cannot parse this ssh config ({e})") from None


def config_files(path: Path) -> list[str]:
    """Every file and glob folder a lookup in ``path`` may read (what the daemon watches)."""
    files: list[str] = []
    try:
        expand(path, [], files)
    except InputError:
        pass  # the lookup itself says what is wrong
    return list(dict.fromkeys(files))
