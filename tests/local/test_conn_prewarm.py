"""The daemon that a cold command starts connects at once to the target that command
used (``serve --warm INVENTORY TARGET``: gpujob/daemon/server.py ``prewarm``), its SSH
connection and its exec channel, so the next command is warm instead of paying both;
what cannot be opened ahead is one conn.log line and the daemon serves as before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from connkit import env, sock_path  # noqa: F401
from gpujob.conn import client
from gpujob.daemon import server as daemon_server
from gpujob.daemon.pool import Fallback
from gpujob.errors import ConnectionLost
from helpers import REPO, wait_for


class Chan:
    def __init__(self, fail: Exception | None = None):
        self.opened, self.fail = 0, fail

    def mux(self):
        self.opened += 1
        if self.fail is not None:
            raise self.fail


class Entry:
    def __init__(self, transport, refuse: bool = False):
        self.transport, self.refuse, self.asked = transport, refuse, []

    def target(self, name):
        self.asked.append(name)
        if self.refuse:
            raise Fallback()
        return type("T", (), {"transport": self.transport})()


class Pool:
    def __init__(self, entry):
        self.entry, self.users, self.paths = entry, 0, []

    def acquire(self, path):
        self.paths.append(path)
        self.users += 1
        return self.entry

    def release(self, entry):
        self.users -= 1


@pytest.fixture
def logged(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(daemon_server, "log", lines.append)
    return lines


def server_with(entry) -> daemon_server.Server:
    s = daemon_server.Server(Path("/nonexistent/conn.sock"), idle=60)
    s.pool = Pool(entry)
    return s


def test_prewarm_opens_the_targets_connection_and_exec_channel_and_gives_the_entry_back(logged):
    chan = Chan()
    s = server_with(Entry(chan))
    s.prewarm("/home/u/hosts.yaml", "tb/ct200")
    assert s.pool.paths == ["/home/u/hosts.yaml"] and s.pool.entry.asked == ["tb/ct200"]
    assert chan.opened == 1 and s.pool.users == 0
    assert logged == ["connected ahead to tb/ct200"]


def test_a_prewarm_that_fails_is_one_line_and_the_entry_is_given_back(logged):
    chan = Chan(ConnectionLost("lost the connection to root@bed:22 while opening the exec channel into "
                               "ct200"))
    s = server_with(Entry(chan))
    s.prewarm(None, "tb/ct200")  # never raises: a side thread of the daemon
    assert s.pool.users == 0 and len(logged) == 1
    assert logged[0].startswith("could not connect ahead to tb/ct200: ConnectionLost: lost the connection")
    s = server_with(Entry(Chan(), refuse=True))  # a kind without a kept connection: nothing to open
    logged.clear()
    s.prewarm(None, "local/box")
    assert s.pool.users == 0 and logged == []


def test_the_spawned_daemon_is_told_the_target_as_argv(monkeypatch, tmp_path):
    seen = {}

    class P:
        pid = 4242

    def popen(argv, **kw):
        seen["argv"], seen["kw"] = argv, kw
        return P()

    monkeypatch.setattr(subprocess, "Popen", popen)
    client._spawn(str(tmp_path / "conn.sock"), ("/h/hosts.yaml", "tb/ct200"))
    assert seen["argv"][1:] == ["-m", "gpujob.daemon", "serve", "--warm", "/h/hosts.yaml", "tb/ct200"]
    assert "shell" not in seen["kw"]
    client._spawn(str(tmp_path / "conn.sock"), (None, "ct200"))  # the built-in inventory: an empty word
    assert seen["argv"][-3:] == ["--warm", "", "ct200"]
    client._spawn(str(tmp_path / "conn.sock"))
    assert seen["argv"][-1] == "serve"


@pytest.mark.parametrize("argv", [["serve", "--warm"], ["serve", "--warm", "a"],
                                  ["serve", "--cold", "a", "b"]])
def test_a_daemon_argv_it_does_not_know_is_its_usage_line(argv):
    p = subprocess.run([sys.executable, "-m", "gpujob.daemon", *argv], capture_output=True, text=True,
                       cwd=str(REPO), timeout=60)
    assert p.returncode == 1 and p.stderr.strip().startswith("usage: python -m gpujob.daemon serve")
    assert "Traceback" not in p.stderr


def mux_servers() -> list[int]:
    """Exec-channel servers running in any container (seen from the host's /proc)."""
    found = []
    for d in os.listdir("/proc"):
        try:
            cmd = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if d.isdigit() and cmd[:2] == [b"python3", b"-c"] and len(cmd) > 2 and \
                b"far end of a multiplexed exec channel" in cmd[2]:
            found.append(int(d))
    return found


def test_a_starting_marker_of_a_killed_daemon_or_another_process_is_not_a_daemon_on_its_way():
    # the marker can outlive a fast daemon (written after the spawn, removed at bind); a
    # daemon killed then is a zombie until init reaps it, and kill(pid, 0) still succeeds
    daemon_like = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "gpujob.daemon",
                                    "serve"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert client._starting(daemon_like.pid)
        assert not client._starting(other.pid)  # alive, but not a daemon (a reused pid)
        daemon_like.kill()
        wait_for(lambda: open(f"/proc/{daemon_like.pid}/stat").read().rsplit(") ", 1)[1][0] == "Z", 10,
                 what="the zombie")  # (not reaped yet: we are its parent)
        os.kill(daemon_like.pid, 0)  # what the old check asked: it still "lives"
        assert not client._starting(daemon_like.pid)
    finally:
        for p in (daemon_like, other):
            p.kill()
            p.wait()
    assert not client._starting(daemon_like.pid)  # reaped: gone
