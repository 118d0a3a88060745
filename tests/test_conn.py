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
import re
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
from helpers import GPUJOB, REPO, cli, cli_direct, gpujob_argv, job_id_of, wait_for, write_spec

pytestmark = pytest.mark.testbed

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
            if d.isdigit() and b"gpujob.conn\0serve" in open(f"/proc/{d}/cmdline", "rb").read() and \
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


#: the one live figure in read-only output: the container's free disk (shared, it moves)
LIVE = re.compile(rb"\d+\.\d GiB free")


def same(a: subprocess.CompletedProcess, b: subprocess.CompletedProcess) -> None:
    """The same exit code, stdout and stderr, byte for byte (else: where they differ),
    but for doctor's free-disk figure (LIVE), which moves between two calls."""
    for p in (a, b):
        p.stdout, p.stderr = LIVE.sub(b"N GiB free", p.stdout), LIVE.sub(b"N GiB free", p.stderr)
    if (a.returncode, a.stdout, a.stderr) != (b.returncode, b.stdout, b.stderr):
        import difflib
        diff = [f"{name}:\n" + "\n".join(difflib.unified_diff(x.decode("utf-8", "replace").splitlines(),
                                                              y.decode("utf-8", "replace").splitlines(), lineterm=""))
                for name, x, y in (("stdout", a.stdout, b.stdout), ("stderr", a.stderr, b.stderr)) if x != y]
        raise AssertionError(f"{a.args[1:]}: exit {a.returncode} vs {b.returncode}\n" + "\n".join(diff))


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
    assert sock_path(env).name.startswith("conn-") and len(sock_path(env).name) == len("conn-0123456789abcdef.sock")
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


def test_exec_stdin_timeout_and_errors_match(env, testbed):
    data = os.urandom(300_000)
    a = cli(["exec", "tb/ct200", "--", "sha256sum"], env, input=data)
    b = cli_direct(["exec", "tb/ct200", "--", "sha256sum"], env, input=data)
    same(a, b)
    assert a.returncode == 0 and len(a.stdout.split()[0]) == 64
    for argv in (["exec", "tb/ct200", "--timeout", "1", "--", "sleep", "30"],
                 ["exec", "nosuch", "--", "true"],
                 ["exec", "tb/ct201", "--", "true"],              # a stopped container
                 ["exec", "-n", "tb/ct200", "--", "cat"],
                 ["exec", "tb/ct200", "--", "no-such-command"]):
        a, b = cli(argv, env), cli_direct(argv, env)
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


LONG_REASON = ("set by the connection tests: a reason long enough that its table is wider than "
               "eighty columns, which piped output must never wrap")


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
                            "containers": {"ct200": {"vmid": 200, "home": home}, "ct201": {"vmid": 201}}}}}
    (tmp / "hosts.yaml").write_text(yaml.safe_dump(inv))
    e = dict(os.environ, GPUJOB_HOSTS=str(tmp / "hosts.yaml"), XDG_STATE_HOME=str(tmp / "state"))
    spec = write_spec(tmp / "job.yaml", target="tb/ct200", fast_url=f"{url}/fast/simple",
                      slow_url=f"{url}/slow/simple", profile="fast", trainer_args="--steps 8 --interval 0.1",
                      warmup=False)
    try:
        job = job_id_of(cli(["submit", str(spec)], e, check=True).stdout)
        wait_for(lambda: json.loads(cli(["status", job, "--json"], e, check=True).stdout)["state"]
                 in ("succeeded", "failed"), 240, 1, what="the job to end")
        # a ledger entry with a reason wider than 80 columns: status shows it as a table
        cli(["ledger", "set", "tb/ct200", "tjob", "slow", "bad", "--reason", LONG_REASON], e, check=True)
        yield job, e
    finally:
        server.shutdown()
        testbed.container_exec("rm", "-rf", home)


