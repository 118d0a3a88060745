"""The kept connection's drain on the loopback Proxmox: disconnect and SIGTERM drain what is
running and cut what is left (the daemon's drain in-process: tests/local/test_conn_drain.py)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from connkit import daemon_pid, env, sock_path, warm  # noqa: F401
from helpers import REPO, cli, gpujob_argv, wait_for


@pytest.mark.testbed
def test_on_the_bed_disconnect_and_sigterm_drain_and_cut(env, testbed):  # noqa: F811
    def running(argv, e):
        return subprocess.Popen([*gpujob_argv(), "exec", "tb/ct200", "--", *argv], env=e, cwd=str(REPO),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)

    def started_in_container(marker):
        wait_for(lambda: testbed.container_path(marker).exists(), 60, what="the command to start")

    warm(env)
    m = f"/tmp/drain-{os.getpid()}"
    p = running(["sh", "-c", f"touch {m}; sleep 1; echo slept"], env)
    started_in_container(m)
    d = cli(["disconnect"], env)
    assert (d.returncode == 0 and d.stdout == b"gpujob: closed the kept connection (its SSH connections are "
                                              b"closed)\n")
    assert p.communicate(timeout=60) == (b"slept\n", b"") and p.returncode == 0
    assert daemon_pid(env) is None
    # SIGTERM drains the same way
    pid = warm(env)
    m1 = f"/tmp/drain-term-{os.getpid()}"
    p = running(["sh", "-c", f"touch {m1}; sleep 1; echo slept"], env)
    started_in_container(m1)
    os.kill(pid, signal.SIGTERM)
    assert p.communicate(timeout=60) == (b"slept\n", b"") and p.returncode == 0
    # past the drain's time: cut, one line, exit 3, and the command ended in the container
    short = dict(env, GPUJOB_CONN_DRAIN="1")
    wait_for(lambda: daemon_pid(env) is None, 30, what="the daemon to end")
    warm(short)
    m2 = f"/tmp/drain-cut-{os.getpid()}"
    p = running(["sh", "-c", f"echo $$ > {m2}; sleep 60"], short)
    started_in_container(m2)
    cli(["disconnect"], short)
    out, err = p.communicate(timeout=60)
    lines = err.decode().splitlines()
    assert p.returncode == 3 and len(lines) == 1 and "kept connection was closed" in lines[0], err
    remote = testbed.container_path(m2).read_text().strip()
    wait_for(lambda: not testbed.container_path(f"/proc/{remote}").exists(), 30, what="the command to end")
    wait_for(lambda: daemon_pid(env) is None and not sock_path(env).exists(), 30, what="the daemon to end")
