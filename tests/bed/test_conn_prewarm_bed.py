"""The kept connection's prewarm on the loopback Proxmox: the command after a cold one finds
the exec channel open (the prewarm on the local kind: tests/local/test_conn_prewarm.py)."""

from __future__ import annotations

import pytest

from connkit import env, sock_path  # noqa: F401
from helpers import cli, wait_for
from test_conn_prewarm import mux_servers


@pytest.mark.testbed
def test_on_the_bed_the_command_after_a_cold_one_finds_the_exec_channel_open(env):  # noqa: F811
    # the bed's tests run back to back here: a channel another test's daemon is still opening
    # would count as this one's; wait for those to close (their daemons end or idle out)
    wait_for(lambda: not mux_servers(), 60, what="other tests' exec channels to close")
    before = set(mux_servers())
    assert cli(["exec", "tb/ct200", "--", "true"], env).returncode == 0  # cold: no daemon yet
    conn_log = sock_path(env).parent / "conn.log"
    wait_for(lambda: conn_log.exists() and "connected ahead to tb/ct200" in conn_log.read_text(), 60,
             what="the daemon to connect ahead")
    ahead = set(mux_servers()) - before
    assert len(ahead) == 1, ahead  # the daemon's exec channel, open before any command asked
    p = cli(["exec", "tb/ct200", "--", "echo", "hi"], env)
    assert p.returncode == 0 and p.stdout == b"hi\n"
    assert set(mux_servers()) - before == ahead  # the second command ran on it: none opened
