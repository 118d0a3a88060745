"""The console entry point's fast path (gpujob/entry.py): which command lines it sends to
the kept connection's daemon, and with what request; anything it does not read exactly as
the full CLI would (an option it does not know, a value the CLI would refuse) is None,
and the full CLI runs it and says why."""

from __future__ import annotations

import pytest

from gpujob import entry


@pytest.mark.parametrize("argv, req", [
    (["ps"], {"target": None, "json": False, "limit": 20, "timeout": None}),
    (["ps", "--json"], {"target": None, "json": True, "limit": 20, "timeout": None}),
    (["ps", "tb/ct200", "--limit", "3"], {"target": "tb/ct200", "json": False, "limit": 3, "timeout": None}),
    (["ps", "--limit=7", "--timeout=2.5", "--json"],
     {"target": None, "json": True, "limit": 7, "timeout": 2.5}),
    (["ps", "--timeout", "0.1", "tb/ct200"],
     {"target": "tb/ct200", "json": False, "limit": 20, "timeout": 0.1}),
])
def test_ps_lines_the_daemon_serves(argv, req):
    assert entry.parse(argv) == dict(req, op="ps", hosts=None)
    assert entry.parse(["--hosts", "h.yaml", *argv]) == dict(req, op="ps", hosts="h.yaml")


@pytest.mark.parametrize("argv", [
    ["ps", "--all", "tb/ct200"],      # one container's journal: the full CLI's
    ["ps", "--timeout", "0.05"],      # under the CLI's min=0.1: its error
    ["ps", "--limit", "x"], ["ps", "--limit", "-1"], ["ps", "--limit"], ["ps", "--timeout", "1e3"],
    ["ps", "a", "b"],                 # two targets: the CLI's usage error
    ["ps", "--help"], ["ps", "-h"], ["ps", "--jsonx"],
])
def test_ps_lines_the_full_cli_answers(argv):
    assert entry.parse(argv) is None