#: every read-only command, on the ended job of `finished_job` (JOB) and the bed's
#: containers: through the daemon (the default) and with GPUJOB_NO_DAEMON=1 they must
#: answer the same exit code, stdout and stderr, byte for byte
READ_ONLY = (["status", "JOB"], ["status"], ["status", "JOB", "--json"], ["status", "--json"],
             ["status", "JOB", "-t", "tb/ct200"], ["status", "nosuchjob"], ["status", "JOB", "-t", "tb/ct201"],
             ["logs", "JOB"], ["logs", "JOB", "-f"], ["logs", "JOB", "--tail", "3"], ["logs", "JOB", "--events"],
             ["logs", "JOB", "--samples", "--json"], ["logs", "JOB", "--phase", "train"], ["logs", "JOB", "--json"],
             ["ps"], ["ps", "tb/ct200"], ["ps", "tb/ct200", "--all"], ["ps", "--json"],
             ["hosts"], ["hosts", "--json"], ["hosts", "--check"],
             ["profiles", "tb/ct200"], ["profiles", "tb/ct200", "--json"], ["cache", "ls", "tb/ct200"],
             ["gc", "tb/ct200", "--dry-run"], ["plot", "JOB", "--json"],
             ["doctor", "tb/ct200"], ["doctor", "tb/ct200", "--json"], ["doctor", "tb/ct201"])
#: the exec cases (argv, stdin)
EXEC = ((["exec", "tb/ct200", "--", "sh", "-c", "echo out; echo 'err ✓' >&2; printf 'x\\0y'; exit 7"], None),
        (["exec", "tb/ct200", "--", "sha256sum"], b"data\n" * 5000),
        (["exec", "tb/ct200", "sh", "-c", "cat; exit 3"], b"no dashes: the full CLI\n"),
        (["exec", "-n", "tb/ct200", "--", "cat"], b"not read"),
        (["exec", "tb/ct200", "--timeout", "1", "--", "sleep", "30"], None),
        (["exec", "tb/ct200", "--json", "--", "sh", "-c", "echo j; exit 2"], None),
        (["exec", "tb/ct201", "--", "true"], None), (["exec", "nosuch", "--", "true"], None),
        (["exec", "tb/ct200", "--", "no-such-command"], None))
#: what is also compared on a terminal (stdout and stderr on one pty, 97x31, colours)
ON_A_TTY = (["status", "JOB"], ["status"], ["logs", "JOB", "--tail", "3"], ["ps"], ["hosts"],
            ["profiles", "tb/ct200"], ["doctor", "tb/ct200"],
            ["exec", "tb/ct200", "--", "sh", "-c", "echo out; echo err >&2; exit 5"])


def test_every_read_only_command_is_the_same_bytes_both_ways(finished_job, tmp_path):
    """The direct path keeps its coverage: each read-only command and exec case, piped
    (no $COLUMNS: what a script sees) and on a terminal, daemon on against
    GPUJOB_NO_DAEMON=1, on an ended job (a live one's figures move between two calls)."""
    job, base = finished_job
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(base, XDG_RUNTIME_DIR=str(runtime))
    env.pop("COLUMNS", None)
    env.pop("GPUJOB_NO_DAEMON", None)
    sub = lambda args: [job if a == "JOB" else a for a in args]  # noqa: E731
    try:
        cli(["status", job], env)
        pid = started(env)
        for args in READ_ONLY:
            same(cli(sub(args), env), cli_direct(sub(args), env))
        for args, stdin in EXEC:
            same(cli(args, env, input=stdin), cli_direct(args, env, input=stdin))
        assert daemon_pid(env) == pid  # one daemon served them all
        ok = cli(["status", job], env).stdout
        assert b"succeeded" in ok
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
            same(cli(args, env), cli_direct(args, env))
        # a terminal: width from the terminal itself, colours from TERM
        tty = dict(env, TERM="xterm-256color")
        for args in ON_A_TTY:
            a = _pty_run(gpujob_argv() + sub(args), tty)
            b = _pty_run(gpujob_argv() + sub(args), dict(tty, GPUJOB_NO_DAEMON="1"))
            assert (a[0], LIVE.sub(b"N", a[1])) == (b[0], LIVE.sub(b"N", b[1])), args
        assert b"\x1b[" in _pty_run(gpujob_argv() + ["status", job], tty)[1]
    finally:
        end_daemons(env)


