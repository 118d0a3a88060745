"""The full CLI's commands over the kept connection (gpujob/conn/remote.py, the client;
gpujob/daemon/relay.py, the daemon's side) without the bed: the real daemon request
handler (Server.handle) on one end of a socket pair, the real KeptTransport on the other,
and a fake transport under the daemon, so timing, a slow client and failures below the
daemon are chosen, not waited for. Whatever happens, the client gets the command's real
exit or one clear error, never "lost the connection daemon" while the daemon lives."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from gpujob.conn import client, paths, proto
from gpujob.conn.remote import KeptTransport
from gpujob.daemon.server import Server
from gpujob.errors import ConnectionLost, GpujobError
from gpujob.transport.base import Result, Transport


class Scripted(Transport):
    """What runs under the daemon: ``script(on_stdout, on_stderr, stdin)`` plays the command."""

    def __init__(self, script):
        self.script = script
        self.ran = 0

    def run(self, argv, *, stdin=None, timeout=None, on_stdout=None, on_stderr=None):
        self.ran += 1
        return self.script(argv, on_stdout, on_stderr, stdin)

    def open_stream(self, argv):  # pragma: no cover - the relay never asks one
        raise AssertionError("no stream")

    def describe(self) -> str:
        return "ct200 (vmid 200) on root@bed:22"


class FakeTarget:
    def __init__(self, transport):
        self.transport, self.label, self.name = transport, "tb/ct200", "ct200"

    def run(self, argv, **kw):
        return self.transport.run(argv, **kw)


class FakeEntry:
    def __init__(self, transport):
        self.t = FakeTarget(transport)
        self.targets = type("Ts", (), {"host_transport": lambda _self, name: transport})()

    def target(self, name):
        return self.t


class FakePool:
    def __init__(self, transport):
        self.entry = FakeEntry(transport)
        self.users = 0

    def acquire(self, path):
        self.users += 1
        return self.entry

    def release(self, entry):
        self.users -= 1

    def close(self):
        pass


#: how long a test's client waits for a frame (the CLI itself waits for ever)
CLIENT_WAIT = 10.0


class Daemon:
    """The daemon's request handler, one request per ``connect()`` the client makes."""

    def __init__(self, transport, monkeypatch):
        self.server = Server(Path("/nonexistent/conn.sock"), idle=60)
        self.server.pool = FakePool(transport)
        self.handlers: list[threading.Thread] = []
        monkeypatch.setattr(client, "connect", self.connect)

    def connect(self, start: bool = True):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with self.server.lock:
            self.server.active += 1
        h = threading.Thread(target=self.server.handle, args=(theirs,), daemon=True)
        h.start()
        self.handlers.append(h)
        ours.settimeout(CLIENT_WAIT)  # a client waiting for ever is read as what it is, a loss
        return ours

    def finished(self, timeout: float = 10) -> bool:
        for h in self.handlers:
            h.join(timeout)
        return not any(h.is_alive() for h in self.handlers) and self.server.active == 0


def kept(transport=None) -> KeptTransport:
    direct = transport or Scripted(lambda *a: pytest.fail("ran directly, not through the daemon"))
    return KeptTransport(direct, "/x/hosts.yaml", "tb/ct200")


def quick(argv, on_stdout, on_stderr, stdin):
    """A command that says three things and exits 7 at once (captured when no sink is given)."""
    out, err = bytearray(), bytearray()
    for data, cb, buf in ((b"out 1\n", on_stdout, out), (b"err \xe2\x9c\x93\n", on_stderr, err),
                          (b"out 2\n", on_stdout, out)):
        cb(data) if cb is not None else buf.extend(data)
    return Result(list(argv), 7, bytes(out), bytes(err), duration=0.01)


def slow_client(monkeypatch, daemon: Daemon) -> None:
    """The client descheduled right after sending its request (a loaded machine): by its
    first read, the daemon has run the command and said everything (G, output, x)."""
    real = socket.send_fds

    def send_then_stall(sock, buffers, fds, *args):
        n = real(sock, buffers, fds, *args)
        assert daemon.finished(), "the daemon's handler did not finish"
        return n

    monkeypatch.setattr(socket, "send_fds", send_then_stall)


def test_a_quick_command_and_a_slow_client_lose_neither_output_nor_exit(monkeypatch):
    """The cause of the intermittent "lost the connection daemon" under load: the frames
    that came with the daemon's G in one read were dropped with the reader that read G,
    so the client lost the output and the exit, then read EOF."""
    d = Daemon(Scripted(quick), monkeypatch)
    slow_client(monkeypatch, d)
    r = kept().run(["sh", "-c", "x"])
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (7, b"out 1\nout 2\n", "err ✓\n".encode(), False)
    got = []
    r = kept().run(["sh"], on_stdout=got.append)
    assert r.exit_code == 7 and got == [b"out 1\n", b"out 2\n"] and r.stdout == b""


