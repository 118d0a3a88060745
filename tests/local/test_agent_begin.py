"""An agent command sent on an open exec channel without waiting (Target.agent_begin,
what the kept connection's daemon does for ``gpujob ps``): the same answer as
``ask``, an agent not shipped yet left to ``ask`` (None), nothing sent while the
channel is not open, and a deadline that passes ends the command there."""

from __future__ import annotations

import sys
import time

import pytest

from gpujob.agent.base.wire import StatusAnswer
from gpujob.ops.target import Target
from gpujob.transport.local import LocalTransport
from gpujob.transport.stacked import Stacked


class Here(Stacked):
    """This machine entered through a local transport: a Stacked with no prefix."""

    def host_argv(self, argv):
        return list(argv)


@pytest.fixture
def target(tmp_path):
    t = Target("here", "me", "local", Here(LocalTransport(), "here"), None, str(tmp_path / "home"),
               sys.executable)
    yield t
    t.transport.close()


def test_begin_needs_an_open_channel_and_a_missing_agent_is_left_to_ask(target):
    assert target.agent_begin("status", "--missing-ok", "nojob") is None  # no channel yet: fetch instead
    assert target.transport.mux() is not None
    begun = target.agent_begin("status", "--missing-ok", "nojob")
    assert begun is not None
    assert target.ask_end(StatusAnswer, begun, time.monotonic() + 60) is None  # no agent there yet: ask's
    got = target.ask(StatusAnswer, "status", "--missing-ok", "nojob")  # (which ships it and asks again)
    assert [j["job_id"] for j in got.jobs] == ["nojob"]
    again = target.ask_end(StatusAnswer, target.agent_begin("status", "--missing-ok", "nojob"),
                           time.monotonic() + 60)
    assert again == got


def test_a_deadline_gone_by_is_a_timeout_and_the_channel_serves_on(target):
    mux = target.transport.mux()
    begun = target.agent_begin("status", "--missing-ok", "nojob")
    with pytest.raises(TimeoutError):
        target.ask_end(StatusAnswer, begun, time.monotonic() - 1)
    assert not mux._calls
    assert target.ask(StatusAnswer, "status", "--missing-ok", "nojob").jobs[0]["job_id"] == "nojob"
