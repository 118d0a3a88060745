"""The transport end to end: laptop → real sshd on loopback → pct → lxc-attach →
a real LXC container. No mock of paramiko anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from gpujob.errors import ConnectError, HostKeyError
from gpujob.inventory.hosts import load_inventory
from gpujob.ops.target import Targets
from helpers import HANG, cli, gpujob_argv, returns, wait_for

pytestmark = pytest.mark.testbed

ECHO_ARGV = "import sys, json; sys.stdout.write(json.dumps(sys.argv[1:]))"
HOSTILE = ["plain", "two words", "it's", 'say "hi"', "$(touch /tmp/pwned)", "`touch /tmp/pwned2`",
           "a;b", "a|b", "a && b", "line1\nline2", "*", "/etc/*", "~", "$HOME", "${PATH}", "\\", "-n",
           "--", "ünïcödé ✓ 日本", "", " ", "\t", "'\"'\"'", "x" * 100_000]


@pytest.fixture(scope="module")
def inv(testbed, tmp_path_factory):
    return testbed.write_hosts_yaml(tmp_path_factory.mktemp("inv") / "hosts.yaml")


@pytest.fixture
def targets(inv):
    t = Targets(load_inventory(inv))
    yield t
    t.close()


def env_for(inv: Path, tmp: Path) -> dict:
    env = dict(os.environ)
    env.update(GPUJOB_HOSTS=str(inv), XDG_STATE_HOME=str(tmp / "state"))
    return env


def test_hostile_arguments_arrive_byte_exact(targets, testbed):
    t = targets.open("ct200")
    r = t.run(["python3", "-c", ECHO_ARGV, *HOSTILE], timeout=60)
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout) == HOSTILE
    assert not testbed.container_path("/tmp/pwned").exists()
    assert not testbed.container_path("/tmp/pwned2").exists()


def test_hostile_arguments_through_the_cli(inv, tmp_path, testbed):
    p = cli(["exec", "tb/ct200", "--", "python3", "-c", ECHO_ARGV, *HOSTILE[:-1]], env_for(inv, tmp_path))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == HOSTILE[:-1]


@pytest.mark.parametrize("code", [0, 1, 7, 255])
def test_exit_codes_propagate(targets, inv, tmp_path, code):
    assert targets.open("ct200").run(["sh", "-c", f"exit {code}"]).exit_code == code
    assert cli(["exec", "ct200", "--", "sh", "-c", f"exit {code}"], env_for(inv, tmp_path)).returncode == code


def test_output_streams_before_the_command_ends(targets, testbed):
    """"second" is printed only once "first" (stdout) and "err" (stderr) have reached us:
    collected at the command's end instead, it would wait for the mark in vain and print
    "late"."""
    seen: list = []
    mark = f"/root/heard-{os.getpid()}"

    def got(b: bytes) -> None:
        seen.append(b)
        joined = b"".join(seen)
        if b"first" in joined and b"err" in joined:
            testbed.container_path(mark).touch()
    script = (f"rm -f {mark}; echo first; echo err >&2; n=0; "
              f"while [ ! -e {mark} ] && [ $n -lt {int(HANG * 20)} ]; do sleep 0.05; n=$((n+1)); done; "
              f"[ -e {mark} ] && echo second || echo late; rm -f {mark}")
    r = targets.open("ct200").run(["sh", "-c", script], timeout=3 * HANG, on_stdout=got, on_stderr=got)
    assert r.exit_code == 0
    out = b"".join(seen)
    assert b"second" in out and b"late" not in out, out
    assert out.index(b"first") < out.index(b"second") and out.index(b"err") < out.index(b"second")


def test_stdin_reaches_the_command(targets, inv, tmp_path):
    data = os.urandom(3 * 2**20)
    r = targets.open("ct200").run(["sha256sum"], stdin=data, timeout=60)
    import hashlib
    assert r.text.split()[0] == hashlib.sha256(data).hexdigest()
    p = cli(["exec", "ct200", "--", "wc", "-c"], env_for(inv, tmp_path), input=b"hello\n")
    assert p.stdout.strip() == b"6"


def test_timeout_ends_the_remote_command_and_its_children(targets, testbed):
    marker = f"sleep {int(time.time()) % 1000 + 3000}"
    # ended at its timeout, the background sleep holding its output: else "hung"
    r = returns(lambda: targets.open("ct200").run(["sh", "-c", f"{marker} & {marker}; echo never"],
                                                  timeout=1.5), "a timed-out remote command")
    assert r.timed_out and r.exit_code == 124 and b"never" not in r.stdout
    wait_for(lambda: marker not in testbed.container_exec("ps", "-eo", "args").stdout.decode(), HANG, 0.2,
             "the timed-out command's children to be gone")


def test_one_connection_serves_many_commands(targets):
    t = targets.open("ct200")
    for _ in range(20):
        assert t.run(["true"]).exit_code == 0
    client = t.host_transport.client()
    assert client.get_transport().is_active()
    # the same paramiko transport carried every channel
    assert t.host_transport.client() is client


def test_pct_errors_are_gpujobs_own_line_exit_3_never_pcts_exit_code(targets, testbed, tmp_path):
    """Issue 24: a stopped container was pct's raw `CT 201 not running` with pct's exit
    255 passed off as the command's; a missing vmid pct's raw config-file line."""
    from gpujob.errors import ConnectError
    with pytest.raises(ConnectError) as e:
        targets.open("ct201").run(["true"])
    assert e.value.exit_code == 3 and e.value.hint == "start it on the host: pct start 201"
    hosts = testbed.write_hosts_yaml(tmp_path / "hosts.yaml")
    hosts.write_text(hosts.read_text().replace("      ct201: {vmid: 201}", "      ct201: {vmid: 201}\n"
                                               "      ct999: {vmid: 999}", 1))
    import sys

    def run(args, env):  # the console script, as users run it: the kept connection when on
        return subprocess.run([str(Path(sys.executable).parent / "gpujob"), *args], env=env,
                              capture_output=True, timeout=120)
    for daemon in ("1", "0"):  # the direct path and the kept connection
        env = dict(env_for(hosts, tmp_path), GPUJOB_NO_DAEMON=daemon, XDG_RUNTIME_DIR=str(tmp_path / "run"))
        (tmp_path / "run").mkdir(mode=0o700, exist_ok=True)
        p = run(["exec", "ct201", "--", "true"], env)
        err = p.stderr.decode()
        assert p.returncode == 3 and err.startswith("gpujob: container 201 on ") and \
            "is not running (pct: CT 201 not running)" in err and \
            "  hint: start it on the host: pct start 201" in err, (daemon, err)
        p = run(["exec", "ct999", "--", "true"], env)
        err = p.stderr.decode()
        assert p.returncode == 3 and err.startswith("gpujob: no container 999 on ") and \
            "999.conf' does not exist" in err and "check the vmid in hosts.yaml" in err, (daemon, err)
    p = run(["hosts", "--json"], env)
    rows = {r["container"]: r for r in json.loads(p.stdout)["targets"]}
    assert rows["ct999"]["status"].startswith("no such vmid 999 on the host"), rows["ct999"]
    run(["disconnect"], env)


def test_unknown_host_key_refused_nothing_runs_accept_new_records(inv, testbed, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    hosts = testbed.write_hosts_yaml(tmp_path / "hosts.yaml", known_hosts=empty)
    env = env_for(hosts, tmp_path)
    marker = f"/tmp/should-not-exist-{os.getpid()}"
    p = cli(["exec", "ct200", "--", "touch", marker], env)
    assert p.returncode == 3
    first = p.stderr.decode().splitlines()[0]
    assert "is not known" in first and testbed.host_key_fingerprint in first
    assert "--accept-new" in p.stderr.decode()
    assert not testbed.container_path(marker).exists()
    p = cli(["--accept-new", "exec", "ct200", "--", "true"], env)
    assert p.returncode == 0, p.stderr
    assert f"[127.0.0.1]:{testbed.port} ssh-ed25519" in empty.read_text()
    assert cli(["exec", "ct200", "--", "true"], env).returncode == 0  # now known


def test_changed_host_key_always_refused(testbed, tmp_path):
    import paramiko
    other = paramiko.Ed25519Key.from_private_key_file(str(testbed.user_key))  # any other ed25519 key
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{testbed.port} ssh-ed25519 {other.get_base64()}\n")
    hosts = testbed.write_hosts_yaml(tmp_path / "hosts.yaml", known_hosts=kh)
    marker = f"/tmp/should-not-exist-{os.getpid()}-b"
    for flags in ([], ["--accept-new"]):
        p = cli([*flags, "exec", "ct200", "--", "touch", marker], env_for(hosts, tmp_path))
        assert p.returncode == 3
        assert "has CHANGED" in p.stderr.decode() and "ssh-keygen -R" in p.stderr.decode()
        assert b"Traceback" not in p.stderr
    assert not testbed.container_path(marker).exists()
    with pytest.raises(HostKeyError):
        Targets(load_inventory(hosts), accept_new=True).open("ct200").run(["true"])


def _host(tmp_path, testbed, **fields) -> Path:
    base = {"address": "127.0.0.1", "port": testbed.port, "user": "root",
            "identity_file": str(testbed.user_key), "known_hosts": str(testbed.known_hosts),
            "connect_timeout": 5}
    base.update(fields)
    import yaml
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"h": dict(base, containers={"c": {"vmid": 200}})}}))
    return path


@pytest.mark.parametrize("fields, expect", [
    ({"port": 1}, "connection refused by 127.0.0.1:1"),
    ({"address": "no-such-host.invalid"}, "cannot resolve host 'no-such-host.invalid' (DNS)"),
    ("wrong-key", "authentication failed for root@127.0.0.1"),
])
def test_connection_errors_say_what_failed_in_one_line(tmp_path, testbed, fields, expect):
    if fields == "wrong-key":
        key = tmp_path / "wrong"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        fields = {"identity_file": str(key)}
    env = env_for(_host(tmp_path, testbed, **fields), tmp_path)
    env["SSH_AUTH_SOCK"] = ""
    env["HOME"] = str(tmp_path)  # no ~/.ssh keys of the machine running the tests
    p = cli(["exec", "c", "--", "true"], env)
    assert p.returncode == 3, p.stderr
    lines = p.stderr.decode().splitlines()
    assert expect in lines[0] and len(lines) <= 2 and b"Traceback" not in p.stderr
    with pytest.raises(ConnectError):
        Targets(load_inventory(tmp_path / "hosts.yaml")).open("c").run(["true"])


def test_doctor_passes_non_gpu_checks_and_warns_on_gpus(inv, tmp_path):
    p = cli(["doctor", "tb/ct200", "--json"], env_for(inv, tmp_path))
    assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
    checks = {c["name"]: c["status"] for c in json.loads(p.stdout)["tb/ct200"]}
    for name in ("host", "pct", "container", "python3", "venv"):
        assert checks[name] == "ok", checks
    assert checks["gpus"] == "warn" and checks["nvidia-uvm"] == "warn"
    uv = next(c for c in json.loads(p.stdout)["tb/ct200"] if c["name"] == "uv")
    if checks["uv"] == "warn":  # the bed's container has no uv of its own: gpujob will ship one
        assert uv["detail"] == "no uv in the container" and "ships its own uv" in uv["hint"], uv
    else:  # an earlier test of the session shipped gpujob's uv there: doctor names it, and it is there
        assert checks["uv"] == "ok", uv
        there = cli(["exec", "tb/ct200", "--", "test", "-x", uv["detail"]], env_for(inv, tmp_path))
        assert there.returncode == 0, uv
    human = cli(["doctor", "ct200", "--spec", "jobs/dflash.yaml"], env_for(inv, tmp_path))
    assert human.returncode == 0 and b"nvidia-smi not found" in human.stdout
    stopped = cli(["doctor", "ct201", "--json"], env_for(inv, tmp_path))
    assert stopped.returncode == 1
    assert {c["name"]: c["status"] for c in json.loads(stopped.stdout)["tb/ct201"]}["container"] == "fail"


def test_hosts_lists_container_states(inv, tmp_path):
    p = cli(["hosts", "--json"], env_for(inv, tmp_path))
    assert p.returncode == 0, p.stderr
    rows = {r["container"]: r["status"] for r in json.loads(p.stdout)["targets"]}
    assert rows == {"ct200": "running", "ct201": "stopped"}


def test_proxy_jump_reaches_the_container_through_a_jump_host(testbed, tmp_path):
    """The bed's sshd is both the jump host and the target (a direct-tcpip hop to itself)."""
    hosts = _host(tmp_path, testbed, proxy_jump=f"root@127.0.0.1:{testbed.port}")
    env = env_for(hosts, tmp_path)
    p = cli(["exec", "c", "--", "cat", "/etc/debian_version"], env)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.strip()[:2].isdigit()
    bad = _host(tmp_path, testbed, proxy_jump="root@127.0.0.1:1")
    p = cli(["exec", "c", "--", "true"], env_for(bad, tmp_path))
    assert p.returncode == 3 and "connection refused by 127.0.0.1:1" in one_line(p)


