"""Snapshots of a profile's compile caches (stdlib only).

A known-good profile is a wheel build *plus the compile cache it built*: when a
profile becomes known-good its live cache ``H/caches/<key>/`` is snapshotted to
``H/snapshots/<key>/<stamp>/``, and an empty (cleared) live cache is restored from
the newest snapshot before the profile starts again.

Cheap where it can be: inductor and triton write each file once (temp file, then
rename), so their files are hard-linked; torch_extensions builds in place, so it
is copied. A cache on another filesystem than the snapshots falls back to copies.

Safe when a process dies at any moment:

- a snapshot is built in ``H/snapshots/<key>/.tmp-<stamp>-<pid>/`` with its
  ``meta.json`` and renamed into place: a snapshot directory without a ``.tmp-``
  prefix is whole;
- a restore is built in ``H/caches/.restore-<key>-<pid>/`` then swapped in by two
  renames (live → ``.old-<key>-<pid>``, new → live); a death between them leaves
  no live cache and an ``.old-``, which ``recover`` renames back. Whoever looks
  next (``recover``) therefore sees the old cache or the whole new one.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time

from gpujob.agent.base.envs import CACHE_VARS, WARM_MARKER, cache_dir, tree_stats
from gpujob.agent.base.fsio import fsync_dir, read_json, write_json
from gpujob.agent.base.proc import is_alive

LINKED = ("inductor", "triton")  # written once per file: hard links are safe
COPIED = ("torch_extensions",)   # rebuilt in place: a copy
META = "meta.json"


def snap_root(home: str, key: str) -> str:
    return os.path.join(home, "snapshots", key)


def stamp_of(t: float) -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(t)) + f"{int((t % 1) * 1000):03d}Z"


def cache_files(home: str, key: str) -> int:
    """How many compile-cache files the live cache holds (the warm marker aside)."""
    base = cache_dir(home, key)
    return sum(tree_stats(os.path.join(base, sub))["files"] for sub in CACHE_VARS.values())


def _pid_of(name: str):
    try:
        return int(name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return None


def _alive(pid) -> bool:
    """The process that owns a temp dir still runs (a zombie does not)."""
    return bool(pid) and is_alive(pid)


def _clone(src: str, dst: str, link: bool) -> tuple:
    """Copy the tree ``src`` to ``dst`` (hard links when ``link``; copies where a link
    cannot be made). Returns (files, bytes, linked)."""
    files = size = linked = 0
    for root, dirs, names in os.walk(src):
        rel = os.path.relpath(root, src)
        out = dst if rel == "." else os.path.join(dst, rel)
        os.makedirs(out, exist_ok=True)
        for d in dirs:
            s = os.path.join(root, d)
            if os.path.islink(s):
                os.symlink(os.readlink(s), os.path.join(out, d))
        for n in names:
            s, d = os.path.join(root, n), os.path.join(out, n)
            if os.path.islink(s):
                os.symlink(os.readlink(s), d)
                continue
            try:
                st = os.lstat(s)
            except FileNotFoundError:  # a cache file replaced meanwhile: it is not part of it
                continue
            done = False
            if link:
                try:
                    os.link(s, d)
                    done = True
                    linked += 1
                except FileNotFoundError:
                    continue
                except OSError as e:
                    if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                        raise
            if not done:
                try:
                    shutil.copy2(s, d)
                except FileNotFoundError:
                    continue
            files += 1
            size += st.st_size
    return files, size, linked


def _fill(src_base: str, dst_base: str, link: bool = True) -> dict:
    """The three cache parts and the warm marker of ``src_base`` into ``dst_base``
    (``link=False``: copies only, for comparison)."""
    files = size = linked = 0
    for sub in CACHE_VARS.values():
        src = os.path.join(src_base, sub)
        if os.path.isdir(src):
            f, b, l = _clone(src, os.path.join(dst_base, sub), link and sub in LINKED)
            files, size, linked = files + f, size + b, linked + l
    marker = os.path.join(src_base, WARM_MARKER)
    if os.path.exists(marker):
        shutil.copy2(marker, os.path.join(dst_base, WARM_MARKER))
    return {"files": files, "bytes": size, "linked": linked}


def recover(home: str, key: str) -> list:
    """Finish what a dead process left for ``key``: an unfinished snapshot or restore
    is removed, a swap cut between its two renames is undone. Returns what it did."""
    did = []
    caches = os.path.join(home, "caches")
    live = cache_dir(home, key)
    for name in sorted(os.listdir(caches)) if os.path.isdir(caches) else []:
        for kind in (".old-", ".restore-", ".prove-"):
            if not name.startswith(f"{kind}{key}-") or _alive(_pid_of(name)):
                continue
            path = os.path.join(caches, name)
            if kind == ".old-" and not os.path.lexists(live):
                os.rename(path, live)  # the old cache was moved aside, the new one never came
                did.append(f"put back {name}")
            else:
                shutil.rmtree(path, ignore_errors=True)
                did.append(f"removed {name}")
    root = snap_root(home, key)
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        if name.startswith((".tmp-", ".trash-")) and not _alive(_pid_of(name)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            did.append(f"removed snapshots/{key}/{name}")
    return did


def listing(home: str, key: str) -> list:
    """The whole snapshots of ``key``, newest first (each its meta with ``path``)."""
    root = snap_root(home, key)
    out = []
    for name in os.listdir(root) if os.path.isdir(root) else []:
        if name.startswith("."):
            continue
        meta = read_json(os.path.join(root, name, META))
        if isinstance(meta, dict):
            out.append(dict(meta, path=os.path.join(root, name), name=name))
    return sorted(out, key=lambda m: (m.get("at", 0), m["name"]), reverse=True)


def keys(home: str) -> list:
    root = os.path.join(home, "snapshots")
    return sorted(n for n in os.listdir(root) if not n.startswith(".")) if os.path.isdir(root) else []


def take(home: str, key: str, *, keep: int = 1, t: float | None = None, link: bool = True, **info) -> dict:
    """Snapshot the live cache of ``key``; keep the newest ``keep``. Returns its meta."""
    recover(home, key)
    t = time.time() if t is None else t
    root = snap_root(home, key)
    os.makedirs(root, exist_ok=True)
    stamp = stamp_of(t)
    tmp = os.path.join(root, f".tmp-{stamp}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    t0 = time.monotonic()
    try:
        counts = _fill(cache_dir(home, key), tmp, link)
        meta = dict(info, key=key, at=t, stamp=stamp, warm=os.path.exists(os.path.join(tmp, WARM_MARKER)),
                    seconds=round(time.monotonic() - t0, 3), **counts)
        write_json(os.path.join(tmp, META), meta)
        final = os.path.join(root, stamp)
        if os.path.exists(final):  # the same millisecond twice: the older goes
            discard(final)
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(home, key, keep)
    return dict(meta, path=final, name=stamp)


def discard(path: str) -> None:
    """Remove a snapshot so that it stops counting at once (renamed away, then deleted)."""
    parent, name = os.path.split(path)
    trash = os.path.join(parent, f".trash-{name}-{os.getpid()}")
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def prune(home: str, key: str, keep: int) -> list:
    gone = []
    for meta in listing(home, key)[max(keep, 0):]:
        discard(meta["path"])
        gone.append(meta["name"])
    return gone


def restore(home: str, key: str, meta: dict | None = None, link: bool = True) -> dict | None:
    """Replace the live cache of ``key`` by a snapshot (the newest by default):
    built beside it, then swapped in. Returns the snapshot's meta with the time the
    restore took, or None when there is no snapshot."""
    recover(home, key)
    meta = meta or next(iter(listing(home, key)), None)
    if meta is None:
        return None
    caches = os.path.join(home, "caches")
    os.makedirs(caches, exist_ok=True)
    me = os.getpid()
    tmp = os.path.join(caches, f".restore-{key}-{me}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    t0 = time.monotonic()
    try:
        counts = _fill(meta["path"], tmp, link)
        with open(os.path.join(tmp, ".gpujob-restored"), "w") as f:
            json.dump({"snapshot": meta["name"], "at": time.time(), **counts}, f)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    swap(home, key, tmp)
    return dict(meta, restored=counts, restore_seconds=round(time.monotonic() - t0, 3))


def swap(home: str, key: str, new: str) -> None:
    """Put the directory ``new`` in place of the live cache of ``key``."""
    live = cache_dir(home, key)
    old = os.path.join(os.path.dirname(live), f".old-{key}-{os.getpid()}")
    if os.path.lexists(live):
        os.rename(live, old)
    # a death here: no live cache, an .old- one; recover() puts it back
    try:
        os.rename(new, live)
    except OSError:
        if os.path.lexists(old) and not os.path.lexists(live):
            os.rename(old, live)
        raise
    fsync_dir(os.path.dirname(live))
    shutil.rmtree(old, ignore_errors=True)


def describe(meta: dict) -> str:
    """``snapshot of 2026-11-30 14:02:11 UTC (1234 files, 56.7 MB)``"""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(meta.get("at", 0)))
    return f"snapshot of {when} ({meta.get('files', 0)} files, {meta.get('bytes', 0) / 1e6:.1f} MB)"


def restore_due(*, cold_start: bool, known_good: bool, live_empty: bool, snapshot) -> str | None:
    """Why the live cache should be restored before the profile starts (pure), or
    None: only a known-good profile with a snapshot whose live cache is empty (no
    file, not even a warm marker: cleared), and never when the submit asked to
    start cold."""
    if cold_start or not known_good or snapshot is None or not live_empty:
        return None
    return "the live cache is empty"


def proof_of(start: str | None, before: dict | None, env_key: str) -> str:
    """How a profile that just became known-good was proven (pure): ``cold`` when its
    cache was empty when it started (or an earlier proof of the same build was
    cold), else ``warm`` (only ever seen working on a cache built before)."""
    if before and before.get("proof") == "cold" and before.get("env_key") == env_key:
        return "cold"
    return "cold" if start == "cold" else "warm"
