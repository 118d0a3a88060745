"""Tests of the loopback Proxmox test bed itself, through the real OpenSSH client."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from helpers import HANG, wait_for
from testbed import TestBed, bed_processes

pytestmark = pytest.mark.testbed


def ssh(bed: TestBed, *remote: str, input: bytes | None = None, timeout: float = 60,
        port: int | None = None) -> subprocess.CompletedProcess:
    """Run a remote command; each element of ``remote`` is one argv word (quoted here)."""
    return subprocess.run(bed.ssh_argv(*(shlex.quote(a) for a in remote), port=port),
                          input=input if input is not None else b"", capture_output=True,
                          timeout=timeout)


def test_pct_list(testbed):
    r = ssh(testbed, "pct", "list")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert lines[0].split() == ["VMID", "Status", "Lock", "Name"]
    assert lines[0].startswith("VMID       Status     Lock         Name")
    rows = {ln.split()[0]: ln.split()[1:] for ln in lines[1:]}
    assert rows["200"][0] == "running"
    assert rows["201"][0] == "stopped"
    assert len(rows) == 2


def test_pct_status(testbed):
    r = ssh(testbed, "pct", "status", "200")
    assert (r.returncode, r.stdout) == (0, b"status: running\n")
    r = ssh(testbed, "pct", "status", "201")
    assert (r.returncode, r.stdout) == (0, b"status: stopped\n")


def test_pct_is_the_fake_on_path(testbed):
    r = subprocess.run(testbed.ssh_argv("command -v pct"), capture_output=True, timeout=30)
    assert r.stdout.decode().strip() == str(testbed.bin_dir / "pct")


def test_host_key_fingerprint_and_known_hosts(testbed):
    kh = testbed.known_hosts.read_text().split()
    assert kh[0] == f"[127.0.0.1]:{testbed.port}" and kh[1] == "ssh-ed25519"
    out = subprocess.run(["ssh-keygen", "-lf", str(testbed.known_hosts)],
                         capture_output=True, text=True, check=True).stdout
    assert testbed.host_key_fingerprint in out


def test_unknown_host_key_is_refused(testbed, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    argv = testbed.ssh_argv("true")
    argv[argv.index(f"UserKnownHostsFile={testbed.known_hosts}")] = f"UserKnownHostsFile={empty}"
    r = subprocess.run(argv, capture_output=True, timeout=30)
    assert r.returncode == 255
    assert b"Host key verification failed" in r.stderr


def test_exec_argv_round_trip(testbed):
    r = ssh(testbed, "pct", "exec", "200", "--", "python3", "-c",
            "import sys; print(sys.argv)", "a b", "", "$HOME", "it's", '"q"', "*")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == str(["-c", "a b", "", "$HOME", "it's", '"q"', "*"]) + "\n"


@pytest.mark.parametrize("code", [0, 1, 7, 255])
def test_exec_exit_codes(testbed, code):
    r = ssh(testbed, "pct", "exec", "200", "--", "sh", "-c", f"exit {code}")
    assert r.returncode == code, r.stderr


def test_exec_stdin_and_no_pty(testbed):
    data = os.urandom(1 << 20)
    r = ssh(testbed, "pct", "exec", "200", "--", "sha256sum", input=data)
    assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    r = ssh(testbed, "pct", "exec", "200", "--", "python3", "-c",
            "import os,sys; print(sys.stdin.read().upper(), os.isatty(0), os.isatty(1))",
            input=b"hello")
    assert r.stdout == b"HELLO False False\n"


def test_exec_stderr_separate_and_env(testbed):
    r = ssh(testbed, "pct", "exec", "200", "--", "sh", "-c",
            'echo out; echo err >&2; echo "$HOME"; pwd; cat /etc/hostname')
    assert r.stdout == b"out\n/root\n/root\nct200\n"
    assert r.stderr == b"err\n"


def test_container_sees_host_loopback(testbed):
    # the container shares the host's network namespace: the bed's sshd is reachable
    r = testbed.container_exec("python3", "-c",
                               "import socket,sys; s=socket.create_connection(('127.0.0.1',"
                               f"{testbed.port})); print(s.recv(8).decode())")
    assert r.stdout == b"SSH-2.0-\n", r.stderr


def test_exec_stopped_container(testbed):
    r = ssh(testbed, "pct", "exec", "201", "--", "true")
    assert r.returncode == 255
    assert r.stderr == b"CT 201 not running\n"


def test_proxmox_errors(testbed):
    r = ssh(testbed, "pct", "exec", "abc", "--", "true")
    assert r.returncode == 255
    err = r.stderr.decode()
    assert err.startswith("400 Parameter verification failed.\n")
    assert "vmid: type check ('integer') failed - got 'abc'\n" in err
    r = ssh(testbed, "pct", "status", "999")
    assert r.returncode == 2
    assert r.stderr.decode().startswith("Configuration file 'nodes/")
    assert r.stderr.decode().rstrip().endswith("/lxc/999.conf' does not exist")
    r = ssh(testbed, "pct", "exec", "999", "--", "true")
    assert r.returncode == 2


def test_push_pull_round_trip(testbed, tmp_path):
    src = tmp_path / "src.bin"
    data = os.urandom(300_000) + b"\n\0end"
    src.write_bytes(data)
    r = ssh(testbed, "pct", "push", "200", str(src), "/root/pushed.bin", "--perms", "0600")
    assert r.returncode == 0, r.stderr
    inside = testbed.container_path("/root/pushed.bin")
    assert inside.read_bytes() == data
    assert inside.stat().st_mode & 0o777 == 0o600
    r = ssh(testbed, "pct", "push", "200", str(src), "/root/default.bin")
    assert r.returncode == 0 and testbed.container_path("/root/default.bin").stat().st_mode & 0o777 == 0o644
    back = tmp_path / "back.bin"
    r = ssh(testbed, "pct", "pull", "200", "/root/pushed.bin", str(back))
    assert r.returncode == 0, r.stderr
    assert back.read_bytes() == data
    r = ssh(testbed, "pct", "pull", "200", "/root/does-not-exist", str(tmp_path / "x"))
    assert r.returncode == 255 and not (tmp_path / "x").exists()
    r = ssh(testbed, "pct", "push", "200", str(src), "/no/such/dir/file")
    assert r.returncode == 255
    r = ssh(testbed, "pct", "push", "201", str(src), "/root/x")
    assert r.returncode == 255 and r.stderr == b"CT 201 not running\n"


def test_container_exec_and_path(testbed):
    r = testbed.container_exec("sh", "-c", "cat > /root/from-stdin; id -u; echo $HOME",
                               input=b"payload")
    assert r.returncode == 0 and r.stdout == b"0\n/root\n"
    assert testbed.container_path("/root/from-stdin").read_bytes() == b"payload"


def test_orphans_are_reaped(testbed):
    # a double-forked daemon that exits must not stay a zombie (init reaps it)
    r = testbed.container_exec("sh", "-c", "(sh -c 'sleep 0.2' & echo $! > /tmp/dpid) ; cat /tmp/dpid")
    pid = r.stdout.decode().strip()

    def gone() -> bool:  # a zombie would answer kill -0 for ever
        r = testbed.container_exec("sh", "-c", f"kill -0 {pid} 2>/dev/null && echo alive || echo gone")
        return r.stdout == b"gone\n"
    wait_for(gone, HANG, 0.2, "the orphan to be reaped")


def test_kill_ssh_sessions(testbed):
    p = subprocess.Popen(testbed.ssh_argv("pct", "exec", "200", "--", "sleep", str(int(10 * HANG))),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(testbed.session_pids, HANG, 0.05, "the ssh session")
        time.sleep(0.3)
        assert p.poll() is None
        assert testbed.kill_ssh_sessions() >= 1
        try:  # killed: its sleep would have run 10 x HANG and ended 0
            rc = p.wait(timeout=HANG)
        except subprocess.TimeoutExpired:
            raise AssertionError("hung: the session outlived kill_ssh_sessions") from None
        assert rc != 0
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
    assert all(pid in testbed.processes() for pid in testbed.sshd_pids)  # listener alive
    r = ssh(testbed, "pct", "status", "200")
    assert r.stdout == b"status: running\n"


def test_write_hosts_yaml(testbed, tmp_path):
    path = testbed.write_hosts_yaml(tmp_path / "hosts.yaml",
                                    extra_hosts="  other:\n    address: 10.0.0.1\n")
    text = path.read_text()
    assert f"port: {testbed.port}" in text and "ct200: {vmid: 200}" in text
    try:
        import yaml
    except ImportError:
        return
    doc = yaml.safe_load(text)
    tb = doc["hosts"]["tb"]
    assert tb["address"] == "127.0.0.1" and tb["user"] == "root"
    assert tb["identity_file"] == str(testbed.user_key)
    assert tb["known_hosts"] == str(testbed.known_hosts)
    assert tb["containers"] == {"ct200": {"vmid": 200}, "ct201": {"vmid": 201}}
    assert doc["hosts"]["other"] == {"address": "10.0.0.1"}


def test_second_bed_multi_sshd_and_clean_teardown():
    """A second bed (with 2 sshd's) coexists with the session bed, and stopping it
    leaves no process, sshd or lxc, behind."""
    bed = TestBed.start(n_sshd=2)
    root = bed.root
    try:
        assert len(set(bed.ports)) == 2 and len(set(bed.host_key_fingerprints)) == 2
        for port in bed.ports:
            r = ssh(bed, "pct", "status", "200", port=port)
            assert r.stdout == b"status: running\n", r.stderr
        port3 = bed.start_extra_sshd()
        r = ssh(bed, "pct", "exec", "200", "--", "cat", "/etc/hostname", port=port3)
        assert r.stdout == b"ct200\n"
        # leave a live session and a stray process behind on purpose
        p = subprocess.Popen(bed.ssh_argv("sleep", "60"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        wait_for(lambda: len(bed.processes()) >= 5, HANG, what="the live session's processes")
    finally:
        bed.stop()
    p.wait(timeout=HANG)
    assert not root.exists()
    assert bed_processes(root) == set()
    needle = str(root).encode()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            assert needle not in cmd, (pid, cmd)