def one_line(p) -> str:
    assert b"Traceback" not in p.stderr
    return p.stderr.decode().splitlines()[0]


def test_revoked_and_unreadable_known_hosts_are_one_line_exit_3(testbed, tmp_path):
    known = testbed.known_hosts.read_text()
    blob = known.split()[2]
    kh = tmp_path / "known_hosts"
    hosts = testbed.write_hosts_yaml(tmp_path / "hosts.yaml", known_hosts=kh)
    marker = f"/tmp/should-not-exist-{os.getpid()}-r"
    for text, expect in ((known + f"@revoked * ssh-ed25519 {blob}\n", "is marked @revoked"),
                         (f"@revoked * ssh-ed25519 {blob}\n", "is marked @revoked"),
                         (known + "[127.0.0.1]:22 ssh-ed25519 !!!\n", "cannot read this line")):
        kh.write_text(text)
        for flags in ([], ["--accept-new"]):
            p = cli([*flags, "exec", "ct200", "--", "touch", marker], env_for(hosts, tmp_path))
            assert p.returncode == 3, p.stderr.decode()
            lines = [ln for ln in p.stderr.decode().splitlines() if not ln.startswith("  hint:")]
            assert len(lines) == 1 and expect in lines[0], p.stderr.decode()
    assert not testbed.container_path(marker).exists()
    assert kh.read_text().count(blob) == 1  # --accept-new recorded nothing