def test_piped_status_is_not_wrapped_through_the_daemon(finished_job, tmp_path):
    """Piped, gpujob never hard-wraps (render.console): a status table as wide as it is,
    through the daemon as directly (it wrapped at 80 columns there, mid-word)."""
    job, base = finished_job
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(base, XDG_RUNTIME_DIR=str(runtime))
    env.pop("COLUMNS", None)
    try:
        cli(["status", job], env)
        started(env)
        a, b = cli(["status", job], env), cli_direct(["status", job], env)
        assert a.returncode == 0 and a.stdout == b.stdout
        assert LONG_REASON.encode() in a.stdout  # on one line, whole
    finally:
        end_daemons(env)


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
    q = cli(["exec", "tb/ct200", "--", "echo", "again"], env)
    assert (q.returncode, q.stdout, q.stderr) == (0, b"again\n", b"")


def test_ctrl_c_ends_the_remote_command(env, testbed):
    marker = "/tmp/conn-int-" + str(os.getpid())
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
    assert [(p.returncode, o) for p, o in zip(procs, outs)] == [(0, (f"{i}\n".encode(), b"")) for i in range(4)]
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
                        (["exec", "tb/ct200", "cat", "/etc/hostname", "/nonexistent"], None),
                        (["hosts"], None), (["hosts", "--json"], None), (["ps"], None),
                        (["exec", "tb/ct201", "true"], None), (["exec", "nosuch", "true"], None)):
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
    assert (p.returncode, p.stdout) == (0, b"gpujob: closed 2 kept connections (their SSH connections are closed)\n")
    wait_for(lambda: not alive(a) and not alive(b), 10, what="both daemons to end")
    assert cli(["disconnect", "--all"], env).stdout == b"gpujob: no kept connection was open\n"
    assert not list(sock_path(env).parent.glob("*.sock"))


def test_a_fresh_home_first_commands_through_the_console_script(testbed, tmp_path):
    """The quick start on a new laptop: no kept connection yet, the daemon on, a HOME with
    nothing in it. `hosts` and `doctor --spec` (which ask pct on the host over the kept
    connection's direct fallback) print what they print without it, never a traceback."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    home = tmp_path / "home"
    home.mkdir()
    inv = testbed.write_hosts_yaml(tmp_path / "hosts.yaml")
    spec = write_spec(tmp_path / "job.yaml", target="tb/ct200", fast_url="http://127.0.0.1:9/fast/simple",
                      slow_url="http://127.0.0.1:9/slow/simple")
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime),
           "GPUJOB_HOSTS": str(inv), "GPUJOB_CONN_IDLE": "20", "LANG": "C.UTF-8"}
    try:
        for args in (["hosts"], ["doctor", "tb/ct200", "--spec", str(spec)], ["doctor", "tb/ct201"],
                     ["hosts", "--json"]):
            cli(["disconnect"], env)
            wait_for(lambda: not daemons_of(env), 20, what="no daemon")
            first = cli(args, env)  # none yet: it runs directly and starts one
            assert b"Traceback" not in first.stderr and b"Error" not in first.stderr, first.stderr.decode()
            direct = cli_direct(args, env)
            same(first, direct)
            started(env)
            same(cli(args, env), direct)  # and through the daemon
        assert b"running" in cli(["hosts"], env).stdout
    finally:
        end_daemons(env)


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
    assert set(res["medians_ms"]) == {"ssh", "exec_warm", "exec_warm_b", "status_warm", "exec_full", "status_full",
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
