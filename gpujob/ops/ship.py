"""Shipping code, the pure parts: which local files a spec's sync entries send, and which of
them changed against the container's manifest (ops/submit.py sends them as tar streams)."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import NamedTuple

from gpujob.errors import InputError
from gpujob.spec.model import JobSpec


def excluded(rel: str, patterns: list[str]) -> bool:
    """A pattern matches the relative path or any one of its components."""
    parts = rel.split("/")
    return any(fnmatch.fnmatch(rel, p) or any(fnmatch.fnmatch(part, p) for part in parts)
               for p in patterns)


def local_manifest(src: Path, exclude: list[str], name: str | None = None) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime seconds)} of the files to ship from ``src``; a
    single file is listed under ``name`` (its name on the far side)."""
    if src.is_file():
        st = src.stat()
        return {name or src.name: (st.st_size, int(st.st_mtime))}
    out = {}
    for dirpath, dirs, files in os.walk(src):
        rel_dir = os.path.relpath(dirpath, src)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirs[:] = sorted(d for d in dirs if not excluded(rel_dir + d, exclude))
        for name in sorted(files):
            rel = rel_dir + name
            p = os.path.join(dirpath, name)
            if excluded(rel, exclude) or not os.path.isfile(p) or os.path.islink(p):
                continue
            st = os.stat(p)
            out[rel] = (st.st_size, int(st.st_mtime))
    return out


def changed(local: dict, remote: dict) -> list[str]:
    """Files whose size or mtime differ on the far side (or that are missing there)."""
    return [rel for rel, (size, mtime) in local.items()
            if tuple(remote.get(rel, ())) != (size, mtime)]


class Source(NamedTuple):
    src: Path          # on the laptop
    dest: str          # directory on the far side (relative to the workdir, or absolute)
    exclude: list[str]
    name: str | None   # a single file's name on the far side


def sync_sources(spec: JobSpec, *, strict: bool = True) -> list[Source]:
    """One Source per sync entry; a missing source is an input error raised before
    anything changes on the remote side (``strict``)."""
    out = []
    for i, entry in enumerate(spec.sync):
        src = (spec.spec_dir / Path(entry.src).expanduser()).resolve()
        if strict and not src.exists():
            raise InputError(f"{spec.source_path}: sync[{i}].src: no such file or directory: {src}")
        dest = entry.dest
        if dest is None:  # Sync's validator sets it at load; only a Sync built around it has none
            raise TypeError(f"sync[{i}].dest: not set")
        if src.is_file() and dest == ".":  # a file missing at load, there now: into the workdir
            dest = src.name
        if src.is_file():  # a single file lands at dest: its directory, and its name there
            out.append(Source(src, os.path.dirname(dest) or ".", list(entry.exclude), os.path.basename(dest)))
        else:
            out.append(Source(src, dest, list(entry.exclude), None))
    return out
