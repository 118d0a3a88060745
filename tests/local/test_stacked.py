"""A place entered through another transport (gpujob/transport/stacked.py) is one small
class: a prefix, and how the entering command says the place cannot be entered. Driven
here over this machine (LocalTransport) with entering commands of our own; pct over ssh
is the same class on the test bed (test_transport_testbed.py, test_kind_contract.py)."""

from __future__ import annotations

import shutil
import sys

import pytest

from gpujob.errors import ConnectError
from gpujob.transport.local import LocalTransport
from gpujob.transport.stacked import Stacked
from helpers import HANG, returns

pytestmark = pytest.mark.skipif(shutil.which("python3") is None, reason="the exec channel runs python3")


class EnvOver(Stacked):
    """``env -- argv``: the smallest place there is, this machine through ``env``."""

    def host_argv(self, argv):
        return ["env", "--", *argv]


#: an entering command that cannot run the channel: it says why on stderr and exits 2
CLOSED = [sys.executable, "-c", "import sys; print('box 7 is not running', file=sys.stderr); sys.exit(2)"]


class ClosedBox(Stacked):
    entry_exits = (2,)

    def host_argv(self, argv):
        return [*CLOSED, *argv]


class KnownClosedBox(ClosedBox):
    def refusal(self, said):
        return ConnectError("box 7 is stopped") if "not running" in said else None


def test_commands_ride_one_exec_channel_opened_over_the_inner_transport():
    t = EnvOver(LocalTransport(), "env-box")
    try:
        r = t.run(["python3", "-c", "import sys; print(sys.argv[1:]); sys.exit(3)", "a b", "$(x)"])
        assert (r.exit_code, r.stdout) == (3, b"['a b', '$(x)']\n")
        channel = t._mux
        assert channel is not None and channel.alive
        assert t.run(["true"]).ok and t._mux is channel  # the same channel, not a new one
        assert t.describe() == "env-box on this machine"
    finally:
        t.close()
    assert t._mux is None


def test_a_place_that_cannot_run_the_channel_gets_one_entering_command_per_command():
    t = ClosedBox(LocalTransport(), "closed")
    r = t.run(["true"])
    assert t.use_mux is False and t._mux is None
    assert r.exit_code == 2 and b"not running" in r.stderr and r.argv == ["true"]


def test_a_refusal_is_gpujobs_own_line_not_the_commands_exit_code():
    t = KnownClosedBox(LocalTransport(), "closed")
    with pytest.raises(ConnectError, match="^box 7 is stopped$"):
        t.run(["true"])
    t.use_mux = False  # and the same on the per-command path
    with pytest.raises(ConnectError, match="^box 7 is stopped$"):
        t.run(["true"])


def test_a_timeout_is_enforced_inside_on_the_per_command_path():
    t = EnvOver(LocalTransport(), "env-box", mux=False)
    r = returns(lambda: t.run(["sleep", str(int(10 * HANG))], timeout=0.5), "a timed-out command")
    assert r.timed_out and r.exit_code == 124  # ended at its timeout: run to its end, "hung"
