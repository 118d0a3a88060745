"""The offline demo's files, shipped inside the package, and the laptop-side
wheel indexes a spec names with relative ``file:`` URLs.

``gpujob/demo.yaml`` and ``gpujob/demo/`` (trainer.py, warmup.py) are the one
source; the repository's ``jobs/demo.yaml`` and ``jobs/demo`` are symlinks to
them. ``gpujob demo`` runs from any directory: it copies them to a folder of the
user's cache (an installed package may sit in a read-only site-packages) and
builds the demo's wheels beside the copy.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from gpujob.errors import SpecError

PACKAGED_SPEC = Path(__file__).parent.parent / "demo.yaml"
PACKAGED_DIR = Path(__file__).parent.parent / "demo"
FILES = ("trainer.py", "warmup.py")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "gpujob" / "demo-job"


def work_copy(dest: Path | None = None) -> Path:
    """Copy the packaged demo spec and its files to ``dest`` (default: the user's
    cache); a file is rewritten only when its bytes differ, so its mtime (what
    sync compares) stays put across runs. Returns the copy's spec path."""
    dest = dest or cache_dir()
    pairs = [(PACKAGED_SPEC, dest / "demo.yaml")] + [(PACKAGED_DIR / f, dest / "demo" / f) for f in FILES]
    for src, dst in pairs:
        data = src.read_bytes()
        if not dst.is_file() or dst.read_bytes() != data:
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, dst)
    return dest / "demo.yaml"


def relative_file_urls(spec) -> list[tuple[tuple, Path, list[str]]]:
    """(field location, laptop path, the profile's pins) of every relative ``file:``
    URL of the spec's profiles: those start at the spec's folder, on the laptop."""
    out = []
    for i, p in enumerate(spec.profiles):
        urls: list[tuple[tuple, str | None]] = [(("index_url",), p.index_url)]
        urls += [(("extra_index_urls", j), u) for j, u in enumerate(p.extra_index_urls)]
        urls += [(("find_links", j), u) for j, u in enumerate(p.find_links)]
        for loc, url in urls:
            if url and url.startswith("file:") and not url.startswith("file://"):
                out.append((("profiles", i) + loc, (spec.spec_dir / url[5:]).resolve(), list(p.packages)))
    return out


def _demo_wheelhouse(path: Path, pins: list[str]) -> Path | None:
    """The wheelhouse root when ``path`` is one of the demo's indexes
    (``<root>/<build>/simple`` of gpujob-demo-kernels only), else None."""
    from gpujob.ops.wheelhouse import BUILDS, PACKAGE
    if path.name == "simple" and path.parent.name in BUILDS and pins and \
            all(p.split("==")[0] == PACKAGE for p in pins):
        return path.parent.parent
    return None


def ensure_local_indexes(spec, progress: Callable[[str], None]) -> None:
    """Before a submit: a missing relative ``file:`` index of the demo's wheels is
    built (as ``gpujob demo`` does); any other missing one is one spec error line."""
    roots = []
    for loc, path, pins in relative_file_urls(spec):  # every error before anything is built
        if path.exists():
            continue
        root = _demo_wheelhouse(path, pins)
        if root is None:
            field = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in loc).lstrip(".")
            raise SpecError(spec.source_name, spec.line_of(loc), field, f"no such folder: {path}")
        if root not in roots:
            roots.append(root)
    for root in roots:
        from gpujob.ops.wheelhouse import build_indexes
        build_indexes(root)
        progress(f"built the demo's wheels in {root}")


def build_demo_wheels(spec) -> None:
    """``gpujob demo``: (re)build the wheelhouse its spec names (deterministic bytes)."""
    from gpujob.ops.wheelhouse import build_indexes
    roots = {r for _, path, pins in relative_file_urls(spec)
             if (r := _demo_wheelhouse(path, pins)) is not None}
    for root in roots or {spec.spec_dir / "demo" / "wheelhouse"}:
        build_indexes(root)

