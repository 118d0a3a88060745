"""What the kept connection's tests share (tests/test_conn*.py): the daemon of an
environment (its socket, its pid, started or not), byte-for-byte comparison of two
runs, a run on a pty, and the `env` fixture (a bed inventory, a private runtime dir)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from helpers import GPUJOB, REPO, cli, wait_for

HEAVY = ("typer", "rich", "paramiko", "pydantic")


def traced_run(args, env, *, extra=()):
    """``gpujob ARGS`` by the console script's code under python options (``-X importtime``)."""
    return subprocess.run([sys.executable, *extra, str(GPUJOB), *args], env=env, capture_output=True,
                          timeout=120, cwd=str(REPO))


def sock_path(env) -> Path:
    """The socket of env's environment (its key: uid, env view, code stamp)."""
    from unittest import mock
    from gpujob.conn import paths
    with mock.patch.dict(os.environ, env, clear=True):
        return Path(paths.socket_path(create=False))


def daemon_pid(env) -> int | None:
    """The pid serving the socket (SO_PEERCRED), or None when nothing answers."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(sock_path(env)))
        return struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    except OSError:
        return None
    finally:
        s.close()


def started(env) -> int:
    """The daemon's pid once it answers: the command that finds none starts one in the
    background and runs directly itself."""
    return wait_for(lambda: daemon_pid(env), 60, what="the daemon to start")


def warm(env) -> int:
    assert cli(["exec", "tb/ct200", "--", "true"], env).returncode == 0
    return started(env)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.fixture
def env(testbed, tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    inv = testbed.write_hosts_yaml(tmp_path / "hosts.yaml")
    e = dict(os.environ, GPUJOB_HOSTS=str(inv), XDG_STATE_HOME=str(tmp_path / "state"),
             XDG_RUNTIME_DIR=str(runtime), COLUMNS="200")
    e.pop("GPUJOB_NO_DAEMON", None)
    yield e
    end_daemons(e)


def daemons_of(env) -> list[int]:
    """Daemon processes started for this test's runtime dir (bound or still starting)."""
    mine = f"XDG_RUNTIME_DIR={env['XDG_RUNTIME_DIR']}".encode()
    found = []
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and b"gpujob.daemon\0serve" in open(f"/proc/{d}/cmdline", "rb").read() and \
                    mine in open(f"/proc/{d}/environ", "rb").read().split(b"\0") and alive(int(d)):
                found.append(int(d))
        except OSError:
            pass
    return found


def end_daemons(env) -> None:
    """`gpujob disconnect`, then SIGKILL whatever of this test's daemons is left (one still
    starting when a test failed, say): no test leaves one behind."""
    cli(["disconnect"], env)
    try:
        wait_for(lambda: not daemons_of(env), 10, what="the daemons to end")
    except AssertionError:
        for pid in daemons_of(env):
            os.kill(pid, signal.SIGKILL)


#: the live figures in read-only output, which move between two calls: the container's
#: free disk (a shared disk) and how long ago something was (render.age)
LIVE = re.compile(rb"\d+\.\d GiB free|\b(\d+d\d+h|\d+h\d\dm|\d+m\d\ds|\d+s) ago\b")


def same(a: subprocess.CompletedProcess, b: subprocess.CompletedProcess) -> None:
    """The same exit code, stdout and stderr, byte for byte (else: where they differ),
    but for the LIVE figures (free disk, how long ago), which move between two calls."""
    for p in (a, b):
        p.stdout, p.stderr = LIVE.sub(b"<live>", p.stdout), LIVE.sub(b"<live>", p.stderr)
    if (a.returncode, a.stdout, a.stderr) != (b.returncode, b.stdout, b.stderr):
        import difflib
        diff = [f"{name}:\n" + "\n".join(difflib.unified_diff(x.decode("utf-8", "replace").splitlines(),
                                                              y.decode("utf-8", "replace").splitlines(),
                                                              lineterm=""))
                for name, x, y in (("stdout", a.stdout, b.stdout), ("stderr", a.stderr, b.stderr)) if x != y]
        raise AssertionError(f"{a.args[1:]}: exit {a.returncode} vs {b.returncode}\n" + "\n".join(diff))


def pty_run(cmd, env) -> tuple[int, bytes]:
    """Run cmd with stdout and stderr on a 97x31 terminal; (exit code, what it showed)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 31, 97, 0, 0))
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, cwd=str(REPO))
    os.close(slave)
    got = bytearray()

    def drain():
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            got.extend(chunk)

    t = threading.Thread(target=drain)
    t.start()
    code = p.wait(120)
    t.join(10)
    os.close(master)
    return code, bytes(got)