def test_frames_in_the_same_read_as_going_are_all_delivered(monkeypatch):
    """The wire alone: a daemon whose G, output and x arrive in one write."""
    def connect(start: bool = True):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

        def serve():
            with theirs:
                assert proto.Reader(theirs).frame()[0] == b"R"
                theirs.sendall(proto.pack(b"G") + proto.pack(b"o", b"a" * 70_000) + proto.pack(b"e", b"b")
                               + proto.pack_json(b"x", {"code": 3, "timed_out": False, "duration": 0.1}))
        threading.Thread(target=serve, daemon=True).start()  # one write: G and what follows it
        return ours

    monkeypatch.setattr(client, "connect", connect)
    r = kept().run(["true"])
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"a" * 70_000, b"b")


def test_a_link_error_below_the_daemon_is_said_as_such_and_the_daemon_serves_on(monkeypatch):
    """An OSError from the remote side (paramiko's socket, a pipe to the host: not the
    client's socket) mid-command is the transport's ConnectionLost, with the cause, exit 3
    — never read as the client having gone, with no end frame for it."""
    def broken(argv, on_stdout, on_stderr, stdin):
        on_stdout(b"half\n")
        raise BrokenPipeError(32, "Broken pipe")

    t = Scripted(broken)
    d = Daemon(t, monkeypatch)
    got = []
    with pytest.raises(ConnectionLost) as e:
        kept().run(["cat", "big"], on_stdout=got.append)
    assert got == [b"half\n"]
    msg = e.value.message
    assert "connection daemon" not in msg and "Broken pipe" in msg and "cat" in msg and "tb/ct200" in msg, msg
    assert e.value.exit_code == 3 and "\n" not in msg
    assert d.finished()
    t.script = quick  # the same daemon serves the next command
    assert kept().run(["true"]).exit_code == 7


def test_a_bug_in_the_daemon_is_one_line_to_the_client_and_the_daemon_serves_on(monkeypatch, capsys):
    def bug(argv, on_stdout, on_stderr, stdin):
        raise RuntimeError("boom")

    t = Scripted(bug)
    d = Daemon(t, monkeypatch)
    with pytest.raises(GpujobError) as e:
        kept().run(["true"])
    assert e.value.message == "the connection daemon failed: RuntimeError: boom", e.value.message
    assert d.finished()
    assert "RuntimeError: boom" in capsys.readouterr().err  # its traceback is in conn.log
    t.script = quick
    assert kept().run(["true"]).exit_code == 7


def test_the_client_going_away_ends_the_command_and_the_handler(monkeypatch):
    """The client closes mid-command (Ctrl-C, or here its own sink failing: `| head`): the
    command is ended as Ctrl-C ends it, the handler finishes, and the daemon serves on."""
    ended = threading.Event()

    def long(argv, on_stdout, on_stderr, stdin):
        try:
            on_stdout(b"line\n")
            while True:
                time.sleep(0.05)
        except KeyboardInterrupt:
            ended.set()
            raise

    def sink(b):
        raise BrokenPipeError(32, "Broken pipe")

    t = Scripted(long)
    d = Daemon(t, monkeypatch)
    with pytest.raises(BrokenPipeError):
        kept().run(["sleep", "60"], on_stdout=sink)
    assert ended.wait(10) and d.finished()
    t.script = quick
    assert kept().run(["true"]).exit_code == 7


def test_stdin_goes_through_and_its_end_arrives(monkeypatch):
    def cat(argv, on_stdout, on_stderr, stdin):
        data = b""
        while True:
            chunk = stdin.read(65536)
            if not chunk:
                break
            data += chunk
        on_stdout(data[::-1])
        return Result(list(argv), 0)

    Daemon(Scripted(cat), monkeypatch)
    data = bytes(range(256)) * 1000
    r = kept().run(["cat"], stdin=data)
    assert r.exit_code == 0 and r.stdout == data[::-1]


def test_a_daemon_that_dies_mid_command_is_one_line_and_the_retry_runs_directly(monkeypatch):
    """The daemon gone after G (killed): ConnectionLost in one line; the next command finds
    no daemon and runs directly."""
    def connect(start: bool = True):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

        def die():
            assert proto.Reader(theirs).frame()[0] == b"R"
            theirs.sendall(proto.pack(b"G") + proto.pack(b"o", b"part"))
            theirs.close()
        threading.Thread(target=die, daemon=True).start()
        return ours

    monkeypatch.setattr(client, "connect", connect)
    with pytest.raises(ConnectionLost) as e:
        kept().run(["sleep", "9"])
    assert "lost the connection daemon" in e.value.message and "\n" not in e.value.message
    monkeypatch.setattr(client, "connect", lambda start=True: None)
    direct = Scripted(quick)
    assert kept(direct).run(["true"]).exit_code == 7 and direct.ran == 1


# ---- the thin client's exec (Server.run), at the wire: its stdio are our pipes ---------

