"""The kept connection (gpujob/conn): the thin client and the daemon on the loopback
test bed (real sshd, fake pct, a real LXC container). Every fast-path output is
compared byte for byte with the full CLI's; the daemon is killed (SIGKILL) idle
and mid-command, and a changed hosts.yaml or known_hosts must never ride an old
connection."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
import yaml

from gpujob.wheelhouse import build_indexes, serve
from helpers import REPO, cli, job_id_of, wait_for, write_spec

pytestmark = pytest.mark.testbed

HEAVY = ("typer", "rich", "paramiko", "pydantic")


def fast(args, env, *, input=None, timeout=120, extra=()):
    """``gpujob ARGS`` through the console entry point (what the installed script runs)."""
    return subprocess.run([sys.executable, *extra, "-m", "gpujob.conn.entry", *args], env=env, input=input,
                          capture_output=True, timeout=timeout, cwd=str(REPO))


def sock_path(env) -> Path:
    return Path(env["XDG_RUNTIME_DIR"]) / "gpujob" / "conn.sock"


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
    assert fast(["exec", "tb/ct200", "--", "true"], env).returncode == 0
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
            if d.isdigit() and b"gpujob.conn\0serve" in open(f"/proc/{d}/cmdline", "rb").read() and \
                    mine in open(f"/proc/{d}/environ", "rb").read().split(b"\0") and alive(int(d)):
                found.append(int(d))
        except OSError:
            pass
    return found


def end_daemons(env) -> None:
    """`gpujob disconnect`, then SIGKILL whatever of this test's daemons is left (one still
    starting when a test failed, say): no test leaves one behind."""
    fast(["disconnect"], env)
    try:
        wait_for(lambda: not daemons_of(env), 10, what="the daemons to end")
    except AssertionError:
        for pid in daemons_of(env):
            os.kill(pid, signal.SIGKILL)


def same(a: subprocess.CompletedProcess, b: subprocess.CompletedProcess) -> None:
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)


def test_exec_through_the_daemon_is_the_full_cli_byte_for_byte(env):
    argv = ["exec", "tb/ct200", "--", "sh", "-c", "echo out; echo 'err ✓' >&2; printf 'x\\0y'; exit 7"]
    first = fast(argv, dict(env, SECRET_TOKEN="hunter2"))  # runs directly, starts the daemon
    pid = started(env)
    assert alive(pid)
    st = os.stat(sock_path(env))
    assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.getuid()
    assert os.stat(sock_path(env).parent).st_mode & 0o777 == 0o700
    # it keeps none of the starting command's other variables (a token, say)
    daemon_environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    assert f"XDG_STATE_HOME={env['XDG_STATE_HOME']}".encode() in daemon_environ
    assert not [v for v in daemon_environ if v.startswith((b"GPUJOB_HOSTS=", b"SECRET_TOKEN="))]
    warm = fast(argv, env)
    full = cli(argv, env)
    assert full.returncode == 7 and full.stdout == b"out\nx\0y" and full.stderr == "err ✓\n".encode()
    same(first, full)
    same(warm, full)
    assert daemon_pid(env) == pid  # one daemon served both
    # the warm client imported none of the heavy modules: it really was the fast path
    traced = fast(argv, env, extra=("-X", "importtime"))
    assert traced.returncode == 7
    loaded = {ln.split("|")[-1].strip().split(".")[0] for ln in traced.stderr.decode().splitlines()
              if ln.startswith("import time:")}
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_exec_stdin_timeout_and_errors_match(env, testbed):
    data = os.urandom(300_000)
    a = fast(["exec", "tb/ct200", "--", "sha256sum"], env, input=data)
    b = cli(["exec", "tb/ct200", "--", "sha256sum"], env, input=data)
    same(a, b)
    assert a.returncode == 0 and len(a.stdout.split()[0]) == 64
    for argv in (["exec", "tb/ct200", "--timeout", "1", "--", "sleep", "30"],
                 ["exec", "nosuch", "--", "true"],
                 ["exec", "tb/ct201", "--", "true"],              # a stopped container
                 ["exec", "-n", "tb/ct200", "--", "cat"],
                 ["exec", "tb/ct200", "--", "no-such-command"]):
        a, b = fast(argv, env), cli(argv, env)
        same(a, b)
        assert a.returncode != 0 or argv[1] == "-n", argv


def _pty_run(cmd, env) -> tuple[int, bytes]:
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


@pytest.fixture(scope="module")
def finished_job(testbed, tmp_path_factory):
    """One short job run to its end on the bed (through the full CLI), for status."""
    tmp = tmp_path_factory.mktemp("connjob")
    root = tmp / "index"
    build_indexes(root)
    server, url = serve(root)
    home = "/root/gj-conn-status"
    inv = {"hosts": {"tb": {"address": "127.0.0.1", "port": testbed.port, "user": "root",
                            "identity_file": str(testbed.user_key), "known_hosts": str(testbed.known_hosts),
                            "containers": {"ct200": {"vmid": 200, "home": home}}}}}
    (tmp / "hosts.yaml").write_text(yaml.safe_dump(inv))
    e = dict(os.environ, GPUJOB_HOSTS=str(tmp / "hosts.yaml"), XDG_STATE_HOME=str(tmp / "state"))
    spec = write_spec(tmp / "job.yaml", target="tb/ct200", fast_url=f"{url}/fast/simple",
                      slow_url=f"{url}/slow/simple", profile="fast", trainer_args="--steps 8 --interval 0.1",
                      warmup=False)
    try:
        job = job_id_of(cli(["submit", str(spec)], e, check=True).stdout)
        wait_for(lambda: json.loads(cli(["status", job, "--json"], e, check=True).stdout)["state"]
                 in ("succeeded", "failed"), 240, 1, what="the job to end")
        yield job, e
    finally:
        server.shutdown()
        testbed.container_exec("rm", "-rf", home)


def test_status_through_the_daemon_is_the_full_cli(finished_job, tmp_path):
    job, base = finished_job
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(base, XDG_RUNTIME_DIR=str(runtime), COLUMNS="200")
    env.pop("GPUJOB_NO_DAEMON", None)
    try:
        fast(["status", job], env)
        started(env)
        for args in (["status", job], ["status"], ["status", job, "--json"], ["status", "--json"],
                     ["status", job, "-t", "tb/ct200"], ["status", "nosuchjob"]):
            a, b = fast(args, env), cli(args, env)
            same(a, b)
        assert b"succeeded" in fast(["status", job], env).stdout
        # a multi-node job (the index names its nodes): the full CLI's fleet view, not the daemon's
        from gpujob.state import State
        old_state = os.environ.get("XDG_STATE_HOME")
        os.environ["XDG_STATE_HOME"] = env["XDG_STATE_HOME"]
        try:
            st = State()
            st.reserve("fleet-conn-1", "fleet", "tb/ct200", "/x.yaml", "h", "fast")
            st.set_nodes("fleet-conn-1", ["tb/ct200", "tb/ct200"])
            st.close()
        finally:
            os.environ["XDG_STATE_HOME"] = old_state or ""
            if old_state is None:
                del os.environ["XDG_STATE_HOME"]
        for args in (["status", "fleet-conn-1"], ["status"]):
            same(fast(args, env), cli(args, env))
        # a terminal: width from the terminal itself, colours from TERM
        tty = dict(env, TERM="xterm-256color")
        tty.pop("COLUMNS", None)
        a = _pty_run([sys.executable, "-m", "gpujob.conn.entry", "status", job], tty)
        b = _pty_run([sys.executable, "-m", "gpujob.cli.main", "status", job], tty)
        assert a == b and a[0] == 0 and b"\x1b[" in a[1]
    finally:
        end_daemons(env)


def test_daemon_killed_idle_then_next_command_starts_a_new_one_quietly(env):
    pid = warm(env)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), 10, what="the daemon to die")
    assert sock_path(env).exists()  # stale: nobody answers there any more
    p = fast(["exec", "tb/ct200", "--", "echo", "hi"], env)
    assert (p.returncode, p.stdout, p.stderr) == (0, b"hi\n", b"")
    new = started(env)
    assert new != pid


def test_daemon_killed_mid_command(env, testbed):
    marker = "/tmp/conn-mid-" + str(os.getpid())
    pid = warm(env)
    p = subprocess.Popen([sys.executable, "-m", "gpujob.conn.entry", "exec", "tb/ct200", "--", "sh", "-c",
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
    q = fast(["exec", "tb/ct200", "--", "echo", "again"], env)
    assert (q.returncode, q.stdout, q.stderr) == (0, b"again\n", b"")


def test_ctrl_c_ends_the_remote_command(env, testbed):
    marker = "/tmp/conn-int-" + str(os.getpid())
    warm(env)
    p = subprocess.Popen([sys.executable, "-m", "gpujob.conn.entry", "exec", "tb/ct200", "--", "sh", "-c",
                          f"echo $$ > {marker}; sleep 60"], env=env, cwd=str(REPO),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    wait_for(lambda: testbed.container_path(marker).exists(), 60, what="the command to start")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err == b"\ninterrupted\n"
    remote = testbed.container_path(marker).read_text().strip()
    wait_for(lambda: not testbed.container_path(f"/proc/{remote}").exists(), 30, what="the command to end")
    testbed.container_exec("rm", "-f", marker)
    assert daemon_pid(env) is not None  # the daemon itself carries on


def test_changed_hosts_yaml_or_known_hosts_never_rides_the_old_connection(env, testbed, tmp_path):
    pid = warm(env)
    inv = Path(env["GPUJOB_HOSTS"])
    good = inv.read_text()
    wrong_key = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)], check=True)
    inv.write_text(good.replace(str(testbed.user_key), str(wrong_key)))
    a, b = fast(["exec", "tb/ct200", "--", "true"], env), cli(["exec", "tb/ct200", "--", "true"], env)
    same(a, b)
    assert a.returncode == 3 and b"authentication failed" in a.stderr
    inv.write_text(good)
    assert fast(["exec", "tb/ct200", "--", "true"], env).returncode == 0
    # an inventory that does not validate: the same one line as the full CLI
    inv.write_text(good.replace("port:", "prot:"))
    a, b = fast(["exec", "tb/ct200", "--", "true"], env), cli(["exec", "tb/ct200", "--", "true"], env)
    same(a, b)
    assert a.returncode == 2
    inv.write_text(good)
    # a known_hosts that no longer knows the key: strict host keys, even with a warm connection
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    inv.write_text(good.replace(str(testbed.known_hosts), str(kh)))
    a, b = fast(["exec", "tb/ct200", "--", "true"], env), cli(["exec", "tb/ct200", "--", "true"], env)
    same(a, b)
    assert a.returncode == 3 and b"not known" in a.stderr
    assert daemon_pid(env) == pid


def test_disconnect_idle_time_and_turning_it_off(env, tmp_path):
    pid = warm(env)
    p = fast(["disconnect"], env)
    assert p.returncode == 0 and b"closed the kept connection" in p.stdout
    wait_for(lambda: not alive(pid), 10, what="the daemon to end")
    assert not sock_path(env).exists()
    assert fast(["disconnect"], env).stdout == b"gpujob: no kept connection was open\n"
    # GPUJOB_NO_DAEMON=1: the full CLI, and no daemon
    p = fast(["exec", "tb/ct200", "--", "echo", "direct"], dict(env, GPUJOB_NO_DAEMON="1"))
    assert (p.returncode, p.stdout) == (0, b"direct\n") and daemon_pid(env) is None
    # idle time: a daemon with nothing to do ends by itself
    short = dict(env, GPUJOB_CONN_IDLE="1")
    pid = warm(short)
    wait_for(lambda: not alive(pid), 30, what="the idle daemon to end")
    assert not sock_path(env).exists()


def test_commands_at_once_start_one_daemon_and_another_setup_is_not_served(env, tmp_path):
    procs = [subprocess.Popen([sys.executable, "-m", "gpujob.conn.entry", "exec", "tb/ct200", "--", "echo", str(i)],
                              env=env, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL) for i in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [(p.returncode, o) for p, o in zip(procs, outs)] == [(0, (f"{i}\n".encode(), b"")) for i in range(4)]
    pid = started(env)
    assert daemons_of(env) == [pid]
    # another state directory (or HOME, or ssh-agent): that daemon is not used, the answer is the same
    other = dict(env, XDG_STATE_HOME=str(tmp_path / "other-state"))
    p = fast(["status"], other)
    same(p, cli(["status"], other))
    assert p.returncode != 0
    assert (tmp_path / "other-state" / "gpujob").exists()
    assert daemon_pid(env) == pid


def test_the_full_cli_rides_the_kept_connection_too(env, testbed):
    """Commands the thin client does not serve run the full CLI, whose commands go to the
    daemon as frames (relay.py): same output; the first such command starts the daemon."""
    data = os.urandom(200_000)
    for args, stdin in ((["exec", "tb/ct200", "sha256sum"], data),          # no `--`: the full CLI
                        (["exec", "tb/ct200", "cat", "/etc/hostname", "/nonexistent"], None),
                        (["hosts"], None), (["hosts", "--json"], None), (["ps"], None),
                        (["exec", "tb/ct201", "true"], None), (["exec", "nosuch", "true"], None)):
        a = fast(args, env, input=stdin)
        if args == ["exec", "tb/ct200", "sha256sum"]:
            started(env)  # started by the full CLI's first command
        same(a, cli(args, env, input=stdin))
    p = fast(["exec", "tb/ct200", "sha256sum"], env, input=data)
    assert p.returncode == 0 and len(p.stdout.split()[0]) == 64
    # the daemon killed while the full CLI's command runs: one line, exit 3; the next one works
    marker = "/tmp/conn-relay-" + str(os.getpid())
    pid = daemon_pid(env)
    # (a timeout written 1e3 is the full CLI's: the thin client takes plain numbers only)
    p = subprocess.Popen([sys.executable, "-m", "gpujob.conn.entry", "exec", "tb/ct200", "--timeout", "1e3", "--",
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
    q = fast(["exec", "tb/ct200", "echo", "again"], env)
    assert (q.returncode, q.stdout, q.stderr) == (0, b"again\n", b"")


def test_a_changed_gpujob_takes_over_after_what_runs_ends(env):
    """An upgrade (here: a newer module file) is not served by the old daemon: it answers
    'fall back', lets its running command finish, and ends; the next command starts a new one."""
    old = warm(env)
    running = subprocess.Popen([sys.executable, "-m", "gpujob.conn.entry", "exec", "tb/ct200", "--", "sh", "-c",
                                "sleep 3; echo done"], env=env, cwd=str(REPO), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    time.sleep(1)
    module = REPO / "gpujob" / "conn" / "proto.py"
    st = module.stat()
    try:
        os.utime(module, ns=(st.st_atime_ns, time.time_ns() + 10**10))  # the newest file now
        p = fast(["exec", "tb/ct200", "--", "echo", "new"], env)
        assert (p.returncode, p.stdout, p.stderr) == (0, b"new\n", b""), p.stderr.decode()
        out, err = running.communicate(timeout=60)
        assert (running.returncode, out, err) == (0, b"done\n", b"")
        wait_for(lambda: not alive(old), 20, what="the old daemon to end")
        new = warm(env)
        assert new != old
    finally:
        os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns))


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


def test_the_shipped_agent_carries_bytecode_its_python_loads(tmp_path):
    """The agent zip is written with .pyc compiled by the python that runs it (zipimport
    caches none itself); every module loads from that bytecode and the agent runs."""
    from gpujob.target import AGENT_MODULES, BOOTSTRAP, agent_zip
    import zipfile
    dest = tmp_path / "bin" / "agent-x.pyz"
    data, _ = agent_zip()
    subprocess.run(["python3", "-c", BOOTSTRAP, str(dest)], input=data, check=True)
    names = set(zipfile.ZipFile(dest).namelist())
    assert {f"gpujob/agent/{m}c" for m in AGENT_MODULES} <= names
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import gpujob.agent.main as m, gpujob.agent.journal as j;"
             "print(m.__file__, j.__file__)")
    files = subprocess.run(["python3", "-c", probe, str(dest)], capture_output=True, text=True, check=True).stdout
    assert all(f.endswith(".pyc") for f in files.split()), files
    p = subprocess.run(["python3", str(dest), "--home", str(tmp_path / "home"), "status"], capture_output=True)
    assert p.returncode == 0 and json.loads(p.stdout)["jobs"] == []


def test_the_connection_bench_produces_its_figures(testbed, tmp_path, capsys):
    """bench/conn.py in quick mode, so its code cannot rot; no timing is asserted."""
    from bench.conn import main
    out = tmp_path / "conn.json"
    assert main(["--quick", "--json", str(out)], bed=testbed) == 0
    res = json.loads(out.read_text())
    assert set(res["medians_ms"]) == {"ssh", "exec_warm", "status_warm", "exec_full", "status_full", "exec_cold",
                                     "ps_warm", "ps_full"}
    assert all(v > 0 for v in res["medians_ms"].values())
    assert res["figures"]["exec_warm"]["ratio"] > 0
    assert "| command | median |" in capsys.readouterr().out


def test_a_local_target_never_starts_a_daemon(tmp_path):
    from helpers import local_env
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(local_env(tmp_path), XDG_RUNTIME_DIR=str(runtime))
    env.pop("GPUJOB_NO_DAEMON", None)
    (tmp_path / "root").mkdir()
    for args in (["exec", "lab/box", "--", "echo", "hi"], ["exec", "box", "echo", "hi"]):
        a, b = fast(args, env), cli(args, env)
        same(a, b)
        assert a.stdout == b"hi\n"
    time.sleep(1)
    assert not daemons_of(env) and not sock_path(env).exists()
