"""``gpujob ps`` through the kept connection (issue 25): the thin client sends it to the
daemon, which asks every host over the connections it holds, at once, and prints what
the full CLI prints, byte for byte; what the daemon cannot serve as the CLI would (a
target the inventory does not know, a local one, ``--all``) runs the full CLI. A daemon
killed while a ps waits on a host is one line, and the next ps works."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess

import pytest

from connkit import daemon_pid, env, same, started, traced_run, warm  # noqa: F401
from helpers import HANG, REPO, cli, cli_direct, gpujob_argv, wait_for

pytestmark = pytest.mark.testbed


def rows(env, jobs: list[tuple[str, str]]) -> None:
    """This laptop's job index holding ``jobs`` ((job id, target) each)."""
    from unittest import mock
    from gpujob.ops.state import State
    with mock.patch.dict(os.environ, {"XDG_STATE_HOME": env["XDG_STATE_HOME"]}):
        st = State()
        for job, target in jobs:
            st.reserve(job, "ps", target, "/x.yaml", "h", "fast")
        st.close()


def loaded_modules(traced) -> set[str]:
    return {ln.split("|")[-1].strip() for ln in traced.stderr.decode().splitlines()
            if ln.startswith("import time:")}


@pytest.fixture
def silent_host():
    """A loopback port that accepts and never says a word (a host hung in its handshake)."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    yield ls.getsockname()[1]
    ls.close()


def test_ps_over_every_host_is_served_by_the_daemon_and_is_the_full_clis_bytes(env, testbed):
    hosts = testbed.host_names
    rows(env, [(f"ps-{i}", f"{h}/ct{testbed.vmid}") for i, h in enumerate(hosts)] +
         [("ps-x", f"{hosts[0]}/ct{testbed.vmid}")])
    pid = warm(env)
    traced = traced_run(["ps", "--json"], env, extra=("-X", "importtime"))
    assert traced.returncode == 0, traced.stderr[-2000:]
    loaded = loaded_modules(traced)
    assert not {m.split(".")[0] for m in loaded} & {"typer", "paramiko", "pydantic"}, sorted(loaded)
    assert daemon_pid(env) == pid
    for args in (["ps"], ["ps", "--json"], ["ps", "--limit", "2"], ["ps", "--limit=1", "--json"],
                 ["ps", f"{hosts[0]}/ct{testbed.vmid}"], ["ps", "--timeout", "30", "--json"],
                 ["ps", "nosuch/ct1"], ["ps", "--all", f"{hosts[0]}/ct{testbed.vmid}"]):
        same(cli(args, env), cli_direct(args, env))
    assert daemon_pid(env) == pid  # one daemon served them all
    # a new gpujob's agent is not in the container yet (an upgrade): shipped on the way, by the daemon
    testbed.container_exec("sh", "-c", "rm -f /root/.gpujob/bin/agent-*.pyz")
    p = cli(["ps", "--json"], env)
    assert p.returncode == 0 and p.stderr == b"" and p.stdout.count(b'"ps-') == len(hosts) + 1, p.stderr
    assert b"unreachable" not in p.stdout and daemon_pid(env) == pid
    assert testbed.container_exec("sh", "-c", "ls /root/.gpujob/bin/agent-*.pyz").returncode == 0


def test_a_target_the_daemon_cannot_serve_runs_the_full_cli(env, testbed, tmp_path):
    """A row whose target this inventory does not know (recorded from another inventory),
    and a local one: the full CLI's answer (it looks among the recorded entries)."""
    inv = testbed.write_hosts_yaml(tmp_path / "hosts2.yaml", extra_hosts=(
        f"  desk:\n    kind: local\n    containers:\n      box: {{root: {tmp_path / 'box'}}}\n"))
    e = dict(env, GPUJOB_HOSTS=str(inv))
    rows(e, [("ps-a", f"tb/ct{testbed.vmid}"), ("ps-gone", "gone/ct9"), ("ps-local", "desk/box")])
    warm(e)
    for args in (["ps"], ["ps", "--json"]):
        a = traced_run(args, dict(e, GPUJOB_TEST_CWD=str(REPO)), extra=("-X", "importtime"))
        assert "typer" in {m.split(".")[0] for m in loaded_modules(a)}  # the full CLI ran it
        same(cli(args, e), cli_direct(args, e))


def test_a_silent_host_is_unreachable_at_the_timeout_and_a_daemon_killed_meanwhile_is_one_line(
        env, testbed, tmp_path, silent_host, request):
    later = socket.socket()  # another silent host, asked only by the ps the daemon dies under
    later.bind(("127.0.0.1", 0))
    later.listen(16)
    request.addfinalizer(later.close)
    inv = testbed.write_hosts_yaml(tmp_path / "hosts3.yaml", extra_hosts="".join(
        f"  {name}:\n    address: 127.0.0.1\n    port: {port}\n    user: root\n"
        f"    connect_timeout: 3600\n"
        f"    identity_file: {testbed.user_key}\n    known_hosts: {testbed.known_hosts}\n"
        f"    containers:\n      ct{vmid}: {{vmid: {vmid}}}\n"
        for name, port, vmid in (("mute", silent_host, 500), ("mute2", later.getsockname()[1], 501))))
    e = dict(env, GPUJOB_HOSTS=str(inv))
    rows(e, [("ps-ok", f"tb/ct{testbed.vmid}"), ("ps-mute", "mute/ct500")])
    w = cli(["exec", "tb/ct200", "--", "true"], e)
    assert w.returncode == 0, w.stderr
    pid = started(e)
    # held by mute for --timeout, not its 3600 s connect_timeout: past HANG, "hung"
    p = cli(["ps", "--json", "--timeout", "5"], e, timeout=2 * HANG)
    assert p.returncode == 0, p.stderr
    err = p.stderr.decode().splitlines()
    assert len(err) == 1 and "mute/ct500 is unreachable (no answer within 5s)" in err[0], err
    assert b'"unreachable"' in p.stdout and b'"ps-ok"' in p.stdout
    assert daemon_pid(e) == pid  # the daemon served it, and is still there
    # the daemon SIGKILLed while a ps waits on the silent host: one line, no traceback
    rows(e, [("ps-mute2", "mute2/ct501")])
    q = subprocess.Popen([*gpujob_argv(), "ps", "--timeout", "60"], env=e, cwd=str(REPO),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    # mute2 is connected to once the daemon has taken the ps on (told the client "go"): it waits there
    wait_for(lambda: select.select([later], [], [], 0)[0], HANG, 0.02, "the daemon to ask mute2")
    os.kill(pid, signal.SIGKILL)
    out, err_b = q.communicate(timeout=60)
    lines = err_b.decode().splitlines()
    assert q.returncode == 3 and len(lines) == 1 and "connection daemon ended" in lines[0], err_b
    assert b"Traceback" not in err_b
    # the next ps works (no daemon answers: the full CLI runs it, and one starts)
    r = cli(["ps", "--json", "--timeout", "1"], e)
    assert r.returncode == 0 and b'"ps-ok"' in r.stdout, r.stderr
    assert wait_for(lambda: daemon_pid(e), 60, what="a new daemon") != pid
    s = cli(["ps", "--json", "--timeout", "1"], e)
    assert s.returncode == 0 and b'"ps-ok"' in s.stdout and b"unreachable" in s.stdout, s.stderr
