"""On the loopback bed, gpujob reaches a host as the user's own ``ssh`` does (issue 35, rows
4 and 5): an ``Include``d Host alias, ``IdentitiesOnly yes`` with an ssh-agent holding
another key that the server accepts, ``ProxyJump`` from the config, the daemon seeing an
included file change. Each case runs the real ``ssh … true`` and ``gpujob exec`` in the
same fresh home (tests/sshgkit.py) and compares what happened."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest

from connkit import end_daemons
from helpers import gpujob_argv, wait_for
from sshgkit import in_home, write

pytestmark = pytest.mark.testbed


def _env(tmp_path, hosts: dict, name: str = "run") -> dict:
    inv = tmp_path / f"hosts-{name}.yaml"
    inv.write_text(json.dumps({"hosts": hosts}))
    runtime = tmp_path / name
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = dict(os.environ, GPUJOB_HOSTS=str(inv), XDG_STATE_HOME=str(tmp_path / "state"),
               XDG_RUNTIME_DIR=str(runtime), SSH_AUTH_SOCK="")
    env.pop("GPUJOB_NO_DAEMON", None)
    return env


def _host(alias: str, cname: str) -> dict:
    return {"address": alias, "connect_timeout": 10, "containers": {cname: {"vmid": 200}}}


def _home(tmp_path, testbed, files: dict) -> "os.PathLike":
    home = tmp_path / "home"
    write(home, dict(files, known_hosts=testbed.known_hosts.read_text()))
    return home


def ssh(home, alias: str, env: dict) -> int:
    """The real ``ssh ALIAS true`` in ``home`` (no prompt: BatchMode)."""
    return in_home(home, ["ssh", "-o", "BatchMode=yes", alias, "true"], env, timeout=60).returncode


def gpujob(home, env, *args, path=None):
    return in_home(home, [*gpujob_argv(), *args], env, path=path)


def test_an_included_host_alias_is_reached_as_ssh_reaches_it(testbed, tmp_path):
    home = _home(tmp_path, testbed, {
        "config": "Include lab.conf\n",
        "lab.conf": f"Host lab labnote\n  HostName 127.0.0.1\n  Port {testbed.port}\n  User root\n"
                    f"  IdentityFile {testbed.user_key}\n"
                    "Host labnote\n  StrictHostKeyChecking accept-new\n"})
    env = _env(tmp_path, {"h": _host("lab", "c"), "n": _host("labnote", "cn")})
    nossh = tmp_path / "nossh"
    nossh.mkdir()
    env2 = _env(tmp_path, {"h": _host("lab", "c")}, "run2")  # a daemon of its own, without ssh
    try:
        assert ssh(home, "lab", env) == 0
        p = gpujob(home, env, "exec", "c", "--", "cat", "/etc/debian_version")
        assert p.returncode == 0 and p.stdout.strip()[:2].isdigit(), p.stderr.decode()
        p = gpujob(home, env2, "exec", "c", "--", "true", path=str(nossh))  # paramiko + Include
        assert p.returncode == 0, p.stderr.decode()
        # a directive gpujob cannot honour: ssh goes ahead, so does gpujob, saying so in one line
        assert ssh(home, "labnote", env) == 0
        p = gpujob(home, env, "exec", "cn", "--", "true")
        notes = [x for x in p.stderr.decode().splitlines() if x.startswith("gpujob: note:")]
        assert p.returncode == 0 and len(notes) == 1, p.stderr.decode()
        assert "StrictHostKeyChecking accept-new is not honoured" in notes[0]
        # the daemon sees the included file change: the kept connection is not reused
        (home / ".ssh" / "lab.conf").write_text(
            (home / ".ssh" / "lab.conf").read_text().replace(f"Port {testbed.port}", "Port 1", 1))
        assert ssh(home, "lab", env) == 255
        p = gpujob(home, env, "exec", "c", "--", "true")
        assert p.returncode == 3 and "connection refused by 127.0.0.1:1" in p.stderr.decode(), p.stderr
    finally:
        end_daemons(env)
        end_daemons(env2)


def test_proxy_jump_from_the_config_as_ssh_does(testbed, tmp_path):
    home = _home(tmp_path, testbed, {
        "config": "Include jump.conf\n",
        "jump.conf": f"Host bastion target\n  HostName 127.0.0.1\n  Port {testbed.port}\n  User root\n"
                     f"  IdentityFile {testbed.user_key}\n"
                     "Host target\n  ProxyJump bastion\n"
                     "Host deadjump\n  HostName 127.0.0.1\n  ProxyJump root@127.0.0.1:1\n"})
    env = _env(tmp_path, {"h": _host("target", "c"), "d": _host("deadjump", "cd")})
    try:
        assert ssh(home, "target", env) == 0
        p = gpujob(home, env, "exec", "c", "--", "true")
        assert p.returncode == 0, p.stderr.decode()
        assert ssh(home, "deadjump", env) == 255
        p = gpujob(home, env, "exec", "cd", "--", "true")
        assert p.returncode == 3 and "connection refused by 127.0.0.1:1" in p.stderr.decode(), p.stderr
    finally:
        end_daemons(env)


@pytest.fixture
def agent(testbed, tmp_path):
    """A real ssh-agent of this test holding the bed's login key (which the server accepts)."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(sock.exists, 20, what="the ssh-agent's socket")
        subprocess.run(["ssh-add", "-q", str(testbed.user_key)],
                       env=dict(os.environ, SSH_AUTH_SOCK=str(sock)),
                       check=True, capture_output=True, timeout=30)
        yield str(sock)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(20)


