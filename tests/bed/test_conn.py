"""The kept connection (gpujob/conn): the thin client and the daemon on the loopback
test bed (real sshd, fake pct, a real LXC container). Every fast-path output is
compared byte for byte with the full CLI's; the daemon is killed (SIGKILL) idle
and mid-command, and a changed hosts.yaml or known_hosts must never ride an old
connection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from connkit import (HEAVY, alive, daemon_pid, daemons_of, env, same, sock_path,  # noqa: F401
                     started, traced_run, warm)
from helpers import REPO, cli, cli_direct, gpujob_argv, wait_for

pytestmark = pytest.mark.testbed


def test_exec_through_the_daemon_is_the_full_cli_byte_for_byte(env):
    argv = ["exec", "tb/ct200", "--", "sh", "-c", "echo out; echo 'err ✓' >&2; printf 'x\\0y'; exit 7"]
    first = cli(argv, dict(env, SECRET_TOKEN="hunter2"))  # runs directly, starts the daemon
    pid = started(env)
    assert alive(pid)
    st = os.stat(sock_path(env))
    assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.getuid()
    assert os.stat(sock_path(env).parent).st_mode & 0o777 == 0o700
    # it keeps none of the starting command's other variables (a token, say)
    daemon_environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    assert f"XDG_STATE_HOME={env['XDG_STATE_HOME']}".encode() in daemon_environ
    assert not [v for v in daemon_environ if v.startswith(b"SECRET_TOKEN=")]
    # the variables its key is made of (paths.ENV_KEYS) it keeps: it serves that environment
    assert f"GPUJOB_HOSTS={env['GPUJOB_HOSTS']}".encode() in daemon_environ
    assert (sock_path(env).name.startswith("conn-")
            and len(sock_path(env).name) == len("conn-0123456789abcdef.sock"))
    warm = cli(argv, env)
    full = cli_direct(argv, env)
    assert full.returncode == 7 and full.stdout == b"out\nx\0y" and full.stderr == "err ✓\n".encode()
    same(first, full)
    same(warm, full)
    assert daemon_pid(env) == pid  # one daemon served both
    # the warm client imported none of the heavy modules: it really was the fast path
    traced = traced_run(argv, env, extra=("-X", "importtime"))
    assert traced.returncode == 7
    loaded = {ln.split("|")[-1].strip().split(".")[0] for ln in traced.stderr.decode().splitlines()
              if ln.startswith("import time:")}
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_daemon_killed_idle_then_next_command_starts_a_new_one_quietly(env):
    pid = warm(env)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), 10, what="the daemon to die")
    assert sock_path(env).exists()  # stale: nobody answers there any more
    p = cli(["exec", "tb/ct200", "--", "echo", "hi"], env)
    assert (p.returncode, p.stdout, p.stderr) == (0, b"hi\n", b"")
    new = started(env)
    assert new != pid


def test_daemon_killed_mid_command(env, testbed):
    marker = "/tmp/conn-mid-" + str(os.getpid())
    pid = warm(env)
    p = subprocess.Popen([*gpujob_argv(), "exec", "tb/ct200", "--", "sh", "-c",
                          f"echo $$ > {marker}; sleep 60"], env=env, cwd=str(REPO),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    wait_for(lambda: testbed.container_path(marker).exists(), 60, what="the command to start")
    os.kill(pid, signal.SIGKILL)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3
    lines = err.decode().splitlines()
    assert len(lines) == 1 and "connection daemon ended" in lines[0] and "Traceback" not in err.decode()
    # the command does not live on in the container without its connection
    remote = testbed.container_path(marker).read_text().strip()
    wait_for(lambda: not testbed.container_path(f"/proc/{remote}").exists(), 30, what="the command to end")
    testbed.container_exec("rm", "-f", marker)
    # the retry works: no daemon answers there now, so it runs directly (and starts one)
    q = cli(["exec", "tb/ct200", "--", "echo", "again"], env)
    assert (q.returncode, q.stdout, q.stderr) == (0, b"again\n", b"")
    assert started(env) != pid
    testbed.container_exec("rm", "-f", marker)
    q = cli(["exec", "tb/ct200", "--", "echo", "again"], env)
    assert (q.returncode, q.stdout, q.stderr) == (0, b"again\n", b"")


@pytest.mark.parametrize("how", ["warm", "cold"])
def test_ctrl_c_ends_the_remote_command(env, testbed, how):
    """Warm: through the daemon. Cold (no daemon yet): through the daemon's handler run in
    the command itself (gpujob/daemon/oneshot.py); the same line, code and end."""
    marker = "/tmp/conn-int-" + str(os.getpid())
    if how == "warm":
        warm(env)
    p = subprocess.Popen([*gpujob_argv(), "exec", "tb/ct200", "--", "sh", "-c",
                          f"echo $$ > {marker}; sleep 60"], env=env, cwd=str(REPO),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    wait_for(lambda: testbed.container_path(marker).exists(), 60, what="the command to start")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err == b"\ninterrupted\n"
    remote = testbed.container_path(marker).read_text().strip()
    wait_for(lambda: not testbed.container_path(f"/proc/{remote}").exists(), 30, what="the command to end")
    testbed.container_exec("rm", "-f", marker)
    if how == "warm":
        assert daemon_pid(env) is not None  # the daemon itself carries on


def test_changed_hosts_yaml_or_known_hosts_never_rides_the_old_connection(env, testbed, tmp_path):
    pid = warm(env)
    inv = Path(env["GPUJOB_HOSTS"])
    good = inv.read_text()
    wrong_key = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)], check=True)
    inv.write_text(good.replace(str(testbed.user_key), str(wrong_key)))
    a, b = cli(["exec", "tb/ct200", "--", "true"], env), cli_direct(["exec", "tb/ct200", "--", "true"], env)
    same(a, b)
    assert a.returncode == 3 and b"authentication failed" in a.stderr
    inv.write_text(good)
    assert cli(["exec", "tb/ct200", "--", "true"], env).returncode == 0
    # an inventory that does not validate: the same one line as the full CLI
    inv.write_text(good.replace("port:", "prot:"))
    a, b = cli(["exec", "tb/ct200", "--", "true"], env), cli_direct(["exec", "tb/ct200", "--", "true"], env)
    same(a, b)
    assert a.returncode == 2
    inv.write_text(good)
    # a known_hosts that no longer knows the key: strict host keys, even with a warm connection
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    inv.write_text(good.replace(str(testbed.known_hosts), str(kh)))
    a, b = cli(["exec", "tb/ct200", "--", "true"], env), cli_direct(["exec", "tb/ct200", "--", "true"], env)
    same(a, b)
    assert a.returncode == 3 and b"not known" in a.stderr
    assert daemon_pid(env) == pid


def test_disconnect_idle_time_and_turning_it_off(env, tmp_path):
    pid = warm(env)
    p = cli(["disconnect"], env)
    assert p.returncode == 0 and b"closed the kept connection" in p.stdout
    wait_for(lambda: not alive(pid), 10, what="the daemon to end")
    assert not sock_path(env).exists()
    assert cli(["disconnect"], env).stdout == b"gpujob: no kept connection was open\n"
    # GPUJOB_NO_DAEMON=1: the full CLI, and no daemon
    p = cli(["exec", "tb/ct200", "--", "echo", "direct"], dict(env, GPUJOB_NO_DAEMON="1"))
    assert (p.returncode, p.stdout) == (0, b"direct\n") and daemon_pid(env) is None
    # idle time: a daemon with nothing to do ends by itself
    short = dict(env, GPUJOB_CONN_IDLE="1")
    pid = warm(short)
    wait_for(lambda: not alive(pid), 30, what="the idle daemon to end")
    assert not sock_path(env).exists()


def test_commands_at_once_start_one_daemon_and_another_setup_is_not_served(env, tmp_path):
    procs = [subprocess.Popen([*gpujob_argv(), "exec", "tb/ct200", "--", "echo", str(i)],
                              env=env, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL) for i in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [(p.returncode, o) for p, o in zip(procs, outs)] == [(0, (f"{i}\n".encode(), b""))
                                                                for i in range(4)]
    pid = started(env)
    assert daemons_of(env) == [pid]
    # another state directory (or HOME, or ssh-agent): that daemon is not used, the answer is the same
    other = dict(env, XDG_STATE_HOME=str(tmp_path / "other-state"))
    p = cli(["status"], other)
    same(p, cli_direct(["status"], other))
    assert p.returncode != 0
    assert (tmp_path / "other-state" / "gpujob").exists()
    assert daemon_pid(env) == pid


def test_the_full_cli_rides_the_kept_connection_too(env, testbed):
    """Commands the thin client does not serve run the full CLI, whose commands go to the
    daemon as frames (relay.py): same output; the first such command starts the daemon."""
    data = os.urandom(200_000)
    for args, stdin in ((["exec", "tb/ct200", "sha256sum"], data),          # no `--`: the full CLI
                        (["exec", "tb/ct200", "cat", "/etc/hostname", "/nonexistent"], None)):
        # (hosts, ps, the stopped and unknown containers: test_conn_contract.py)
        a = cli(args, env, input=stdin)
        if args == ["exec", "tb/ct200", "sha256sum"]:
            started(env)  # started by the full CLI's first command
        same(a, cli_direct(args, env, input=stdin))
    p = cli(["exec", "tb/ct200", "sha256sum"], env, input=data)
    assert p.returncode == 0 and len(p.stdout.split()[0]) == 64
    # the daemon killed while the full CLI's command runs: one line, exit 3; the next one works
    marker = "/tmp/conn-relay-" + str(os.getpid())
    pid = daemon_pid(env)
    # (a timeout written 1e3 is the full CLI's: the thin client takes plain numbers only)
    p = subprocess.Popen([*gpujob_argv(), "exec", "tb/ct200", "--timeout", "1e3", "--",
                          "sh", "-c", f"echo $$ > {marker}; sleep 60"], env=env, cwd=str(REPO),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    wait_for(lambda: testbed.container_path(marker).exists(), 60, what="the command to start")
    os.kill(pid, signal.SIGKILL)
    out, err = p.communicate(timeout=60)
    lines = err.decode().splitlines()
    assert p.returncode == 3 and len(lines) == 1 and "lost the connection daemon" in lines[0], err
    remote = testbed.container_path(marker).read_text().strip()
    wait_for(lambda: not testbed.container_path(f"/proc/{remote}").exists(), 30, what="the command to end")
    testbed.container_exec("rm", "-f", marker)
    q = cli(["exec", "tb/ct200", "echo", "again"], env)
    assert (q.returncode, q.stdout, q.stderr) == (0, b"again\n", b"")


def test_a_changed_gpujob_gets_a_daemon_of_its_own_and_ends_none(env):
    """An upgrade (here: a newer module file) has another key, so another socket: its first
    command runs directly and starts its own daemon; the old one is neither asked nor
    ended, finishes what it runs, and ends on its own once idle."""
    env = dict(env, GPUJOB_CONN_IDLE="4")
    old_sock = sock_path(env)
    old = warm(env)
    running = subprocess.Popen([*gpujob_argv(), "exec", "tb/ct200", "--", "sh", "-c",
                                "sleep 3; echo done"], env=env, cwd=str(REPO), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    time.sleep(1)
    module = REPO / "gpujob" / "conn" / "proto.py"
    st = module.stat()
    try:
        os.utime(module, ns=(st.st_atime_ns, time.time_ns() + 10**10))  # the newest file now
        assert sock_path(env) != old_sock
        p = cli(["exec", "tb/ct200", "--", "echo", "new"], env)
        assert (p.returncode, p.stdout, p.stderr) == (0, b"new\n", b""), p.stderr.decode()
        new = started(env)
        assert new != old and alive(old)
        q = cli(["exec", "tb/ct200", "--", "echo", "warm"], env)
        assert (q.returncode, q.stdout) == (0, b"warm\n") and daemon_pid(env) == new
        out, err = running.communicate(timeout=60)
        assert (running.returncode, out, err) == (0, b"done\n", b"")
        assert alive(old)  # nobody ended it
        wait_for(lambda: not alive(old), 30, what="the old daemon to idle out")
        assert not old_sock.exists()
    finally:
        os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_each_environment_keeps_its_own_daemon(env, tmp_path):
    """Two terminals (here: two HOMEs; another SSH_AUTH_SOCK, state dir or hosts file is
    the same) each keep a daemon: each is served warm by its own, `disconnect` ends only
    this environment's, `disconnect --all` every one of this user's."""
    other = dict(env, HOME=str(tmp_path / "home-b"))
    (tmp_path / "home-b").mkdir()
    a, b = warm(env), warm(other)
    assert a != b and sock_path(env) != sock_path(other) and sock_path(env).parent == sock_path(other).parent
    for e, pid in ((env, a), (other, b), (env, a)):
        p = cli(["exec", "tb/ct200", "--", "echo", "hi"], e)
        assert (p.returncode, p.stdout, p.stderr) == (0, b"hi\n", b"") and daemon_pid(e) == pid
    assert alive(a) and alive(b)
    p = cli(["disconnect"], other)
    assert p.stdout == b"gpujob: closed the kept connection (its SSH connections are closed)\n"
    wait_for(lambda: not alive(b), 10, what="B's daemon to end")
    assert alive(a) and daemon_pid(env) == a
    b = warm(other)
    p = cli(["disconnect", "--all"], env)
    assert (p.returncode, p.stdout) == (0, b"gpujob: closed 2 kept connections (their SSH connections are "
                                           b"closed)\n")
    wait_for(lambda: not alive(a) and not alive(b), 10, what="both daemons to end")
    assert cli(["disconnect", "--all"], env).stdout == b"gpujob: no kept connection was open\n"
    assert not list(sock_path(env).parent.glob("*.sock"))


def test_a_runtime_dir_not_private_is_refused(tmp_path):
    from gpujob.conn import paths
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    (tmp_path / "real").mkdir(mode=0o700)
    for bad in (loose, theirs, link):
        with pytest.raises(paths.NoDaemon):
            paths._private_dir(bad, create=False)
    ok = tmp_path / "ok"
    assert paths._private_dir(ok, create=True) == ok and ok.stat().st_mode & 0o777 == 0o700


def test_the_code_stamp_sees_every_module_of_the_package(tmp_path):
    """A daemon runs the CLI's bodies, the daemon package, the targets, the transports and
    ships the agent: an edit to any module, at any depth, is another key (bytecode is not)."""
    from gpujob.conn import paths
    files = ["entry.py", "daemon/server.py", "ops/bodies.py", "agent/home/journal.py"]
    for f in files + ["daemon/__pycache__/server.cpython-311.pyc"]:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
        os.utime(tmp_path / f, ns=(0, 10**18))
    base = paths.code_stamp(str(tmp_path))
    assert base == paths.code_stamp(str(tmp_path))
    os.utime(tmp_path / "daemon/__pycache__/server.cpython-311.pyc", ns=(0, 2 * 10**18))
    assert paths.code_stamp(str(tmp_path)) == base
    for n, f in enumerate(files):
        os.utime(tmp_path / f, ns=(0, 10**18 + (n + 1) * 10**9))
        stamp = paths.code_stamp(str(tmp_path))
        assert stamp != base, f
        base = stamp


def test_the_shipped_agent_carries_bytecode_its_python_loads(tmp_path):
    """The agent zip is written with .pyc compiled by the python that runs it (zipimport
    caches none itself); every module loads from that bytecode and the agent runs."""
    from gpujob.ops.target import AGENT_MODULES, BOOTSTRAP, agent_zip
    import zipfile
    dest = tmp_path / "bin" / "agent-x.pyz"
    data, _ = agent_zip()
    subprocess.run(["python3", "-c", BOOTSTRAP, str(dest)], input=data, check=True)
    names = set(zipfile.ZipFile(dest).namelist())
    assert {f"gpujob/agent/{m}c" for m in AGENT_MODULES} <= names
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import gpujob.agent.main as m, "
             "gpujob.agent.home.journal as j;print(m.__file__, j.__file__)")
    files = subprocess.run(["python3", "-c", probe, str(dest)], capture_output=True, text=True,
                           check=True).stdout
    assert all(f.endswith(".pyc") for f in files.split()), files
    p = subprocess.run(["python3", str(dest), "--home", str(tmp_path / "home"), "status"],
                       capture_output=True)
    assert p.returncode == 0 and json.loads(p.stdout)["jobs"] == []


def test_the_connection_bench_produces_its_figures(testbed, tmp_path, capsys):
    """bench/conn.py in quick mode, so its code cannot rot; no timing is asserted."""
    from bench.conn import main
    out = tmp_path / "conn.json"
    assert main(["--quick", "--json", str(out)], bed=testbed) == 0
    res = json.loads(out.read_text())
    assert set(res["medians_ms"]) == {"ssh", "exec_warm", "exec_warm_b", "status_warm", "exec_full",
                                      "status_full",
                                     "exec_cold", "ps_warm", "ps_full"}
    assert all(v > 0 for v in res["medians_ms"].values())
    assert res["figures"]["exec_warm"]["ratio"] > 0 and res["figures"]["exec_two_envs"]["ratio"] > 0
    assert "| command | median |" in capsys.readouterr().out


def test_a_local_target_never_starts_a_daemon(tmp_path):
    from helpers import local_env
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(local_env(tmp_path), XDG_RUNTIME_DIR=str(runtime))
    env.pop("GPUJOB_NO_DAEMON", None)
    (tmp_path / "root").mkdir()
    for args in (["exec", "lab/box", "--", "echo", "hi"], ["exec", "box", "echo", "hi"]):
        a, b = cli(args, env), cli_direct(args, env)
        same(a, b)
        assert a.stdout == b"hi\n"
    time.sleep(1)
    assert not daemons_of(env) and not sock_path(env).exists()


def test_the_link_below_the_daemon_breaking_is_the_full_clis_own_error(env, testbed):
    """The daemon's SSH connection cut while the full CLI's command runs over it: the
    command ends as it does directly (`lost the connection to …`, exit 3), never as if the
    daemon had died; the next command gets a new connection."""
    marker = "/tmp/conn-cut-" + str(os.getpid())
    warm(env)
    # (a timeout written 1e3 is the full CLI's: the thin client takes plain numbers only)
    p = subprocess.Popen([*gpujob_argv(), "exec", "tb/ct200", "--timeout", "1e3", "--", "sh", "-c",
                          f"echo $$ > {marker}; sleep 30"],
                         env=env, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL)
    wait_for(lambda: testbed.container_path(marker).exists(), 60, what="the command to start")
    assert testbed.kill_ssh_sessions() >= 1
    out, err = p.communicate(timeout=60)
    testbed.container_exec("rm", "-f", marker)
    lines = err.decode().splitlines()
    assert p.returncode == 3 and lines and "lost the connection to" in lines[0], err
    assert "connection daemon" not in err.decode() and "Traceback" not in err.decode()
    q = cli(["exec", "tb/ct200", "--", "echo", "again"], env)
    assert (q.returncode, q.stdout, q.stderr) == (0, b"again\n", b"")


def test_a_daemon_whose_socket_is_gone_ends(tmp_path):
    """Its runtime dir removed (the suite's reaper does that; so can a logout), nobody new
    can reach a daemon: it ends by itself (after what runs there), long before its idle time."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), GPUJOB_CONN_IDLE="600",
               XDG_STATE_HOME=str(tmp_path / "state"))
    p = subprocess.Popen([sys.executable, "-m", "gpujob.daemon", "serve"], env=env, cwd="/",
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        sock = sock_path(env)
        wait_for(lambda: daemon_pid(env) == p.pid, 60, what="the daemon to listen")
        sock.unlink()
        p.wait(timeout=20)  # the idle time is 600 s
    finally:
        if p.poll() is None:
            p.kill()
