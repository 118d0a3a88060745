"""Issue 34 on the loopback Proxmox bed: what a new user reads, through the installed entry
point, the kept connection on (the default) and off."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers import gpujob_argv, user_env

pytestmark = pytest.mark.testbed


def bed_hosts(testbed, path: Path, *, key: bool = True) -> Path:
    host = {"address": "127.0.0.1", "port": testbed.port, "user": "root",
            "known_hosts": str(testbed.known_hosts), "containers": {"ct200": {"vmid": 200}}}
    if key:
        host["identity_file"] = str(testbed.user_key)
    path.write_text(yaml.safe_dump({"hosts": {"tb": host}}))
    return path


def new_user(tmp_path: Path, hosts: Path | None) -> dict:
    """An empty HOME (no ~/.ssh, no ssh-agent), the suite's runtime dir for its daemons."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUJOB_", "XDG_", "SSH_AUTH"))}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), XDG_STATE_HOME=str(tmp_path / "state"), COLUMNS="200")
    if hosts is not None:
        env["GPUJOB_HOSTS"] = str(hosts)
    return user_env(env)


def run(args, env, *, daemon=True, timeout=120):
    e = dict(env)
    if not daemon:
        e["GPUJOB_NO_DAEMON"] = "1"
    return subprocess.run([*gpujob_argv(), *args], env=e, capture_output=True, timeout=timeout,
                          cwd=env["HOME"])


def test_no_ssh_key_doctor_and_exec_say_so_and_what_to_do(testbed, tmp_path):
    """Row 5: not `No authentication methods available` with a fix about address/port/sshd."""
    env = new_user(tmp_path, bed_hosts(testbed, tmp_path / "hosts.yaml", key=False))
    for daemon in (True, False):
        doc = run(["doctor", "tb/ct200"], env, daemon=daemon)
        text = (doc.stdout + doc.stderr).decode()
        assert doc.returncode != 0 and "no SSH key to log in" in text and "ssh-keygen" in text, text
        assert "sshd" not in text, text
        ex = run(["exec", "tb/ct200", "--", "true"], env, daemon=daemon)
        text = ex.stderr.decode()
        assert ex.returncode == 3 and "no SSH key to log in" in text and "ssh-copy-id" in text, text


def piped(args, env, *, daemon: bool, lines: int) -> tuple[int, bytes, str]:
    """``gpujob ARGS | head -LINES``: (gpujob's exit code, what head got, gpujob's stderr)."""
    e = dict(env)
    if not daemon:
        e["GPUJOB_NO_DAEMON"] = "1"
    p = subprocess.Popen([*gpujob_argv(), *args], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, cwd=env["HOME"])
    got = b"".join(p.stdout.readline() for _ in range(lines))
    p.stdout.close()
    err = p.stderr.read().decode()
    return p.wait(timeout=120), got, err


def test_a_closed_pipe_ends_status_and_exec_quietly_with_exit_0_with_and_without_the_daemon(
        testbed, tmp_path):
    """Row 9: `gpujob status | head -2` (exit 3 and `the connection daemon ended` through the
    daemon) and `gpujob exec ct -- seq 1 100000 | head -1` (a traceback, exit 120, without)."""
    env = new_user(tmp_path, bed_hosts(testbed, tmp_path / "hosts.yaml"))
    home = f"/root/gj-pipe-{os.getpid()}"
    spec = tmp_path / "p.yaml"
    spec.write_text(yaml.safe_dump({"name": "p", "target": "tb/ct200", "workdir": f"{home}/w",
                                    "profiles": [{"name": "base", "system_site_packages": True}],
                                    "train": {"command": "python3 -c 'import time; time.sleep(300)'"}}))
    sub = run(["submit", str(spec)], env)
    assert sub.returncode == 0, sub.stderr.decode()
    job = [w for w in sub.stdout.decode().split() if w.startswith("p-")][0]
    for daemon in (True, False):
        code, got, err = piped(["exec", "tb/ct200", "--", "sh", "-c", "seq 1 100000; sleep 30"], env,
                               daemon=daemon, lines=1)
        assert (code, got, err) == (0, b"1\n", ""), (daemon, code, err)
        code, got, err = piped(["status", job], env, daemon=daemon, lines=2)
        assert code == 0 and err == "" and job.encode() in got, (daemon, code, got, err)
        code, got, err = piped(["ps", "tb/ct200", "--limit", "200"], env, daemon=daemon, lines=1)
        assert code == 0 and err == "", (daemon, code, err)
    assert run(["stop", job], env).returncode == 0
    # like `ssh host 'seq …; sleep 30' | head -1`, the remote sleep is not signalled: end ours
    testbed.container_exec("pkill", "-f", "[s]eq 1 100000; sleep 30")
