"""Issue 35 row 2 (the rest), on the bed: a host whose ``pct`` never answers (the connection is
up, the command hangs) is given up on by ``ps``'s fanout at its deadline and cancelled: its
connection is closed, so the thread that waited on it ends instead of running on after the
table was printed."""

from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.testbed

MUTE = "#!/bin/sh\nexec sleep 3600\n"


def test_a_host_that_never_answers_is_cancelled_and_its_thread_ends(testbed, tmp_path):
    from gpujob.agent.base.wire import StatusAnswer
    from gpujob.inventory.hosts import load_inventory
    from gpujob.ops import fanout
    from gpujob.ops.target import Targets
    mute = tmp_path / "mute-pct"
    mute.write_text(MUTE)
    mute.chmod(0o755)
    extra = "\n".join(["  mute:", "    address: 127.0.0.1", f"    port: {testbed.port}", "    user: root",
                       f"    identity_file: {testbed.user_key}", f"    known_hosts: {testbed.known_hosts}",
                       f"    pct: {mute}", "    containers:",
                       f"      ct{testbed.vmid}: {{vmid: {testbed.vmid}}}"])
    inv = testbed.write_hosts_yaml(tmp_path / "hosts.yaml", extra_hosts=extra)
    targets = Targets(load_inventory(inv))
    opened: dict = {}

    def fetch(key):
        t = opened[key] = targets.open(key)
        return t.ask(StatusAnswer, "status", "--missing-ok", "nosuchjob", timeout=3600)

    def cancel(key):  # as ops/bodies.py's ps does
        t = opened.get(key)
        for tr in (t.host_transport, t.transport):
            if tr is not None:
                tr.close()
    try:
        got = fanout.gather([f"mute/ct{testbed.vmid}"], fetch, workers=2, deadline=8, cancel=cancel)
        assert isinstance(got[f"mute/ct{testbed.vmid}"], fanout.NoAnswer)
        left = [t for t in threading.enumerate() if t.name.startswith("gpujob-ask-mute")]
        assert left, "the fetch had ended before the deadline: the host answered"
        for t in left:
            t.join(120)
        assert not any(t.is_alive() for t in left), "the thread of the host given up on runs on"
    finally:
        targets.close()
