"""Top-level ``requirements:`` entries that name a requirements file on the laptop
(``{file: ../SpecForge/requirements.txt, exclude: [torchaudio]}``), as a project
such as SpecForge publishes it, instead of copying its lines into the spec.

The file is read on the laptop (relative paths start at the spec's folder) and its
requirement lines join the plain entries: every profile's venv gets them, with the
profile's pins held as constraints. Lines naming a package that a profile pins
(torch, torchvision: the profile decides the build) and those named in
``exclude`` are left out, and the plan says so. The content counts in the venv's
key, so an edited file builds a new venv. A missing file is a note in the plan
and an error at submit, as a missing ``sync`` source is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpujob.errors import SpecError
from gpujob.yamlsrc import At, control_char, kind_of

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def norm(name: str) -> str:
    """A package name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement(value: Any) -> Any:
    """A ``requirements:`` entry: a requirement string, or {file, exclude}."""
    if isinstance(value, str):
        if not value.strip() or control_char(value):
            raise ValueError("expected a requirement like transformers==4.57.1 (one line, no control "
                             "characters)")
        return value
    if isinstance(value, dict) and "package" in value:  # {package: specforge==0.2.0, no_deps: true}
        unknown = sorted(set(map(str, value)) - {"package", "no_deps"})
        if unknown:
            raise At((unknown[0],), "unknown field; expected package and no_deps")
        if not isinstance(value["package"], str) or not _NAME.match(value["package"].strip()):
            raise At(("package",),
                     f"expected a requirement like specforge==0.2.0, got {kind_of(value['package'])}")
        if value.get("no_deps") is not True:
            raise At(("no_deps",), "expected true (without it, write the requirement as a plain string)")
        return {"package": value["package"].strip(), "no_deps": True}
    if isinstance(value, dict):
        unknown = sorted(set(map(str, value)) - {"file", "exclude"})
        if unknown:
            raise At((unknown[0],), "unknown field; expected file and exclude")
        if not isinstance(value.get("file"), str) or not value["file"].strip():
            raise At(("file",), f"expected the path of a requirements file, got {kind_of(value.get('file'))}")
        if control_char(value["file"]):
            raise At(("file",),
                     f"a path cannot hold a control character (found {control_char(value['file'])})")
        exclude = value.get("exclude", [])
        if not isinstance(exclude, list):
            raise At(("exclude",), f"expected a list of package names, got {kind_of(exclude)}")
        for i, name in enumerate(exclude):
            if not (isinstance(name, str) and _NAME.fullmatch(name)):
                raise At(("exclude", i), f"expected a package name, got {kind_of(name)}")
        return {"file": value["file"], "exclude": list(exclude)}
    raise ValueError("expected a requirement string, {file: PATH, exclude: [...]} or {package: REQ, no_deps: "
                     f"true}}, got {kind_of(value)}")


def no_deps(spec) -> list[str]:
    """The ``{package: REQ, no_deps: true}`` entries: installed after the others with
    ``--no-deps`` (a wheel whose declared dependencies the job does not import, such as
    specforge's sglang==0.5.14), the profile's pins still held as constraints."""
    return [e["package"] for e in spec.requirements if isinstance(e, dict) and "package" in e]


def _pin_name(pin: str) -> str:
    """The package name a profile's pin starts with (spec_types checks every pin at load)."""
    m = _NAME.match(pin)
    if m is None:
        raise ValueError(f"{pin!r}: not a pinned requirement")
    return m.group(0)


def expand(spec, strict: bool) -> tuple[list[str], list[str]]:
    """(the requirement strings every venv gets, notes for the plan). ``strict``
    (submit): a missing or unusable file is a SpecError with its line."""
    pinned = {norm(_pin_name(p)) for prof in spec.profiles for p in prof.packages}
    out, notes = [], []
    for i, entry in enumerate(spec.requirements):
        if isinstance(entry, str):
            out.append(entry)
            continue
        if "package" in entry:  # no_deps(): a step of its own
            continue
        where = (spec.source_name, spec.line_of(("requirements", i, "file")), f"requirements[{i}].file")
        path = (spec.spec_dir / Path(entry["file"]).expanduser()).resolve()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            why = "no such file" if isinstance(e, FileNotFoundError) else "cannot read"
            if strict:
                raise SpecError(*where, f"{why}: {path}") from None
            notes.append(f"requirements[{i}]: {why}: {path} (submit refuses until it exists; "
                         "the venv key below counts it empty)")
            continue
        excluded = {norm(n) for n in entry["exclude"]}
        left = []
        for n, raw in enumerate(text.splitlines(), 1):
            line = re.split(r"\s+#", raw, maxsplit=1)[0].strip()
            if not line or line.startswith("#"):
                continue
            m = _NAME.match(line)
            if line.startswith("-") or not m:
                if strict:
                    raise SpecError(*where, f"{path}:{n}: only requirement lines are read, got {line[:60]!r}")
                notes.append(f"requirements[{i}]: {path}:{n}: {line[:60]!r} is not a requirement line "
                             "(submit refuses)")
                continue
            name = norm(m.group(0))
            if name in pinned or name in excluded:
                left.append(line)
                continue
            out.append(line)
        if left:
            notes.append(f"requirements[{i}]: from {path}, left out {', '.join(left)} (the profiles pin "
                         "those packages, or exclude names them)")
    return out, notes
