"""The kept connection's contract with the direct path: every read-only command and
the exec cases answer the same exit code, stdout and stderr through the daemon (the
default, the one the suite runs) and with GPUJOB_NO_DAEMON=1, piped and on a terminal,
on an ended job; and the quick start's first commands on a fresh HOME with no daemon
yet work through the installed console script."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from connkit import (LIVE, daemon_pid, daemons_of, end_daemons, env, pty_run,  # noqa: F401
                     same, started, traced_run)
from gpujob.ops.wheelhouse import build_indexes, serve
from helpers import cli, cli_direct, gpujob_argv, job_id_of, wait_for, write_spec

pytestmark = pytest.mark.testbed


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
             ["status", "JOB", "-t", "tb/ct200"], ["status", "nosuchjob"],
             ["status", "JOB", "-t", "tb/ct201"],
             ["logs", "JOB"], ["logs", "JOB", "-f"], ["logs", "JOB", "--tail", "3"],
             ["logs", "JOB", "--events"],
             ["logs", "JOB", "--samples", "--json"], ["logs", "JOB", "--phase", "train"],
             ["logs", "JOB", "--json"],
             ["ps"], ["ps", "tb/ct200"], ["ps", "tb/ct200", "--all"], ["ps", "--json"],
             ["hosts"], ["hosts", "--json"], ["hosts", "--check"],
             ["profiles", "tb/ct200"], ["profiles", "tb/ct200", "--json"], ["cache", "ls", "tb/ct200"],
             ["gc", "tb/ct200", "--dry-run"], ["plot", "JOB", "--json"],
             ["doctor", "tb/ct200"], ["doctor", "tb/ct200", "--json"], ["doctor", "tb/ct201"])
#: the exec cases (argv, stdin)
EXEC = ((["exec", "tb/ct200", "--", "sh", "-c", "echo out; echo 'err ✓' >&2; printf 'x\\0y'; exit 7"], None),
        (["exec", "tb/ct200", "--", "sha256sum"], os.urandom(300_000)),
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
        try:
            for args in READ_ONLY:
                same(cli(sub(args), env), cli_direct(sub(args), env))
            for args, stdin in EXEC:
                same(cli(args, env, input=stdin), cli_direct(args, env, input=stdin))
        except AssertionError as e:  # with what the daemon said of it (when it started and ended)
            log = runtime / "gpujob" / "conn.log"
            raise AssertionError(f"{e}\nconn.log:\n"
                                 f"{log.read_text()[-3000:] if log.exists() else '-'}") from None
        assert daemon_pid(env) == pid  # one daemon served them all
        ok = cli(["status", job], env).stdout
        assert b"succeeded" in ok
        # a multi-node job (the index names its nodes): the full CLI's fleet view, not the daemon's
        from gpujob.ops.state import State
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
            a = pty_run(gpujob_argv() + sub(args), tty)
            b = pty_run(gpujob_argv() + sub(args), dict(tty, GPUJOB_NO_DAEMON="1"))
            assert (a[0], LIVE.sub(b"<live>", a[1])) == (b[0], LIVE.sub(b"<live>", b[1])), args
        assert b"\x1b[" in pty_run(gpujob_argv() + ["status", job], tty)[1]
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




def no_daemon(env) -> None:
    """None of env's daemons left: the one the last command asked for (it starts as that
    command exits) is let start, then asked to end."""
    if daemons_of(env):
        started(env)
    cli(["disconnect"], env)
    wait_for(lambda: not daemons_of(env), 20, what="no daemon")


def test_a_cold_exec_is_the_full_clis_bytes_without_typer_or_rich(env):
    """No daemon yet: the fast path's exec runs the daemon's own request handler in this
    process (gpujob/daemon/oneshot.py), not the full CLI. Each exec case, piped and on a
    terminal, is the full CLI's bytes; the cold one imports neither typer nor rich (nor
    pydantic and yaml once its hosts.yaml is cached), and asks for the daemon that serves
    the next command."""
    env = dict(env)
    env.pop("COLUMNS", None)
    try:
        for args, stdin in EXEC:
            no_daemon(env)
            same(cli(args, env, input=stdin), cli_direct(args, env, input=stdin))
        tty = dict(env, TERM="xterm-256color")
        args = ON_A_TTY[-1]
        no_daemon(env)
        a = pty_run(gpujob_argv() + args, tty)
        assert a == pty_run(gpujob_argv() + args, dict(tty, GPUJOB_NO_DAEMON="1")), args
        no_daemon(env)
        traced = traced_run(EXEC[0][0], env, extra=("-X", "importtime"))
        assert traced.returncode == 7 and traced.stdout == b"out\nx\0y"
        loaded = {ln.split("|")[-1].strip() for ln in traced.stderr.decode().splitlines()
                  if ln.startswith("import time:")}
        assert "gpujob.daemon.oneshot" in loaded
        # nor, its hosts.yaml validated before by this gpujob (gpujob/inventory/cache.py), pydantic or yaml
        assert not {m.split(".")[0] for m in loaded} & {"typer", "rich", "pydantic", "yaml"}, sorted(loaded)
        pid = started(env)  # the daemon it asked for serves the next command
        assert cli(["exec", "tb/ct200", "--", "true"], env).returncode == 0 and daemon_pid(env) == pid
    finally:
        end_daemons(env)
