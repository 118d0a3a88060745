"""``gpujob disconnect`` and SIGTERM drain the daemon (gpujob/daemon/server.py): the
commands still running through it finish first (up to paths.DEFAULT_DRAIN seconds),
one arriving meanwhile runs directly, and one still running when the time is up is cut
with one line and exit 3. The first tests run the real daemon (Server.serve) on a
socket in a thread, with a fake pool whose close cuts what runs, as closing the SSH
connections does; the last ones run on the test bed."""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from connkit import daemon_pid, env, sock_path, warm  # noqa: F401
from gpujob.conn import client, paths, proto
from gpujob.daemon.server import Server
from gpujob.errors import ConnectionLost
from gpujob.transport.base import Result
from helpers import wait_for
from test_conn_relay import FakePool, Scripted


class Sleeper:
    """A command that runs ``seconds`` then says "done", or is cut when its pool closes."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.running = threading.Event()
        self.closed = threading.Event()
        self.finished_at = None

    def __call__(self, argv, on_stdout, on_stderr, stdin):
        self.running.set()
        if self.closed.wait(self.seconds):
            raise ConnectionLost(f"lost the connection to bed while running {argv[0]}")
        on_stdout(b"done\n")
        self.finished_at = time.monotonic()
        return Result(list(argv), 0, b"", b"", duration=self.seconds)


@pytest.fixture
def daemon(monkeypatch):
    """start(sleeper, drain) -> (server, socket path, its serve thread)."""
    where = Path(tempfile.mkdtemp(prefix="gj-drain-", dir="/tmp"))
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # (serve() runs in a thread here)
    made = []

    def start(sleeper: Sleeper, drain: float):
        monkeypatch.setenv("GPUJOB_CONN_DRAIN", str(drain))
        server = Server(where / "conn.sock", idle=60)
        pool = FakePool(Scripted(sleeper))
        pool.close = sleeper.closed.set
        server.pool = pool
        t = threading.Thread(target=server.serve, daemon=True)
        t.start()
        wait_for(lambda: (where / "conn.sock").exists(), 10, what="the socket")
        made.append((server, t))
        return server, str(where / "conn.sock"), t

    yield start
    for server, t in made:
        server.stopping.set()
        t.join(15)
    for p in where.iterdir():
        p.unlink()
    where.rmdir()


def exec_through(path: str, argv, out: dict) -> None:
    """One exec request as the thin client sends it, stdio on pipes; its code and bytes."""
    pipes = [os.pipe() for _ in range(3)]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    req = {"op": "exec", "target": "tb/ct200", "argv": argv, "stdin": False, "timeout": None,
           "stamp": paths.code_stamp(), "env": paths.env_view(), "term": {}, "encoding": ["utf-8", "utf-8"]}
    with s:
        socket.send_fds(s, [proto.pack_json(b"R", req)], [pipes[0][0], pipes[1][1], pipes[2][1]])
        for fd in (pipes[0][0], pipes[1][1], pipes[2][1], pipes[0][1]):
            os.close(fd)
        reader = proto.Reader(s)
        while (got := reader.frame()) is not None:
            if got[0] == b"x":
                out["code"] = json.loads(got[1])["code"]
            out.setdefault("frames", []).append(got[0])
    out["stdout"], out["stderr"] = os.read(pipes[1][0], 1 << 16), os.read(pipes[2][0], 1 << 16)
    os.close(pipes[1][0])
    os.close(pipes[2][0])


def test_disconnect_waits_for_a_running_command_to_finish(daemon):
    sleeper = Sleeper(1.0)
    server, path, t = daemon(sleeper, drain=5)
    got: dict = {}
    ex = threading.Thread(target=exec_through, args=(path, ["sleep", "1"], got))
    ex.start()
    assert sleeper.running.wait(10)
    assert client.stop(path)  # answered once drained
    stopped_at = time.monotonic()
    ex.join(10)
    assert (got["code"], got["stdout"], got["stderr"]) == (0, b"done\n", b"")
    assert sleeper.finished_at is not None and sleeper.finished_at <= stopped_at  # finished, not cut
    t.join(10)
    assert not t.is_alive() and not os.path.exists(path) and server.cut == 0


def test_a_command_still_running_when_the_drain_is_up_is_cut_in_one_line_exit_3(daemon):
    sleeper = Sleeper(60)
    server, path, t = daemon(sleeper, drain=0.5)
    got: dict = {}
    ex = threading.Thread(target=exec_through, args=(path, ["sleep", "60"], got))
    ex.start()
    assert sleeper.running.wait(10)
    took = time.monotonic()
    assert client.stop(path)
    took = time.monotonic() - took
    ex.join(10)
    lines = got["stderr"].decode().splitlines()
    assert got["code"] == 3 and len(lines) == 1, got
    assert (lines[0].startswith("gpujob: the kept connection was closed")
            and "sleep still ran after 0.5s" in lines[0])
    assert 0.4 < took < 5 and server.cut == 1
    t.join(10)
    assert not t.is_alive()


def test_a_command_arriving_during_the_drain_goes_the_direct_way(daemon):
    sleeper = Sleeper(2.0)
    server, path, t = daemon(sleeper, drain=5)
    first: dict = {}
    threading.Thread(target=exec_through, args=(path, ["sleep", "2"], first), daemon=True).start()
    assert sleeper.running.wait(10)
    threading.Thread(target=client.stop, args=(path,), daemon=True).start()
    wait_for(lambda: not os.path.exists(path), 10, what="the socket to go")  # nobody new finds it
    # one accepted just before (its handler sees the drain): the fall-back frame, nothing done
    late: dict = {}
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with server.lock:
        server.active += 1
    threading.Thread(target=server.handle, args=(theirs,), daemon=True).start()
    s_path = f"{path}.late"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(s_path)
    srv.listen(1)

    def relay():
        c, _ = srv.accept()
        data, fds, _, _ = socket.recv_fds(c, 1 << 16, 3)
        socket.send_fds(ours, [data], fds)
        for fd in fds:
            os.close(fd)
        while chunk := ours.recv(1 << 16):
            c.sendall(chunk)
        c.close()

    threading.Thread(target=relay, daemon=True).start()
    exec_through(s_path, ["true"], late)
    srv.close()
    os.unlink(s_path)
    assert late["frames"] == [b"F"] and "code" not in late and sleeper.running.is_set()
    t.join(10)
    assert first["code"] == 0 and first["stdout"] == b"done\n"


# ---- on the test bed: the real daemon, exec over SSH into the container -----------------

