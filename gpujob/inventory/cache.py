"""The validated inventory, remembered for the cold ``exec`` (gpujob/daemon/oneshot.py):
stdlib only, so a cold command whose hosts.yaml is unchanged imports neither pydantic nor
yaml (~90 ms of its ~130 ms of imports on a quiet machine).

A hit needs the very bytes that were validated: the cache's key is a hash of the whole
hosts.yaml as read now, gpujob's code stamp (conn/paths.py: which gpujob, which Python; a
changed model or check is another key) and VERSION. Anything else (an edited file, another
gpujob, a cache file unreadable, not ours, not private, not what we wrote) is a miss, and
a miss is the full check: those same bytes read once here and validated by
gpujob.inventory.hosts's pydantic models, every check of theirs (control characters, names,
kinds, bounds) as on every other command, then the result written for the next time.

What is kept is ``Inventory.model_dump(mode="json")`` of the validated model, and a hit
gives :class:`View`: the same attributes with the same values (every field is text, a
number, a list or a mapping; tests/unit/test_invcache.py holds this for every field), and
``resolve`` is the model's own (gpujob/inventory/names.py). Checks that are not the inventory's
(host keys, ~/.ssh/config, the container's home) happen after it, the same both ways.

The files live in the private runtime dir of the kept connection (conn/paths.py: 0700,
ours, checked, no planted link followed), one per inventory path and gpujob
(``inv-HASH.json``, 0600), written by mkstemp + rename; read with O_NOFOLLOW and checked
to be a regular file of ours, private, before its contents are believed.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from typing import TYPE_CHECKING, Any, cast

from gpujob.inventory import names as invnames

if TYPE_CHECKING:
    from gpujob.inventory.hosts import Inventory

VERSION = 1
#: what is read of hosts.yaml (yamlsrc.MAX_FILE_BYTES; a larger one is refused there)
MAX_BYTES = 1 << 20
#: a cache file larger than this is not ours
MAX_CACHE_BYTES = 4 << 20
#: cache files of other inventories or gpujobs unused this long go when one is written
STALE_AFTER = 7 * 86400


class _Fields:
    """A validated model's fields as plain attributes."""

    def __init__(self, data: dict):
        self.__dict__.update(data)


class View:
    """A validated inventory as the attributes gpujob.inventory.hosts.Inventory has (for the
    cold exec: hosts, each with its fields and containers, and resolve/targets)."""

    def __init__(self, data: dict, source: str):
        self.hosts = {name: _Fields(dict(h, containers={c: _Fields(v) for c, v in h["containers"].items()}))
                      for name, h in data["hosts"].items()}
        self._source = source

    @property
    def source(self) -> str:
        return self._source

    def targets(self) -> list[tuple[str, str]]:
        return invnames.targets(self.hosts)

    def resolve(self, target: str):
        return invnames.resolve(self.hosts, self._source, target, _embedded_note)


def _embedded_note() -> str:
    from gpujob.inventory.hosts import no_inventory_note  # (pydantic: only for a target not found)
    return no_inventory_note()


def _read_hosts(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(MAX_BYTES + 1)


def key_of(raw: bytes, stamp: str) -> str:
    h = hashlib.sha256(f"gpujob-inventory-cache:{VERSION}:{len(stamp)}:{stamp}:".encode())
    h.update(raw)
    return h.hexdigest()


def _file_for(where: str, path: str, stamp: str) -> str:
    name = hashlib.sha256(f"{VERSION}\0{stamp}\0{path}".encode()).hexdigest()[:24]
    return os.path.join(where, f"inv-{name}.json")


def _load_cached(file: str, key: str) -> dict | None:
    """The inventory data cached in ``file`` under ``key``, or None (absent, or anything
    about it not as we write it)."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077 \
                or st.st_size > MAX_CACHE_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            got = json.loads(f.read(MAX_CACHE_BYTES + 1))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if not isinstance(got, dict) or got.get("version") != VERSION or got.get("key") != key:
        return None
    data = got.get("inventory")
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), dict):
        return None
    return data


def _store(where: str, file: str, key: str, data: dict) -> None:
    """Write the cache file (mkstemp in the same private dir, then rename): a process
    killed on the way leaves at most a ``.inv-*.tmp`` that nothing reads."""
    import tempfile
    from gpujob.agent.base.proc import die_here
    _prune(where)
    fd, tmp = tempfile.mkstemp(prefix=".inv-", suffix=".tmp", dir=where)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"version": VERSION, "key": key, "inventory": data}, f)
        die_here("invcache_written")
        os.replace(tmp, file)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _prune(where: str) -> None:
    """Cache files (and a killed writer's temp files) nobody used for STALE_AFTER seconds."""
    import time
    now = time.time()
    try:
        with os.scandir(where) as it:
            for e in it:
                if (e.name.startswith("inv-") and e.name.endswith(".json")) or \
                        (e.name.startswith(".inv-") and e.name.endswith(".tmp")):
                    st = e.stat(follow_symlinks=False)
                    if now - max(st.st_mtime, st.st_atime) > (STALE_AFTER if e.name[0] != "." else 60):
                        os.unlink(e.path)
    except OSError:
        pass


def load(path: str) -> Inventory:
    """The inventory in ``path`` (absolute), validated: from the cache when these bytes
    were validated before by this gpujob, else validated now (SpecError as
    gpujob.inventory.hosts.load_inventory raises it) and cached. The returned View stands in
    for the model (the same attributes)."""
    from gpujob.conn import paths
    raw = _read_hosts(path)
    stamp = paths.code_stamp()
    key = key_of(raw, stamp)
    try:
        where: str | None = paths.runtime_dir(create=True)
    except paths.NoDaemon:
        where = None
    file = _file_for(where, path, stamp) if where else None
    data = _load_cached(file, key) if file else None
    if data is not None:
        try:
            return cast("Inventory", View(data, path))
        except (KeyError, TypeError, AttributeError):
            pass  # not the shape we write: validated afresh below
    from pathlib import Path

    from gpujob.inventory.hosts import load_inventory
    inventory = load_inventory(Path(path), raw=raw)
    if where and file:
        try:
            _store(where, file, key, inventory.model_dump(mode="json"))
        except OSError:
            pass  # no cache this time: the next cold command validates again
    return inventory


def view_of(inventory: Any, source: str) -> View:
    """What a later hit gives for ``inventory`` (the tests compare the two)."""
    return View(json.loads(json.dumps(inventory.model_dump(mode="json"))), source)
