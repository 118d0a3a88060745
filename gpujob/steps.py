"""One step of a submit's plan (what ``submit --plan`` prints); target kinds add their own."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Step:
    kind: str          # connect, probe, ship_agent, ship_uv, manifest, submit, env, warmup, train
    where: str         # laptop, host, container (by the controller), supervisor (in the container)
    what: str
    argv: list[str] = field(default_factory=list)
    when: str = ""     # a condition, when the step is not always taken
