"""The error tree. Every error carries a one-line message (and maybe a hint);
the CLI prints exactly that line, never a traceback."""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """Control characters (newline, CR, ESC, NUL, ...) as visible escapes: whatever text
    from outside an error quotes, the error stays one line and moves no cursor."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(text))


class GpujobError(Exception):
    """Base of every error gpujob reports to a user."""

    exit_code = 1
    #: the agent's refusal code (agent/base/wire.py Code) when the agent refused
    refusal: str | None = None

    def __init__(self, message: str, hint: str | None = None):
        message = one_line(message)
        super().__init__(message)
        self.message = message
        self.hint = one_line(hint) if hint is not None else None

    def __str__(self) -> str:
        return self.message


class InputError(GpujobError):
    """Bad user input: a spec, an inventory, a flag. Exit code 2."""

    exit_code = 2


class SpecError(InputError):
    """A job spec or inventory file that does not validate.

    Rendered as ``path:line: field: what was expected``.
    """

    def __init__(self, path: str, line: int | None, field: str | None, message: str,
                 hint: str | None = None):
        self.path = path
        self.line = line
        self.field = field
        self.detail = one_line(message)
        loc = f"{path}:{line}" if line else path
        text = f"{loc}: {field}: {message}" if field else f"{loc}: {message}"
        super().__init__(text, hint)


class ConnectError(GpujobError):
    """Could not reach or log in to a host (DNS, refused, auth, timeout). Exit code 3."""

    exit_code = 3


class HostKeyError(ConnectError):
    """The host key is unknown (and not accepted) or changed. Nothing ran."""


class ConnectionLost(ConnectError):
    """An established connection dropped while a command ran."""


class HostMisbehaving(ConnectionLost):
    """A host (or what runs there) sent more than an answer may hold (transport/base.py
    MAX_ANSWER): the command's connection was closed, nothing more is read from it."""


class RemoteError(GpujobError):
    """A remote step failed; carries the Result and shows its last lines."""

    exit_code = 4

    def __init__(self, what: str, result=None, hint: str | None = None):
        self.result = result
        self.answered = False  # True: the agent answered with its error (it ran to its end)
        msg = what
        if result is not None:
            tail = result.tail()
            msg = f"{what} (exit {result.exit_code})" + (f": {tail}" if tail else "")
        super().__init__(msg, hint)


class JobError(GpujobError):
    """A job-level refusal: container busy, unknown job, nothing to roll back to."""

    exit_code = 5


class Interrupted(GpujobError):
    """Ctrl-C, with what it left behind said in the message. Exit code 130."""

    exit_code = 130