def test_identities_only_offers_only_the_configured_identities(testbed, tmp_path, agent):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh" / "wrongkey")],
                   check=True, timeout=30)
    locked = home / ".ssh" / "locked"  # the accepted key, behind a passphrase: only the agent can sign
    shutil.copy(testbed.user_key, locked)
    shutil.copy(f"{testbed.user_key}.pub", f"{locked}.pub")
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", "secret phrase", "-f", str(locked)],
                   check=True, timeout=30, capture_output=True)
    base = f"  HostName 127.0.0.1\n  Port {testbed.port}\n  User root\n"
    home = _home(tmp_path, testbed, {
        "config": f"Host lab2\n{base}  IdentityFile ~/.ssh/wrongkey\n  IdentitiesOnly yes\n"
                    f"Host lab3\n{base}  IdentityFile ~/.ssh/wrongkey\n"
                    f"Host lab4\n{base}  IdentityFile ~/.ssh/locked\n  IdentitiesOnly yes\n"})
    os.chmod(locked, 0o600)
    env = _env(tmp_path, {"h2": _host("lab2", "c2"), "h3": _host("lab3", "c3"), "h4": _host("lab4", "c4")})
    env["SSH_AUTH_SOCK"] = agent
    try:
        # lab2: IdentitiesOnly, a key the server refuses: ssh is refused, and so is gpujob,
        # although the agent holds a key that the server accepts
        assert ssh(home, "lab2", env) == 255
        marker = f"/tmp/identities-only-{os.getpid()}"
        p = gpujob(home, env, "exec", "c2", "--", "touch", marker)
        assert p.returncode == 3, p.stderr.decode()
        said = p.stderr.decode().splitlines()[0]
        assert "authentication failed for root@127.0.0.1" in said and "IdentitiesOnly yes" in said, said
        assert not testbed.container_path(marker).exists()
        # lab3: the same key without IdentitiesOnly: the agent's key logs in, with ssh as with gpujob
        assert ssh(home, "lab3", env) == 0
        p = gpujob(home, env, "exec", "c3", "--", "true")
        assert p.returncode == 0, p.stderr.decode()
        # lab4: IdentitiesOnly naming a key whose public part the agent holds: the agent signs
        # for that one (OpenSSH's behaviour), though the file cannot be opened without a passphrase
        assert ssh(home, "lab4", env) == 0
        p = gpujob(home, env, "exec", "c4", "--", "true")
        assert p.returncode == 0, p.stderr.decode()
    finally:
        end_daemons(env)
