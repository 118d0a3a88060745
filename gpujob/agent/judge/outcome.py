"""How a phase run ended (stdlib only): an ``Outcome`` value that the watch loop,
the phases and a fleet's leader hand to the decision; ``Stop``, raised when a stop
was asked for, and ``EnvError``, when a profile's venv cannot be built or verified.
"""

from __future__ import annotations

from gpujob.agent.base.fsio import now


class EnvError(Exception):
    """Building or verifying a profile's venv failed (one line)."""


class Stop(Exception):
    """A stop was asked for (request or SIGTERM)."""


class Outcome:
    """How a phase run ended: ``done`` (exit 0), ``signal`` (a failure signal with
    its reason), ``stop``, or ``rollback`` (asked for by the user)."""

    def __init__(self, kind: str, signal_name: str = "", reason: str = "", evidence=None,
                 to: str | None = None, exit_code=None, request: str | None = None,
                 mark_bad: bool = True):
        self.kind, self.signal_name, self.reason = kind, signal_name, reason
        self.evidence, self.to, self.exit_code = evidence or {}, to, exit_code
        self.request, self.mark_bad = request, mark_bad
        self.at = now()  # when it was decided: a rollback's clock starts here
