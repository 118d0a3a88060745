"""Hostile answers on the loopback Proxmox: status --json's errors are the same bytes through
the daemon as without it (the other hostile answers: tests/local/test_hostile_return.py)."""

from __future__ import annotations

import pytest


@pytest.mark.testbed
def test_status_json_errors_are_the_same_bytes_through_the_daemon(testbed, tmp_path):
    import os

    from connkit import daemon_pid, warm
    from helpers import cli, cli_direct
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    inv = testbed.write_hosts_yaml(tmp_path / "hosts.yaml")
    env = dict(os.environ, GPUJOB_HOSTS=str(inv), XDG_STATE_HOME=str(tmp_path / "state"),
               XDG_RUNTIME_DIR=str(runtime), COLUMNS="200")
    env.pop("GPUJOB_NO_DAEMON", None)
    pid = warm(env)
    for args in (["status", "--json", "nosuchjob"], ["status", "nosuchjob", "--json"],
                 ["status", "--json", "-t", f"tb/ct{testbed.vmid}", "nosuchjob"]):
        a, b = cli(args, env), cli_direct(args, env)
        assert daemon_pid(env) == pid
        assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr), (args, a, b)
        assert a.returncode != 0 and a.stderr.startswith(b'{"error": '), a.stderr
