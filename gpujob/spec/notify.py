"""The spec's notify and metrics sections: webhooks the supervisor posts to
(agent/supervisor/notify.py) and Prometheus gauges (agent/supervisor/metrics.py). Their defaults are
defined here (gpujob/spec/defaults.py reads them)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from gpujob.spec.types import Duration, SecretRef, _env_value
from gpujob.yamlsrc import At, Strict, control_char, describe, kind_of, shorten

NotifyEvent = Literal["rollback", "failure", "success", "known_good", "no_recovery", "internal_error"]


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a webhook the supervisor can post to (None: it is): an
    http(s) scheme, a host, a valid port, no control characters, no spaces."""
    from urllib.parse import urlsplit
    if control_char(url) or " " in url:
        return "a URL cannot hold a control character or a space"
    try:
        parts = urlsplit(url)
        parts.port  # raises on a port that is not a number in range
    except ValueError:
        return "not a URL that can be parsed (look at its host and port)"
    if parts.scheme not in ("http", "https"):
        return "expected an http:// or https:// URL"
    if not parts.hostname:
        return "the URL names no host"
    return None


def _webhook_url(value: Any) -> Any:
    """A webhook URL: http(s) written in the spec, or a secret reference (from_env,
    from_file) when the URL holds a token (Slack's does, in its path)."""
    if isinstance(value, dict):
        return _env_value(value)
    if not (isinstance(value, str) and value.startswith(("http://", "https://"))):
        got = ("a string that does not start with http:// or https://" if isinstance(value, str)
               else kind_of(value))
        raise ValueError(f"expected an http(s):// URL or {{from_env: VAR}} / {{from_file: PATH}}, got {got} "
                         "(not echoed: it may hold a token)")
    why = url_problem(value)
    if why:
        raise ValueError(f"{why} (the URL is not echoed: it may hold a token)")
    if "@" in value.split("/", 3)[2]:
        raise ValueError("this URL holds credentials (user:pass@): give it as a secret, "
                         "{from_env: VAR} or {from_file: PATH}, so it stays out of job.json and logs")
    return value


def _token(value: Any) -> Any:
    if not isinstance(value, dict):
        raise ValueError("a token is a secret: give it as {from_env: VAR} or {from_file: PATH}")
    return _env_value(value)


class Webhook(Strict):
    """One webhook the supervisor posts to (agent/supervisor/notify.py)."""
    url: Annotated[str | SecretRef, BeforeValidator(_webhook_url)]
    format: Literal["slack", "ntfy", "json"] = "json"
    token: Annotated[SecretRef, BeforeValidator(_token)] | None = None  # sent as Authorization: Bearer
    events: list[NotifyEvent] = ["rollback", "failure", "success", "known_good", "no_recovery",
                                 "internal_error"]
    timeout: Duration = 10.0  # one attempt, all told (connect, send, the answer's headers): not per read
    # after the first attempt, with backoff 1 s, 2 s, 4 s ... (60 s at most)
    retries: int = Field(5, ge=0, le=20)
    # one message, all attempts and backoff: then it is given up; also how long the
    deadline: Duration = 120.0
    # supervisor may outlive its job's end for its webhooks (the largest deadline of the job's webhooks)

    @model_validator(mode="after")
    def _consistent(self) -> Webhook:
        for i, event in enumerate(self.events):
            if event in self.events[:i]:
                raise At(("events", i), f"'{event}' is listed twice")
        if not self.events:
            raise At(("events",), "expected at least one of rollback, failure, success, known_good")
        if not 0 < self.timeout <= 300:
            raise At(("timeout",), "expected a duration > 0 and at most 5m")
        if not 1 <= self.deadline <= 3600:
            raise At(("deadline",), "expected a duration of at least 1s and at most 1h")
        if self.deadline < self.timeout:
            raise At(("deadline",), f"expected at least the timeout ({self.timeout:g}s): the deadline bounds "
                                    "all of a message's attempts, the timeout one of them")
        return self


def _prom_path(value: Any) -> Any:
    if not (isinstance(value, str) and value.endswith(".prom")):
        raise ValueError(f"expected a path ending in .prom (node_exporter's textfile collector reads only "
                         f"those), got {describe(value)}")
    if control_char(value):
        raise ValueError(f"cannot hold a control character (found {control_char(value)})")
    for name in re.findall(r"\{([^{}]*)\}", value):
        if name != "job_id":
            raise ValueError(f"unknown placeholder {{{shorten(name, 40)}}}; "
                             "the textfile's only placeholder is {job_id}")
    return value


class Metrics(Strict):
    """Prometheus gauges for node_exporter's textfile collector (agent/supervisor/metrics.py)."""
    textfile: Annotated[str, BeforeValidator(_prom_path)] = "metrics.prom"  # relative: the job dir
    every: Duration = Field(10.0, ge=1)  # at most one rewrite this often while samples come