def test_exec_over_ssh_with_an_idle_open_stdin_keeps_the_exit_code(inv, tmp_path):
    p = subprocess.Popen([*gpujob_argv(), "exec", "ct200", "--", "sh", "-c", "exit 7"],
                         env=env_for(inv, tmp_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=str(Path(__file__).resolve().parents[2]))
    try:
        p.wait(timeout=60)  # stdin open and idle all along
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
        p.stdin.close()
    assert p.returncode == 7 and b"Fatal Python error" not in err, err
    p = cli(["exec", "-n", "ct200", "--", "sh", "-c", "cat; exit 3"], env_for(inv, tmp_path),
            input=b"not for the command\n")
    assert p.returncode == 3 and p.stdout == b""


def test_a_revoked_key_is_refused_before_authentication_whatever_other_line_names_it(testbed, tmp_path):
    """Issue 24: with a plain line and an @revoked line for the same key, gpujob
    logged in (sshd's `Accepted publickey`) and only then refused."""
    known = testbed.known_hosts.read_text()
    blob = known.split()[2]
    kh = tmp_path / "known_hosts"
    hosts = testbed.write_hosts_yaml(tmp_path / "hosts.yaml", known_hosts=kh)
    logs = sorted(testbed.ssh_dir.glob("sshd*/sshd.log"))
    for text in (known + f"@revoked * ssh-ed25519 {blob}\n", f"@revoked * ssh-ed25519 {blob}\n" + known):
        kh.write_text(text)
        before = [log.read_text(errors="replace").count("Accepted publickey") for log in logs]
        p = cli(["exec", "ct200", "--", "true"], env_for(hosts, tmp_path))
        assert p.returncode == 3 and "refused before authentication" in one_line(p), p.stderr.decode()
        time.sleep(0.5)  # sshd writes its log line as the session starts
        after = [log.read_text(errors="replace").count("Accepted publickey") for log in logs]
        assert after == before, "gpujob authenticated to a host whose key is revoked"