def exec_request(d: Daemon, argv, *, stdout_closed: bool = False):
    """An ``exec`` request as the thin client sends it; (x's code or None, stdout, stderr)."""
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    if stdout_closed:
        os.close(r_out)
    s = d.connect()
    req = {"op": "exec", "target": "tb/ct200", "argv": argv, "stdin": False, "timeout": None,
           "stamp": paths.code_stamp(), "env": paths.env_view(), "term": {}, "encoding": ["utf-8", "utf-8"]}
    with s:
        socket.send_fds(s, [proto.pack_json(b"R", req)], [r_in, w_out, w_err])
        for fd in (r_in, w_out, w_err, w_in):
            os.close(fd)
        code, reader = None, proto.Reader(s)
        try:
            while (got := reader.frame()) is not None:
                if got[0] == b"x":
                    code = json.loads(got[1])["code"]
        except TimeoutError:
            pass
    assert d.finished()
    out = b"" if stdout_closed else os.read(r_out, 1 << 16)
    err = os.read(r_err, 1 << 16)
    for fd in (r_err,) if stdout_closed else (r_out, r_err):
        os.close(fd)
    return code, out, err


def test_exec_a_link_error_below_the_daemon_is_one_line_and_exit_3(monkeypatch):
    """Through the thin client, an OSError from the remote side used to drop the request
    with no end frame (the client then waited for as long as the daemon lived)."""
    def reset(argv, on_stdout, on_stderr, stdin):
        on_stdout(b"half\n")
        raise ConnectionResetError(104, "Connection reset by peer")

    t = Scripted(reset)
    d = Daemon(t, monkeypatch)
    code, out, err = exec_request(d, ["cat", "big"])
    assert (code, out) == (3, b"half\n"), (code, out, err)
    assert err.decode().splitlines() == [
        "gpujob: lost the connection to tb/ct200 while running cat: [Errno 104] Connection reset by peer"]
    t.script = quick
    assert exec_request(d, ["true"]) == (7, b"out 1\nout 2\n", "err ✓\n".encode())


def test_exec_a_closed_stdout_is_the_clients_own_and_quiet(monkeypatch):
    def much(argv, on_stdout, on_stderr, stdin):
        for _ in range(100):
            on_stdout(b"x" * 65536)
        return Result(list(argv), 0)

    code, _out, err = exec_request(Daemon(Scripted(much), monkeypatch), ["yes"], stdout_closed=True)
    assert (code, err) == (0, b"")  # issue 34 row 9: as the full CLI, a closed pipe is exit 0


def test_whatever_ends_a_request_the_client_sees_its_end_at_once(monkeypatch):
    """A handler that ends while a thread of its own still reads the client's socket (the
    watch every request has): a close alone does not end the connection until that read
    returns, so the client would wait for as long as the daemon lives."""
    def run(self, conn, reader, req, fds):
        threading.Thread(target=reader.frame, daemon=True).start()
        time.sleep(0.1)
        raise ValueError("a bad frame")

    monkeypatch.setattr(Server, "run", run)
    d = Daemon(Scripted(quick), monkeypatch)
    s = d.connect()
    s.settimeout(5)
    with s:
        socket.send_fds(s, [proto.pack_json(b"R", {"op": "exec", "stamp": paths.code_stamp(),
                                                  "env": paths.env_view()})], [0, 1, 2])
        assert proto.Reader(s).frame() is None


def test_a_cold_exec_keeps_the_handlers_traceback_out_of_the_terminal(monkeypatch, capfd):
    """The cold exec runs the daemon's handler in the command itself (oneshot.py): a bug
    there is one line on the command's stderr, its traceback in conn.log, as in a daemon."""
    from gpujob.daemon import oneshot

    runtime = tempfile.mkdtemp(prefix="gj-os-", dir="/tmp")  # short: a socket path is < 108 bytes
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)

    def bug(argv, on_stdout, on_stderr, stdin):
        raise RuntimeError("boom")

    monkeypatch.setattr(oneshot, "_OwnPool", lambda: FakePool(Scripted(bug)))
    asked = []
    monkeypatch.setattr(client, "start_soon", lambda *a: asked.append(a))  # (no daemon started by a test)
    req = {"op": "exec", "target": "tb/ct200", "argv": ["true"], "timeout": None, "stdin": False,
           "inventory": "/x/hosts.yaml"}
    try:
        code = oneshot.run(req)
        out, err = capfd.readouterr()
        assert (code, out, err) == (1, "", "gpujob: the connection daemon failed: RuntimeError: boom\n")
        log = (Path(runtime) / "gpujob" / "conn.log").read_text()
        assert "Traceback" in log and "RuntimeError: boom" in log
        assert asked and asked[0][0].startswith(runtime)  # it went ahead: the daemon is asked for,
        assert asked[0][1] == ("/x/hosts.yaml", "tb/ct200")  # told to connect to this target ahead
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
