"""The cold ``exec``: no daemon answers yet, so this command runs itself, but through the
daemon's own request handler (server.py) run here in a thread, not through the full CLI.
The thin client (conn/client.py) speaks to it over a socket pair exactly as it speaks to
a daemon: the same frames, our stdio as descriptors, Ctrl-C as ``K``. Output, errors and
exit codes are therefore the daemon's, which tests/bed/test_conn_contract.py holds byte for
byte to the full CLI's; what is left out is typer, its command tree and the CLI's other
command modules (about a fifth of a cold ``exec``'s CPU).

Connections are direct (``Targets`` without the kept connection), with the strict host
keys of :class:`gpujob.transport.ssh.SshTransport` (``--accept-new`` never comes this
way: the fast path does not parse it). Whatever the handler will not serve (a local
target, an inventory it cannot read, a target the inventory does not know, which the full
CLI may find among the jobs this laptop recorded) it declines before doing anything, and
the full CLI runs the command. Once it goes ahead, it asks for this environment's daemon
for the commands that follow, as the full CLI's first command on an SSH host does.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from gpujob.conn import client, paths
from gpujob.daemon import logs
from gpujob.daemon.pool import Entry, Fallback, Pool
from gpujob.errors import GpujobError, InputError


class _OwnEntry(Entry):
    """An inventory's targets for this one command: a target the inventory does not know
    goes to the full CLI (it also looks among the jobs this laptop recorded). Its
    inventory comes through gpujob/inventory/cache.py: unchanged bytes, already validated by this
    gpujob, skip pydantic and yaml."""

    def load(self, path: str | None):
        if path is None:  # (the entry sends none here: the built-in inventory is local)
            raise Fallback()
        from gpujob.inventory import cache as invcache
        return invcache.load(path)

    def target(self, name: str):
        try:
            return super().target(name)
        except InputError:
            raise Fallback() from None


class _OwnPool(Pool):
    def acquire(self, path: str | None) -> Entry:
        try:
            entry = _OwnEntry(path, "")
        except (GpujobError, OSError):  # unreadable or invalid: the full CLI says why in its own words
            raise Fallback() from None
        entry.users = 1
        self.entries[path] = entry
        return entry


def run(req: dict) -> int:
    """Run the fast path's request ``req`` (an ``exec``) here; its exit code. Raises
    client.Fallback when the full CLI should run it (nothing was done or printed)."""
    from gpujob.daemon.server import Server

    path = paths.socket_path(create=True)
    logs.to = _conn_log(path)  # the handler's own lines (a bug's traceback) to conn.log, not to us
    server = Server(Path(path), idle=0)
    server.pool = _OwnPool()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with server.lock:
        server.active += 1
    handler = threading.Thread(target=server.handle, args=(theirs,), daemon=True, name="gpujob-oneshot")
    handler.start()
    try:
        warm = (req.get("inventory"), str(req["target"])) if req.get("target") else None
        return client.request(req, sock=ours, on_going=lambda: client.start_soon(path, warm))
    finally:
        handler.join(5)
        server.pool.close()
        logs.to.close()
        logs.to = None


def _conn_log(path: str):
    """conn.log beside the socket (the daemon's own log), 0600 like the daemon makes it;
    /dev/null when it cannot be opened (the command runs all the same)."""
    try:
        fd = os.open(os.path.join(os.path.dirname(path), "conn.log"),
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
    return os.fdopen(fd, "a", encoding="utf-8", errors="replace")
