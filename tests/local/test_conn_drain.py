"""``gpujob disconnect`` and SIGTERM drain the daemon (gpujob/daemon/server.py): the
commands still running through it finish first (up to paths.DEFAULT_DRAIN seconds),
one arriving meanwhile runs directly, and one still running when the time is up is cut
with one line and exit 3. The first tests run the real daemon (Server.serve) on a
socket in a thread, with a fake pool whose close cuts what runs, as closing the SSH
connections does (test_conn_drain_bed.py: the same on the test bed). What runs here waits on
events (a command released, the socket gone), never on a clock."""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from connkit import daemon_pid, env, sock_path, warm  # noqa: F401
from gpujob.conn import client, paths, proto
from gpujob.daemon.server import Server
from gpujob.errors import ConnectionLost
from gpujob.transport.base import Result
from helpers import HANG, returns, wait_for
from test_conn_relay import FakePool, Scripted


class Sleeper:
    """A command that runs until ``release()`` (then says "done"), or is cut when its pool
    closes; ``seconds`` at most (a guard: a test that never releases it fails, not hangs)."""

    def __init__(self, seconds: float = 10 * HANG):
        self.seconds = seconds
        self.running = threading.Event()
        self.closed = threading.Event()
        self.wake = threading.Event()
        self.finished = False

    def release(self) -> None:
        self.wake.set()

    def cut(self) -> None:
        self.closed.set()
        self.wake.set()

    def __call__(self, argv, on_stdout, on_stderr, stdin):
        self.running.set()
        self.wake.wait(self.seconds)
        if self.closed.is_set():
            raise ConnectionLost(f"lost the connection to bed while running {argv[0]}")
        on_stdout(b"done\n")
        self.finished = True
        return Result(list(argv), 0, b"", b"", duration=0.0)


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
        pool.close = sleeper.cut
        server.pool = pool
        t = threading.Thread(target=server.serve, daemon=True)
        t.start()
        wait_for(lambda: (where / "conn.sock").exists(), HANG, what="the socket")
        made.append((server, t))
        return server, str(where / "conn.sock"), t

    yield start
    for server, t in made:
        server.stopping.set()
        t.join(HANG)
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
    sleeper = Sleeper()
    server, path, t = daemon(sleeper, drain=10 * HANG)  # (never up here)
    got: dict = {}
    ex = threading.Thread(target=exec_through, args=(path, ["sleep", "1"], got))
    ex.start()
    assert sleeper.running.wait(HANG)
    answered: list = []
    stop = threading.Thread(target=lambda: answered.append(client.stop(path)), daemon=True)
    stop.start()
    wait_for(lambda: not os.path.exists(path), HANG, what="the socket to go")  # draining
    assert stop.is_alive() and "code" not in got  # the stop waits on the running command
    sleeper.release()
    stop.join(HANG)
    assert answered == [True]  # answered once drained
    ex.join(HANG)
    assert (got["code"], got["stdout"], got["stderr"]) == (0, b"done\n", b"")
    assert sleeper.finished  # finished, not cut (the pool closes after: the stop)
    t.join(HANG)
    assert not t.is_alive() and not os.path.exists(path) and server.cut == 0


def test_a_command_still_running_when_the_drain_is_up_is_cut_in_one_line_exit_3(daemon):
    sleeper = Sleeper()
    server, path, t = daemon(sleeper, drain=0.5)
    got: dict = {}
    ex = threading.Thread(target=exec_through, args=(path, ["sleep", "60"], got))
    ex.start()
    assert sleeper.running.wait(HANG)
    assert returns(lambda: client.stop(path), "the stop of a daemon with a command still running")
    ex.join(HANG)
    lines = got["stderr"].decode().splitlines()
    assert got["code"] == 3 and len(lines) == 1, got
    assert lines[0].startswith("gpujob: the kept connection was closed")
    assert "sleep still ran after 0.5s" in lines[0]
    assert server.cut == 1 and sleeper.closed.is_set() and not sleeper.finished  # cut at the drain's end
    t.join(HANG)
    assert not t.is_alive()


def test_a_command_arriving_during_the_drain_goes_the_direct_way(daemon):
    sleeper = Sleeper()
    server, path, t = daemon(sleeper, drain=10 * HANG)
    first: dict = {}
    ft = threading.Thread(target=exec_through, args=(path, ["sleep", "2"], first), daemon=True)
    ft.start()
    assert sleeper.running.wait(HANG)
    threading.Thread(target=client.stop, args=(path,), daemon=True).start()
    wait_for(lambda: not os.path.exists(path), HANG, what="the socket to go")  # nobody new finds it
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
    assert late["frames"] == [b"F"] and "code" not in late and not sleeper.finished  # while it ran
    sleeper.release()
    t.join(HANG)
    ft.join(HANG)
    assert not t.is_alive() and first["code"] == 0 and first["stdout"] == b"done\n"

