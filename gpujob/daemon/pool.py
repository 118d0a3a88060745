"""The daemon's connections, per inventory: one ``Targets`` (SSH connections, and the
exec channel into each container) for each inventory file a request names, reused
while that file's bytes, ~/.ssh/config (and every file it includes) and every
known_hosts file it or hosts.yaml names are unchanged; otherwise a fresh one is
opened and the old one closes when its last command ends. A host whose ssh config
sets what gpujob does not honour is left to the full CLI, which says so."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from gpujob import kinds
from gpujob.errors import GpujobError
from gpujob.ops.target import Targets


class Fallback(Exception):
    """Not for the daemon (a local target): the client runs the full CLI."""


def _stat(path: Path):
    try:
        st = os.stat(path)
        return (st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        return None


class Entry:
    """One inventory's ``Targets`` and the ``Target`` of each container asked for."""

    def __init__(self, path: str | None, digest: str):
        self.path = path
        self.digest = digest
        self.inventory = self.load(path)
        self.targets = Targets(self.inventory)
        self.opened: dict = {}
        self.users = 0
        self.retired = False
        self.lock = threading.Lock()
        kept = {n: h for n, h in self.inventory.hosts.items() if kinds.get(h.kind).kept_connection}
        self.watched = [Path("~/.ssh/config").expanduser()] + sorted(
            {Path(h.known_hosts or "~/.ssh/known_hosts").expanduser() for h in kept.values()}
            | {Path(f) for n, h in kept.items() for f in kinds.get(h.kind).reach_files(n, h)})
        self.stats = [_stat(p) for p in self.watched]

    def load(self, path: str | None):
        from gpujob.inventory.hosts import load_inventory
        return load_inventory(Path(path) if path else None)

    def fresh(self, digest: str) -> bool:
        return digest == self.digest and [_stat(p) for p in self.watched] == self.stats

    def target(self, name: str):
        host_name, host, cname, _ = self.inventory.resolve(name)
        kind = kinds.get(host.kind)
        if not kind.kept_connection or kind.unhonoured(host_name, host):
            raise Fallback()  # the full CLI says each unhonoured setting on the user's stderr
        with self.lock:
            label = f"{host_name}/{cname}"
            if label not in self.opened:
                self.opened[label] = self.targets.open(label)
            return self.opened[label]

    def close(self) -> None:
        for t in self.opened.values():
            t.transport.close()
        self.targets.close()


class Pool:
    def __init__(self):
        self.entries: dict = {}
        self.lock = threading.Lock()

    def acquire(self, path: str | None) -> Entry:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else "built-in"
        with self.lock:
            entry = self.entries.get(path)
            if entry is None or not entry.fresh(digest):
                if entry is not None:
                    self._retire(entry)
                try:
                    entry = Entry(path, digest)
                except GpujobError:  # an invalid inventory: the full CLI names it in its own words
                    raise Fallback() from None
                self.entries[path] = entry
            entry.users += 1
            return entry

    def release(self, entry: Entry) -> None:
        with self.lock:
            entry.users -= 1
            if entry.retired and entry.users == 0:
                entry.close()

    def _retire(self, entry: Entry) -> None:
        entry.retired = True
        del self.entries[entry.path]
        if entry.users == 0:
            entry.close()

    def close(self) -> None:
        with self.lock:
            for entry in list(self.entries.values()):
                entry.close()
            self.entries.clear()


def prewarm(pool, inventory: str | None, target: str) -> str | None:
    """Open ``target``'s connection and its exec channel now (the command that started
    the daemon just used it), as the first request for it would: the same checks (strict
    host keys); a request for it meanwhile waits on the entry's lock instead of opening a
    second one. The line for conn.log (None: nothing to open), never an exception: the
    next request opens whatever failed here as before."""
    entry = None
    try:
        entry = pool.acquire(inventory)
        opened = entry.target(target)
        mux = getattr(opened.transport, "mux", None)  # the exec channel (no command is run)
        if callable(mux):
            mux()
        return f"connected ahead to {target}"
    except Fallback:
        return None  # not a kept-connection kind, or an inventory the CLI must name
    except Exception as e:  # noqa: BLE001 (a daemon's side thread: logged, never fatal)
        return f"could not connect ahead to {target}: {type(e).__name__}: {e}"
    finally:
        if entry is not None:
            pool.release(entry)
