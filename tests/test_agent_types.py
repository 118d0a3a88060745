"""Bugs that mypy over the agent (check_untyped_defs, Python 3.9; scripts/mypy-agent) showed: each
test fails on the code before the fix."""

from __future__ import annotations

from types import SimpleNamespace

from gpujob.agent.base.defaults import DEFAULTS
from gpujob.agent.judge import decide
from gpujob.agent.judge.decide import Do


def _out(signal: str) -> SimpleNamespace:
    return SimpleNamespace(kind="signal", signal_name=signal, reason="it ended", evidence={}, to=None, request=None,
                           mark_bad=True, exit_code=1, at=100.0)


def test_next_action_without_default_restarts_takes_the_specs_defaults():
    """``default_restarts`` may be left out (None): a restart the job's own policy does not name
    (a container restart, a compile race) is then judged by the spec's defaults, as the supervisor
    passes them, not by ``None["max"]`` (a TypeError)."""
    rb = dict(DEFAULTS["rollback"], fallback=[], on=[])
    for signal in ("container_restart", "compile_race"):
        args = (_out(signal), "fast", {"profiles": {}}, {"fast": {}}, rb, {"on": []}, [], [], None, 1000.0)
        assert decide.next_action(*args) == decide.next_action(*args, DEFAULTS["restarts"])
        assert decide.next_action(*args).do == Do.RESTART
