"""The spec's throughput section: how samples are read and judged (the policy is
gpujob/agent/judge/policy.py; docs/rollback.md explains each key)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from gpujob.spec.types import Duration, PathText, Rate, _duration
from gpujob.yamlsrc import At, Strict, describe


def _count_or_duration(value: Any) -> Any:
    """An int stays a count; a string with a unit ("60s", "3m") is a duration, kept
    as "<seconds>s" in job.json (the agent's policy.span reads it)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a count (an integer) or a duration like 60s, got {describe(value)}")
    if isinstance(value, int):
        if not 1 <= value <= 10_000:
            raise ValueError(f"expected a count from 1 to 10000, got {value}")
        return value
    if isinstance(value, str) and value.strip() and not value.strip().isdigit():
        try:
            secs = _duration(value)
        except ValueError:
            raise ValueError(f"expected a count (an integer) or a duration with a unit like 60s, "
                             f"got {describe(value)}") from None
        if secs <= 0:
            raise ValueError(f"expected a duration > 0, got {describe(value)}")
        return f"{secs:g}s"
    raise ValueError(f"expected a count (an integer) or a duration with a unit like 60s, got "
                     f"{describe(value)}")


CountOrDuration = Annotated[int | str, BeforeValidator(_count_or_duration)]


class Settle(Strict):
    """Judging starts once ``samples`` samples in a row lie within ``tolerance`` of
    their median (a running average's climb after a start is not judged), or
    ``timeout`` after the delays ended, whichever comes first."""
    samples: int = Field(5, ge=1, le=10_000)
    tolerance: float = Field(0.1, gt=0, lt=1)
    timeout: Duration = 300.0


class Throughput(Strict):
    source: Literal["stdout", "file"] = "stdout"  # the trainer's output lines, or a JSONL metrics file
    # for source stdout
    format: Literal["ktok", "torchtitan", "tqdm", "tqdm_steps", "hf", "regex"] | None = None
    path: PathText | None = None  # source file: the JSONL file the trainer appends to (relative: the workdir)
    field: str | None = None  # source file: the tok/s field of each record ("a.b" reaches into objects)
    step_field: str | None = None  # source file: the step field, if the records carry one
    pattern: str | None = None
    tokens_per_step: float | None = Field(None, gt=0, le=1e12)
    scope: Literal["total", "per_gpu"] = "total"
    scope_group: str | None = None
    initial_delay: Duration = 0.0  # counted from the run's first sample
    resume_initial_delay: Duration | None = None  # instead, for a known-good profile resumed
    initial_delay_samples: int = Field(0, ge=0, le=1_000_000)
    window: CountOrDuration = "10s"  # samples (an int) or a duration ("30s": the last 30 s); docs/rollback.md
    min_samples: int = Field(3, ge=1, le=10_000)  # a time window with fewer is inconclusive
    settle: Settle | None = Field(default_factory=lambda: Settle())  # null: judge right after the delays
    pause_pattern: str | None = None  # a line matching it (an eval, a data reload) pauses judging
    pause_tail: Duration = 5.0  # after a pause (or a checkpoint save) the rate recovers this long
    ranks: Literal["first", "sum", "min"] = "first"  # per-rank lines ([rank3]:): one sample of them
    min: Rate | None = None
    min_ratio: float | None = Field(None, gt=0, le=1)
    baseline: Rate | None = None  # tok/s given by the user: min_ratio's baseline instead of the ledger's
    failure_limit: CountOrDuration = "20s"  # breaching windows in a row (an int) or how long ("2m"), weighed
    no_data_timeout: Duration | None = 600.0  # null: no stall detection
    start_timeout: Duration | None = 900.0  # no sample this long after the start: start_hang (null: off)
    good_after: Duration = 600.0
    aggregate: Literal["sum", "min"] = "sum"  # multi-node: the nodes' latest tok/s summed, or the slowest

    @model_validator(mode="after")
    def _consistent(self) -> Throughput:
        if self.source == "file":
            for field in ("path", "field"):
                if not (getattr(self, field) or "").strip():
                    raise At((field,), "missing (required) for source file")
            for field in ("format", "pattern", "tokens_per_step"):
                if getattr(self, field) is not None:
                    raise At((field,), "only for source stdout (a metrics file's records are read by field)")
        else:
            if self.format is None:
                raise At(("format",), "missing (required) for source stdout")
            for field in ("path", "field", "step_field"):
                if getattr(self, field) is not None:
                    raise At((field,), "only for source file")
        for field, fmts in (("pattern", ("regex",)), ("tokens_per_step", ("tqdm", "tqdm_steps", "regex"))):
            given = getattr(self, field) is not None
            if self.format in fmts[:len(fmts) - 1 or 1] and not given:
                raise At((field,), f"missing (required) for format {self.format}")
            if self.format not in fmts and given:
                raise At((field,), f"only for format {' or '.join(fmts)}")
        for field in ("no_data_timeout", "good_after", "start_timeout"):
            value = getattr(self, field)
            if value is not None and value <= 0:
                raise At((field,), "expected a duration > 0" +
                         (" (or null to turn stall detection off)" if field == "no_data_timeout" else ""))
        window_s = _duration(self.window) if isinstance(self.window, str) else None
        if window_s is not None and self.good_after < window_s:
            raise At(("good_after",), f"expected at least the window ({self.window}): a profile is proven "
                     f"known-good over a span that holds one full window, so {self.good_after:g}s never "
                     "proves one")
        if self.pattern is not None:
            try:
                groups = re.compile(self.pattern).groupindex
            except re.error as exc:
                raise At(("pattern",), f"not a valid regex: {exc}") from None
            named = [g for g in ("value", "ms", "seconds") if g in groups]
            if len(named) != 1:
                raise At(("pattern",), "needs one named group (?P<value>...) (a rate), (?P<ms>...) or "
                         "(?P<seconds>...) (time per step)")
            if named[0] != "value" and self.tokens_per_step is None:
                raise At(("tokens_per_step",), f"missing (required) for a pattern with (?P<{named[0]}>...): "
                         "tok/s is tokens_per_step / time per step")
        if self.pause_pattern is not None:
            try:
                re.compile(self.pause_pattern)
            except re.error as exc:
                raise At(("pause_pattern",), f"not a valid regex: {exc}") from None
        if self.ranks == "sum" and self.scope == "per_gpu":
            raise At(("ranks",), "sum with scope per_gpu would count every GPU twice: use ranks first "
                     "(one rank's per-GPU rate, scaled by the GPU count) or scope total")
        if self.scope_group is not None and self.scope != "per_gpu":
            raise At(("scope_group",), "only for scope per_gpu")
        if self.min is None and self.min_ratio is None:
            raise At((), "needs min, min_ratio or both")
        return self


